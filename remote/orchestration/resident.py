"""The chunked route's built-in stages, kept in its own process for the whole run.

`Extractor` loads the target once and extracts chunk after chunk with it (the
extract stage's own code, `remote.stages.extract.run`, given the loaded model):
for Kimi-K2.5 a load reads ~600 GB of weights onto 8 GPUs, which the route
used to pay for every chunk of every epoch. `Trainer` keeps the draft, its
optimizer and schedule, the target's embeddings and lm_head, and the held-out
measurement (`remote.eagle3.heldout`) between chunks, and checkpoints through
`remote.eagle3.resume` as the train stage does, so a kill at any moment goes on
from the last checkpoint.

Both report into a `Relay`: the chunked job counts records and steps itself,
so a sub-step's counters only say the job is alive.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable

from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.eagle3 import kept, reporting
from remote.eagle3.train_settings import TrainSettings
from remote.stages import StageContext


class Relay:
    """A stage's progress calls, turned into heartbeats of the job that runs the stage in-process."""

    def __init__(self, progress: Progress, skips: bool = False) -> None:
        self.progress, self.skips = progress, skips

    def written(self, n: int = 1) -> None:
        self.progress.beat()

    def skipped(self, reason: str, n: int = 1) -> None:
        if self.skips:  # a record skipped counts once in the run, not once per pass
            self.progress.skipped(reason, n)
        self.progress.beat()

    def metrics(self, **values: float) -> None:
        self.progress.beat()

    def note(self, message: str) -> None:
        print(message, flush=True)

    def expect(self, total: int, by: str | None = None) -> None:
        pass

    def resumed(self) -> None:
        pass

    def beat(self) -> None:
        self.progress.beat()


def while_beating(work: Callable[[], Any], beat: Callable[[], None], every: float = 1.0) -> Any:
    """`work()`'s result, run in a thread while this one says the job is alive: loading Kimi-K2.5
    takes many minutes, longer than a job may go without progress before it shows `stalled`."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller, as if it had run here
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(every)
        beat()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def sub_context(ctx: StageContext, stage: str, settings: dict[str, Any], output: Path, inputs: list[Path]) -> StageContext:
    """The context a stage would get from the supervisor, for a step of the chunked job."""
    config = {"dataset": {}, "stage": settings, "inventory": ctx.shared_config, "inputs": [str(p) for p in inputs]}
    return dataclasses.replace(ctx, stage=stage, output=output, data=output.parent, config=config)


class Extractor:
    """The target, loaded on the first chunk and kept for every later one."""

    def __init__(self, ctx: StageContext, settings: dict[str, Any]) -> None:
        self.ctx, self.settings = ctx, settings
        self.model: Any = None
        self.loads = 0

    def run(self, prep: Path, output: Path, relay: Relay) -> None:
        output.mkdir(parents=True, exist_ok=True)
        self.run_stage(sub_context(self.ctx, "extract", self.settings, output, [prep]), relay)

    def run_stage(self, stage: StageContext, progress: Any) -> dict[str, Any]:
        """The extract stage over `stage`'s input with the kept target (loaded here on the first call);
        its manifest. Also the pipeline's extract session's, for dataset after dataset."""
        from remote.eagle3.target import best_device
        from remote.stages import extract

        if self.model is None:
            checked = extract.plan(stage)
            self.model = while_beating(lambda: extract.load(checked, best_device(), progress), progress.beat)
            self.loads += 1
        return extract.run(stage, progress, model=self.model)

    def close(self, abort: bool = False) -> None:
        """Let the target go (the SGLang capture's workers end; `abort`: now, even mid-request)."""
        from remote.stages import extract

        if self.model is not None:
            extract.close(self.model, abort)
        self.model = None


class Trainer:
    """One draft trained over every chunk: built on the first, kept (with its optimizer) for the rest."""

    def __init__(self, ctx: StageContext, settings: dict[str, Any], output: Path, heldout: list[Path],
                 schedule_steps: int, evaluations: Path, progress: Progress, trained: dict[str, Any]) -> None:
        self.ctx, self.settings, self.output, self.heldout = ctx, settings, output, heldout
        self.typed = TrainSettings.from_config(settings)  # `settings` stays the sub-stages' JSON config
        reporting.require(self.typed.report_to)  # before the first chunk's extraction, not after it
        self.trained = trained  # {"preps": {dataset: prep dir}, "heldout": {dataset: indices}}: what the vocabulary counts
        self.schedule_steps, self.evaluations, self.progress = schedule_steps, evaluations, progress
        self.relay = Relay(progress)
        self.draft: Any = None
        self.observer: Any = None  # `remote.eagle3.reporting.Observer`, opened on the first pass
        self.state: Any = None  # where the last pass of this process left the optimizer and schedule
        self.history: list[dict[str, Any]] = read_json(output / "history.json", [])
        self.extracted: dict[str, Any] = {}

    @property
    def step(self) -> int:
        return self.state.step if self.state is not None else 0

    def build(self, inputs: list[Path]) -> None:
        """The draft as `remote.stages.train` builds it; its vocabulary from every record the run trains on."""
        import torch

        from remote.eagle3 import heldout, plot
        from remote.eagle3.shards import load_sample
        from remote.eagle3.target import best_device, read_config, read_shape, target_settings
        from remote.stages import train

        self.extracted = train.read_extract_manifests(inputs)
        shape = read_shape(target_settings(self.ctx.shared_config)[0])
        stage = sub_context(self.ctx, "train", self.settings, self.output, inputs)
        config = train.draft_for(stage, self.typed, self.extracted, shape.vocab_size, read_config(shape.path))
        self.device = torch.device(best_device())
        self.draft, head = train.start_draft(self.typed, config, shape, lambda: trained_token_counts(
            self.trained["preps"], self.trained["heldout"], shape.vocab_size, self.progress.beat), self.progress)
        self.head = head.to(self.device)
        self.output.mkdir(parents=True, exist_ok=True)
        self.evaluation = heldout.EpochEvaluation(
            self.heldout, load_sample, self.typed.eval_steps, self.typed.max_length,
            self.output / plot.PLOT_NAME, self.progress, self.evaluations)
        self.evaluation.restore()

    def run(self, inputs: list[Path], epochs: int, name: str, seed: int) -> None:
        """`epochs` epochs over the states in `inputs`, shuffled by `seed`; `name` is the pass, for resuming."""
        from remote.eagle3.shards import ShardStore, load_sample
        from remote.eagle3.trainer import train

        files = [f for d in inputs for f in ShardStore(d).sample_files()]
        if not files:
            return  # every record of the chunk was skipped by extract (its reasons are counted)
        if self.draft is None:
            self.build(inputs)
        settings = dataclasses.replace(self.typed, epochs=epochs)
        state = self.resume_state(inputs, files, settings, name)
        self.draft.to(self.device)
        if state.step == 0:  # the run's first pass, nothing trained yet: epoch 0, the draft as it starts
            if self.evaluation.before_training(self.draft, self.head) is not None:
                self.save(kept.DRAFT, {"epoch": 0})  # kept unless an epoch measures at least as well
        history = [h for h in self.history if h["step"] <= state.step]
        self.history = history
        if self.observer is None:
            self.observer = self.reporter(state.step)

        def on_step(step: int, loss: float, accuracies: list[float], records: int) -> None:
            values = {f"acc_{k}": round(a, 4) for k, a in enumerate(accuracies)}
            self.progress.metrics(step=step, loss=round(loss, 5), **values)
            history.append({"step": step, "loss": loss, **values})
            self.evaluation.on_step(loss)
            self.observer.report(step, loss, accuracies)

        def on_checkpoint(reached: Any) -> None:
            from remote.eagle3 import resume

            write_json_atomic(self.output / "history.json", history)  # first: a resumed run never lacks its steps
            resume.save(self.output / "resume", self.draft, reached)
            self.observer.reporter.flush()  # every step before the point a killed run resumes from is on disk

        self.state = train(
            self.draft, self.head, files, load_sample, epochs=epochs, batch_size=settings.batch_size,
            learning_rate=settings.learning_rate, steps=settings.ttt_steps,
            max_length=settings.max_length, on_step=on_step, on_epoch=lambda epoch: None, seed=seed,
            state=state, on_checkpoint=on_checkpoint, checkpoint_every=settings.checkpoint_every,
            schedule_steps=self.schedule_steps, warmup_steps=settings.warmup_steps(self.schedule_steps))
        self.save(kept.LAST, {"pass": name})
        if not self.heldout or not (self.output / kept.DRAFT).is_dir():  # nothing to choose by (yet): the latest
            self.save(kept.DRAFT, {"pass": name})

    def save(self, name: str, extra: dict[str, Any]) -> None:
        """The draft as it is now, at ``<output>/<name>`` (`remote.eagle3.kept`: ``draft`` the kept, ``last`` the latest)."""
        from remote.eagle3 import checkpoint

        checkpoint.save(self.draft, self.output / name, {**extra, "release": self.ctx.release})

    def reporter(self, step: int) -> Any:
        """Where ``stages.train.report_to`` sends the curves (as the train stage does), from `step` on."""
        reporter = reporting.open_reporter(self.typed.report_to, self.output, step, f"{self.ctx.dataset}-{self.ctx.release}",
                                           dataclasses.asdict(self.typed))
        return reporting.Observer(reporter, self.evaluation, step)

    def resume_state(self, inputs: list[Path], files: list[Path], settings: TrainSettings, name: str) -> Any:
        """The checkpoint on disk for the first pass of this process; after that, the optimizer as the last pass left it.
        `name` is the pass (``chunk_pass``, part of the checkpoint's fingerprint)."""
        from remote.eagle3 import resume
        from remote.stages import train

        if self.state is None:
            driver = {**self.settings, "epochs": settings.epochs, "schedule_steps": self.schedule_steps, "chunk_pass": name}
            stage = sub_context(self.ctx, "train", driver, self.output, inputs)
            return train._resume_state(stage, self.draft, files, settings, self.relay)
        fields: dict[str, Any] = {k: getattr(settings, k) for k in ("batch_size", "epochs", "max_length", "ttt_steps")}
        fields["chunk_pass"] = name
        return resume.TrainState(step=self.state.step, optimizer=self.state.optimizer, schedule=self.state.schedule,
                                 data=resume.fingerprint(files, fields))

    def measure(self, epoch: int) -> dict[str, Any]:
        """The held-out figures after `epoch` epochs' worth of steps, kept (for a resumed run) and drawn."""
        record = self.evaluation.on_epoch(epoch, self.draft, self.head)
        if kept.is_best(record, self.evaluation.epochs):  # as the train stage keeps it: the best, the later of equals
            self.save(kept.DRAFT, {"epoch": epoch})
        if self.observer is not None:
            self.observer.report_epochs()
        self.evaluation.draw()
        return record.as_dict()

    def manifest(self, epochs: int, records: int, seconds: float) -> dict[str, Any]:
        """The train manifest, as the train stage writes it (with `route: chunked`)."""
        if self.draft is None:  # a rerun of a run that had ended: its manifest stands
            return read_json(self.output / "manifest.json", {})
        if self.observer is not None:
            self.observer.close()
        self.progress.note(kept.reason(self.evaluation.epochs))
        write_json_atomic(self.output / "history.json", self.history)
        manifest = {
            "release": self.ctx.release, "engine": "aerie", "route": "chunked", "draft": str(self.output / "draft"),
            "records": records, "epochs": epochs, "steps": len(self.history),
            "first_loss": self.history[0]["loss"] if self.history else None,
            "last_loss": self.history[-1]["loss"] if self.history else None,
            "draft_vocab_size": self.draft.config["draft_vocab_size"],
            "layers": self.extracted.get("layers"), "seconds": round(seconds, 3), "init_draft": self.typed.init_draft,
            **self.evaluation.manifest(),
        }
        write_json_atomic(self.output / "manifest.json", manifest)
        return manifest



def trained_token_counts(preps: dict[str, Path], heldout: dict[str, list[int]], vocab_size: int,
                         beat: Callable[[], None] = lambda: None) -> Any:
    """How often each token is trained on (`remote.eagle3.vocab.token_counts`) over every record the run
    trains on, read from prep's ids and masks, not from states: the draft's vocabulary is the one the
    offline route would pick, not the first chunk's (which may lack the tokens of a whole dataset)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    from remote.eagle3.prep_input import shard_files

    counts, everything = np.zeros(vocab_size, np.int64), np.zeros(vocab_size, np.int64)
    for name, prep in preps.items():
        skip, seen = set(heldout.get(name, [])), 0
        for file in shard_files(prep):
            beat()
            table = pq.read_table(file, columns=["input_ids", "loss_mask"])
            table, seen = table.take(pa.array([i for i in range(table.num_rows) if seen + i not in skip], pa.int64())), seen + table.num_rows
            ids = pc.list_flatten(table["input_ids"]).to_numpy(zero_copy_only=False).astype(np.int64)
            mask = pc.list_flatten(table["loss_mask"]).to_numpy(zero_copy_only=False).astype(bool)
            ids, mask = ids[ids < vocab_size], mask[ids < vocab_size]
            counts += np.bincount(ids[mask], minlength=vocab_size)
            everything += np.bincount(ids, minlength=vocab_size)
    return torch.from_numpy(counts if counts.sum() else everything)
