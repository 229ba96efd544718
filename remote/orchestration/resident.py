"""The chunked route's built-in stages, kept for the whole run.

`Extractor` loads the target once and extracts chunk after chunk with it (the
extract stage's own code, `remote.stages.extract.run`, given the loaded model):
for Kimi-K2.5 a load reads ~600 GB of weights onto 8 GPUs, which the route
used to pay for every chunk of every epoch. `Trainer` keeps the draft, its
optimizer and schedule, the target's embeddings and lm_head, and the held-out
measurement between chunks: a `remote.eagle3.session.TrainingSession`, the one the
train stage drives, so it checkpoints, reports and keeps drafts as the train stage
does and a kill at any moment goes on from the last checkpoint. With one rank
(`ranks`) it trains in the job's process; with more, each of a resident group of
ranks (`remote.orchestration.rank_group`) drives its own, as the train stage's ranks do.

Both report into a `Relay`: the chunked job counts records and steps itself,
so a sub-step's counters only say the job is alive.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any, Callable

from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.eagle3 import distributed, kept, reporting
from remote.eagle3.distributed import World
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


def ranks(settings: TrainSettings, progress: Any) -> int:
    """The resident trainer's ranks: ``stages.train.nproc``, unset every GPU the host shows (said in one line when
    several), 1 without GPUs; one trains in the job's own process, more in a group of their own beside it."""
    nproc = distributed.resolve_nproc(settings.nproc)
    if settings.nproc is None and nproc > 1:
        progress.note(f"training on {nproc} GPUs, one rank each, beside the loaded target "
                      "(stages.train.nproc: 1 trains in the chunked job's own process)")
    return nproc


def check_world(output: Path, nproc: int) -> None:
    """Refuse (`remote.eagle3.resume`'s one line) to go on from a checkpoint in `output` that another number of
    ranks trained, before anything runs: the run's one schedule counts global batches of theirs."""
    from remote.eagle3 import resume
    from remote.eagle3.session import RESUME

    world = resume.saved_world(output / RESUME)
    if world is not None:
        resume.check_world(resume.TrainState(world=world), nproc)


def trainer(nproc: int, ctx: StageContext, settings: dict[str, Any], output: Path, heldout: list[Path],
            schedule_steps: int, evaluations: Path, progress: Progress, trained: dict[str, Any]) -> Any:
    """The chunked job's trainer: a `Trainer` in this process for one rank, else a `GroupTrainer` of `nproc`."""
    if nproc == 1:
        return Trainer(ctx, settings, output, heldout, schedule_steps, evaluations, progress, trained)
    from remote.orchestration.rank_group import GroupTrainer

    reporting.require(TrainSettings.from_config(settings).report_to)  # before the first chunk's extraction
    shared = {"preps": {name: str(p) for name, p in trained["preps"].items()}, "heldout": trained["heldout"]}
    return GroupTrainer(nproc, progress, output, heldout, settings=settings, schedule_steps=schedule_steps,
                        evaluations=str(evaluations), trained=shared)


class Trainer:
    """One draft trained over every chunk (`remote.eagle3.session`): built on the first, kept (with its optimizer)
    for the rest; the held-out records measured whenever the chunks trained add up to an epoch (`measure`). In a
    `world` of several ranks, each trains its share and rank 0 alone counts, measures and writes."""

    def __init__(self, ctx: StageContext, settings: dict[str, Any], output: Path, heldout: list[Path],
                 schedule_steps: int, evaluations: Path, progress: Progress, trained: dict[str, Any],
                 world: World = World()) -> None:
        from remote.eagle3.session import TrainingSession

        self.ctx, self.settings, self.output, self.heldout = ctx, settings, output, heldout
        self.typed = TrainSettings.from_config(settings)  # `settings` stays the sub-stages' JSON config
        reporting.require(self.typed.report_to)  # before the first chunk's extraction, not after it
        self.trained = trained  # {"preps": {dataset: prep dir}, "heldout": {dataset: indices}}: what the vocabulary counts
        self.schedule_steps, self.evaluations, self.progress = schedule_steps, evaluations, progress
        self.relay = Relay(progress) if world.is_main else Progress()  # (a Relay prints its notes)
        self.session = TrainingSession(output, ctx.release, self.typed, progress, world=world,
                                       name=f"{ctx.dataset}-{ctx.release}", counts_records=False)  # the job counts records
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
        session = self.session
        # NOTE: rank 0 alone counts the tokens (DDP copies its vocabulary map to the others); a rank's device is its own.
        counts = (lambda: trained_token_counts(self.trained["preps"], self.trained["heldout"], shape.vocab_size,
                                               self.progress.beat)) if session.is_main else distributed.no_counts(shape.vocab_size)
        session.start(config, shape, counts, None if session.world.is_distributed else best_device())
        self.output.mkdir(parents=True, exist_ok=True)
        if session.is_main:
            session.measure_on(self.heldout, kept_at=self.evaluations)

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
        if session.observer is None and session.is_main:
            session.open_reporter()
        session.train(files, epochs, seed=seed, schedule_steps=self.schedule_steps, measure_epochs=False)
        if not session.is_main:
            return
        session.save(kept.LAST, **{"pass": name})
        if not self.heldout:  # nothing to choose by: the latest
            session.save(kept.DRAFT, **{"pass": name})

    def measured(self) -> int | None:
        """The last epoch measured (0: the draft as it started, or nothing yet); None before the draft is built."""
        if self.draft is None or self.evaluation is None:
            return None
        return self.evaluation.epochs[-1].epoch if self.evaluation.epochs else 0

    def close(self) -> None:
        """Nothing to let go: the group's trainer (`remote.orchestration.rank_group.GroupTrainer`) stops its ranks."""

    def measure(self, epoch: int) -> dict[str, Any]:
        """The held-out figures after `epoch` epochs' worth of steps, kept (for a resumed run) and drawn; the
        draft to ``draft/`` when it is the best so far (as the train stage keeps it: the later of equals)."""
        if not self.session.is_main:
            return {}
        record = self.session.measure(epoch, self.typed.epochs, save_last=False)
        self.evaluation.draw()
        return record.as_dict()

    def manifest(self, epochs: int, records: int, seconds: float) -> dict[str, Any]:
        """The train manifest, as the train stage writes it (with `route: chunked`)."""
        if self.draft is None:  # a rerun of a run that had ended: its manifest stands
            return read_json(self.output / "manifest.json", {})
        session = self.session
        session.stop()
        if not session.is_main:
            return {}
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
