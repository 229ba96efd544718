"""The chunked route's built-in stages, kept in its own process for the whole run.

`Extractor` loads the target once and extracts chunk after chunk with it (the
extract stage's own code, `remote.stages.extract.run`, given the loaded model):
for Kimi-K2.5 a load reads ~600 GB of weights onto 8 GPUs, which the route
used to pay for every chunk of every epoch. `Trainer` keeps the draft, its
optimizer and schedule, the target's embeddings and lm_head, and the held-out
measurement between chunks: a `remote.eagle3.session.TrainingSession`, the one the
train stage drives, so it checkpoints, reports and keeps drafts as the train stage
does and a kill at any moment goes on from the last checkpoint. It trains on one
GPU (`one_rank`): its process holds the target.

Both report into a `Relay`: the chunked job counts records and steps itself,
so a sub-step's counters only say the job is alive.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable

from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.eagle3 import StageInputError, kept, reporting
from remote.eagle3.train_settings import TrainSettings
from remote.stages import StageContext
from remote.vocabulary import plan_texts


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


def one_rank(settings: TrainSettings, progress: Any) -> None:
    """The resident trainer trains on one GPU: its process holds the loaded target, which the ranks of
    DDP would have to share (`remote.eagle3.distributed` launches them as processes of their own). An
    ``nproc`` above 1 is refused in one line naming the fix; unset, on a host of several GPUs, said in one line."""
    from remote.eagle3 import distributed

    refused = plan_texts.chunked_nproc(settings.nproc)
    if refused:
        raise StageInputError(refused)
    if settings.nproc is None and distributed.visible_gpus() > 1:
        progress.note("training on one GPU: the chunked route trains beside the loaded target "
                      "(stages.train.nproc applies to the offline route)")


class Trainer:
    """One draft trained over every chunk (`remote.eagle3.session`): built on the first, kept (with its optimizer)
    for the rest; the held-out records measured whenever the chunks trained add up to an epoch (`measure`)."""

    def __init__(self, ctx: StageContext, settings: dict[str, Any], output: Path, heldout: list[Path],
                 schedule_steps: int, evaluations: Path, progress: Progress, trained: dict[str, Any]) -> None:
        from remote.eagle3.session import TrainingSession

        self.ctx, self.settings, self.output, self.heldout = ctx, settings, output, heldout
        self.typed = TrainSettings.from_config(settings)  # `settings` stays the sub-stages' JSON config
        reporting.require(self.typed.report_to)  # before the first chunk's extraction, not after it
        self.trained = trained  # {"preps": {dataset: prep dir}, "heldout": {dataset: indices}}: what the vocabulary counts
        self.schedule_steps, self.evaluations, self.progress = schedule_steps, evaluations, progress
        self.relay = Relay(progress)
        self.session = TrainingSession(output, ctx.release, self.typed, progress, name=f"{ctx.dataset}-{ctx.release}",
                                       counts_records=False)  # the chunked job counts the records
        self.extracted: Any = None  # `remote.eagle3.extract_manifest.ExtractManifest` of the first chunk

    @property
    def draft(self) -> Any:
        return self.session.draft

    @property
    def evaluation(self) -> Any:
        return self.session.evaluation

    @property
    def step(self) -> int:
        return self.session.state.step if self.session.state is not None else 0

    def build(self, inputs: list[Path]) -> None:
        """The draft as `remote.stages.train` builds it; its vocabulary from every record the run trains on."""
        from remote.eagle3.extract_manifest import ExtractManifest
        from remote.eagle3.target import best_device, draft_base, read_target, shape_of, target_settings
        from remote.stages import train

        self.extracted = ExtractManifest.read_all(inputs)
        target = read_target(target_settings(self.ctx.shared_config)[0])
        shape = shape_of(target)
        stage = sub_context(self.ctx, "train", self.settings, self.output, inputs)
        config = train.draft_for(stage, self.typed, self.extracted, shape.vocab_size, draft_base(target))
        self.session.start(config, shape, lambda: trained_token_counts(
            self.trained["preps"], self.trained["heldout"], shape.vocab_size, self.progress.beat), best_device())
        self.output.mkdir(parents=True, exist_ok=True)
        self.session.measure_on(self.heldout, kept_at=self.evaluations)

    def run(self, inputs: list[Path], epochs: int, name: str, seed: int) -> None:
        """`epochs` epochs over the states in `inputs`, shuffled by `seed`; `name` is the pass, for resuming."""
        from remote.eagle3.shards import ShardStore

        files = [f for d in inputs for f in ShardStore(d).sample_files()]
        if not files:
            return  # every record of the chunk was skipped by extract (its reasons are counted)
        first = self.draft is None
        if first:
            self.build(inputs)
        session = self.session
        state = session.resume(files, epochs, chunk_pass=name, chunked=True, progress=self.relay)
        if first and state.step == 0:  # the run's first pass, nothing trained yet: epoch 0, the draft as it starts
            session.measure_start()  # held aside in .start/ until an epoch is measured, as the train stage does
        if session.observer is None:
            session.open_reporter()
        session.train(files, epochs, seed=seed, schedule_steps=self.schedule_steps, measure_epochs=False)
        session.save(kept.LAST, **{"pass": name})
        if not self.heldout:  # nothing to choose by: the latest
            session.save(kept.DRAFT, **{"pass": name})

    def measure(self, epoch: int) -> dict[str, Any]:
        """The held-out figures after `epoch` epochs' worth of steps, kept (for a resumed run) and drawn; the
        draft to ``draft/`` when it is the best so far (as the train stage keeps it: the later of equals)."""
        record = self.session.measure(epoch, self.typed.epochs, save_last=False)
        self.evaluation.draw()
        return record.as_dict()

    def manifest(self, epochs: int, records: int, seconds: float) -> dict[str, Any]:
        """The train manifest, as the train stage writes it (with `route: chunked`)."""
        if self.draft is None:  # a rerun of a run that had ended: its manifest stands
            return read_json(self.output / "manifest.json", {})
        session = self.session
        session.stop()
        session.settle_start()
        self.progress.note(kept.reason(self.evaluation.epochs))
        write_json_atomic(self.output / "history.json", session.history)
        manifest = {**session.manifest(records, epochs, self.extracted.layers, seconds), "route": "chunked"}
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
