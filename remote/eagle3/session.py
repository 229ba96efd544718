"""One draft's training, as the train stage (`remote.stages.train`) and the chunked route's resident trainer
(`remote.orchestration.resident`) both drive it: they differ in the records they hand it, not in how it trains.

A `TrainingSession` holds what lives while a draft trains: the draft and the target's lm_head on this
rank's device, the ranks (`remote.eagle3.distributed`), rank 0's held-out measurement
(`remote.eagle3.heldout`) and reporter (`remote.eagle3.reporting`), the resume state
(`remote.eagle3.resume`), the steps' history, and the kept drafts (`remote.eagle3.kept`): epoch 0's
held aside in ``.start/`` until an epoch has been measured, the best in ``draft/``, the last in ``last/``.
The train stage runs it once over every record; the resident trainer chunk after chunk, with one optimizer.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
from typing import Any, Callable

from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.eagle3 import distributed, heldout, init_draft, kept, plot, reporting
from remote.eagle3.distributed import World
from remote.eagle3.epochs import EpochRecord
from remote.eagle3.train_settings import TrainSettings

HISTORY = "history.json"
RESUME = "resume"


def start_draft(settings: TrainSettings, config: dict[str, Any], shape: Any, counts: Callable[[], Any], progress: Any):
    """The draft training starts from, and the target's lm_head (on the CPU): ``stages.train.init_draft``'s
    weights and vocabulary map when it is set, else a new draft started from the target's embeddings and lm_head.
    `counts` (how often each token is trained on) picks the vocabulary of a new draft, or cuts a full one."""
    from remote.eagle3.model import Eagle3Draft
    from remote.eagle3.target import read_embed_and_head
    from remote.eagle3.vocab import build_mapping

    def mapping():
        return build_mapping(counts(), config["draft_vocab_size"])

    embed, head = read_embed_and_head(shape)
    if not settings.init_draft:
        return Eagle3Draft.warm(config, *mapping(), embed, head), head
    draft = init_draft.start(settings.init_draft, config, embed, mapping)
    progress.note(f"continuing from the draft {settings.init_draft} (draft vocabulary {config['draft_vocab_size']})")
    return draft, head


def token_counter(files: list[Path], heldout_count: int, vocab_size: int, progress: Any) -> Callable[[], Any]:
    """How often each token is trained on in `files`, counted when asked (a draft with its own map never asks)."""
    from remote.eagle3.vocab import token_counts

    def counts():
        progress.note(f"counting tokens of {len(files)} records ({heldout_count} held out)")
        return token_counts(_each(files, progress), vocab_size)

    return counts


def _each(files: list[Path], progress: Any):
    from remote.eagle3.shards import load_sample

    for path in files:
        progress.beat()
        # NOTE: memory-mapped: counting reads the token ids, not the hidden states.
        yield load_sample(path, mmap=True)


class TrainingSession:
    """One draft trained into `output`; rank 0 alone measures, reports and writes (the others train)."""

    def __init__(self, output: Path, release: str, settings: TrainSettings, progress: Any, *, world: World = World(),
                 name: str = "", provenance: dict[str, Any] | None = None, counts_records: bool = True) -> None:
        self.output, self.release, self.settings, self.world = output, release, settings, world
        self.progress = progress if world.is_main else Progress()  # counts nowhere: rank 0 says how the job goes
        self.name = name  # the run's name where the curves go (W&B)
        self.provenance = provenance or {}  # saved beside every draft (e.g. the extract release it trained on)
        self.counts_records = counts_records  # False: the caller counts the records (the chunked job)
        self.draft: Any = None
        self.head: Any = None
        self.device: Any = None
        self.evaluation: heldout.EpochEvaluation | None = None
        self.observer: reporting.Observer | None = None
        self.state: Any = None  # `remote.eagle3.resume.TrainState`: where training stands
        self.history: list[dict[str, Any]] = []  # every step's loss and accuracies, the earlier runs' too
        self.resumed_from = 0  # the step this process went on from
        self.trained_from = 0  # len(history) then: the steps after it are this process's

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    def start(self, config: dict[str, Any], shape: Any, counts: Callable[[], Any], device: Any = None) -> None:
        """The draft and the head, this rank joined to the others first (its device theirs; `device`: a given one)."""
        import torch

        self.device = torch.device(device) if device is not None else distributed.start(self.world)
        self.draft, head = start_draft(self.settings, config, shape, counts, self.progress)
        self.head = head.to(self.device)

    def resume(self, files: list[Path], epochs: int, chunk_pass: str = "", chunked: bool = False,
               progress: Any = None) -> Any:
        """Where this pass over `files` starts: for a later pass of this process, the optimizer as the last one left
        it; else the state saved on disk (its weights loaded into the draft) or a fresh one, refused (one line) when
        other ranks trained it. `chunk_pass` names the chunked route's pass; `chunked`: one schedule over all chunks."""
        from remote.eagle3 import resume

        fields: dict[str, Any] = {k: getattr(self.settings, k) for k in ("batch_size", "max_length", "ttt_steps")}
        fields["epochs"] = epochs
        if chunk_pass:  # only where the chunked route sends it: other checkpoints keep their fingerprint
            fields["chunk_pass"] = chunk_pass
        if self.state is not None:
            self.state = resume.TrainState(step=self.state.step, optimizer=self.state.optimizer,
                                           schedule=self.state.schedule, data=resume.fingerprint(files, fields),
                                           world=self.world.size)
        else:
            self.state = self._saved(files, epochs, fields, chunked, progress or self.progress)
            self.resumed_from = self.state.step
            steps = read_json(self.output / HISTORY, []) if self.state.step else []
            self.history = [h for h in steps if h["step"] <= self.state.step]
            self.trained_from = len(self.history)
        self.draft.to(self.device)
        return self.state

    def _saved(self, files: list[Path], epochs: int, fields: dict[str, Any], chunked: bool, progress: Any) -> Any:
        from remote.eagle3 import resume

        saved = resume.load(self.output / RESUME, self.draft)
        data = resume.fingerprint(files, fields)
        if saved is None:
            return resume.TrainState(data=data, world=self.world.size)
        resume.check_learning_rate(saved, self.settings.learning_rate)
        if saved.data in (data, resume.names_fingerprint(files, fields)):  # an older state's, taken at its word
            resume.check_world(saved, self.world.size)
        else:
            progress.note(f"continuing the draft from step {saved.step} on new data")
            # NOTE: one schedule over all chunks when the chunked route sized it (schedule_steps).
            return resume.TrainState(step=saved.step, optimizer=saved.optimizer, schedule=saved.schedule if chunked else {},
                                     data=data, world=self.world.size)
        if saved.epoch >= epochs:  # run again after it finished (a second `inv demo`): nothing to train
            progress.note(f"trained before: {epochs} epochs, {saved.step} steps; the saved draft stands")
        else:
            progress.note(f"resuming at epoch {saved.epoch + 1}, batch {saved.position}, step {saved.step}")
        done = len(files) if saved.epoch > 0 else min(len(files), saved.position * self.settings.batch_size * saved.world)
        if done and self.counts_records:
            progress.written(done)
        return saved

    def measure_on(self, files: list[Path], kept_at: Path | None = None, through: int | None = None) -> None:
        """Rank 0's measurement on the held-out `files` (`kept_at`: where the epochs measured are kept), with the
        epochs earlier runs measured up to `through` (None: all): the manifest still reports them."""
        from remote.eagle3.shards import load_sample

        self.evaluation = heldout.EpochEvaluation(files, load_sample, self.settings.eval_steps, self.settings.max_length,
                                                  self.output / plot.PLOT_NAME, self.progress, kept_at)
        self.evaluation.restore(through=through)

    def measure_start(self) -> None:
        """Epoch 0, the draft as training starts from it, measured and held aside in ``.start/``: kept unless an
        epoch measures at least as well, and never ``draft/`` before an epoch was measured (`remote.eagle3.kept`)."""
        if self.evaluation is not None and self.evaluation.before_training(self.draft, self.head) is not None:
            self.save(kept.START, epoch=0)

    def open_reporter(self) -> None:
        """Where ``stages.train.report_to`` sends the curves, beside the draft, from the step training goes on from."""
        step = self.state.step
        reporter = reporting.open_reporter(self.settings.report_to, self.output, step, self.name,
                                           dataclasses.asdict(self.settings))
        self.observer = reporting.Observer(reporter, self.evaluation, step)

    def train(self, files: list[Path], epochs: int, *, seed: int = 0, schedule_steps: int = 0,
              measure_epochs: bool = True) -> Any:
        """`epochs` epochs over `files` from where `resume` left the state; `measure_epochs`: the draft measured and
        kept after each (the chunked route measures when its chunks add up to an epoch, `measure`)."""
        from remote.eagle3.shards import load_sample
        from remote.eagle3.trainer import train

        total = schedule_steps or epochs * math.ceil(len(files) / (self.settings.batch_size * self.world.size))
        callbacks: dict[str, Any] = {"on_step": lambda *a: None, "on_epoch": lambda e: None, "on_checkpoint": None}
        if self.is_main:
            callbacks = self._callbacks(epochs, measure_epochs)
        self.state = train(
            self.draft, self.head, files, load_sample, epochs=epochs, batch_size=self.settings.batch_size,
            learning_rate=self.settings.learning_rate, steps=self.settings.ttt_steps, max_length=self.settings.max_length,
            seed=seed, state=self.state, checkpoint_every=self.settings.checkpoint_every, schedule_steps=schedule_steps,
            warmup_steps=self.settings.warmup_steps(total), world=self.world, **callbacks)
        return self.state

    def _callbacks(self, epochs: int, measure_epochs: bool) -> dict[str, Any]:
        """The trainer's ``on_step``, ``on_epoch`` and ``on_checkpoint``, each also reporting (`reporting.Observer`)."""
        from remote.eagle3 import resume

        def on_step(step: int, loss: float, accuracies: list[float], records: int) -> None:
            values = {f"acc_{k}": round(a, 4) for k, a in enumerate(accuracies)}
            self.progress.metrics(step=step, loss=round(loss, 5), **values)
            self.history.append({"step": step, "loss": loss, **values})
            self.evaluation.on_step(loss)
            if records and self.counts_records:
                self.progress.written(records)

        def on_epoch(epoch: int) -> None:
            if measure_epochs:
                self.measure(epoch, epochs)

        def on_checkpoint(reached: Any) -> None:
            # NOTE: the history first, so a resumed run never lacks the steps its state counts.
            write_json_atomic(self.output / HISTORY, self.history)
            resume.save(self.output / RESUME, self.draft, reached)

        return self.observer.wrap({"on_step": on_step, "on_epoch": on_epoch, "on_checkpoint": on_checkpoint})

    def measure(self, epoch: int, epochs: int, save_last: bool = True) -> EpochRecord:
        """The draft after `epoch` epochs: measured on the held-out records, written to ``last/`` (`save_last`) and to
        ``draft/`` when it is the best so far (the later of equals); epoch 0's held-aside draft settled."""
        record = self.evaluation.on_epoch(epoch, self.draft, self.head)
        if save_last:
            self.save(kept.LAST, epoch=epoch)
        best = kept.is_best(record, self.evaluation.epochs)
        if best:
            self.save(kept.DRAFT, epoch=epoch)
        self.settle_start()
        if self.observer is not None:
            self.observer.report_epochs()
        accept = "" if record.accept_length is None else f", held-out accept length {record.figure()}"
        saved = " and ".join(f"{name}/" for name in [kept.DRAFT] * best + [kept.LAST] * save_last)
        said = f"epoch {epoch}/{epochs} saved to {saved}" if saved else f"epoch {epoch}/{epochs} measured"
        if not best:
            said += f" ({kept.DRAFT}/ keeps epoch {self.evaluation.kept_epoch().epoch})"
        self.progress.note(said + accept)
        return record

    def settle_start(self) -> None:
        """Epoch 0's draft put in ``draft/`` while it is the one kept, or dropped once an epoch beats it (for good:
        the best only rises)."""
        from remote.eagle3 import checkpoint

        start = self.output / kept.START
        if not start.is_dir() or self.evaluation is None or len(self.evaluation.epochs) < 2:
            return
        chosen = self.evaluation.kept_epoch()
        if chosen is not None and chosen.epoch == 0:
            checkpoint.promote(start, self.output / kept.DRAFT)
        else:
            shutil.rmtree(start, ignore_errors=True)

    def save(self, name: str, **extra: Any) -> None:
        """The draft as SGLang loads it, at ``<output>/<name>``, rewritten atomically."""
        from remote.eagle3 import checkpoint

        checkpoint.save(self.draft, self.output / name, {**extra, **self.provenance, "release": self.release})

    def stop(self) -> None:
        """Leave the other ranks (together) and close the reporter: training is over for this process."""
        distributed.stop(self.world)
        if self.observer is not None:
            self.observer.close()

    @property
    def trained_here(self) -> bool:
        """Whether this process took a step (else a run resumed after its last step: the saved drafts stand)."""
        return len(self.history) > self.trained_from

    def manifest(self, records: int, epochs: int, layers: list[int], seconds: float) -> dict[str, Any]:
        """What every train manifest says of the run: its steps, its losses and the kept draft's figures."""
        history = self.history
        return {
            "release": self.release, "engine": "aerie", "draft": str(self.output / kept.DRAFT), "records": records,
            "epochs": epochs, "steps": len(history), "resumed_from_step": self.resumed_from,
            "first_loss": history[0]["loss"] if history else None, "last_loss": history[-1]["loss"] if history else None,
            "draft_vocab_size": self.draft.config["draft_vocab_size"], "layers": list(layers),
            "seconds": round(seconds, 3), "init_draft": self.settings.init_draft, **self.evaluation.manifest(),
        }
