"""Training's held-out split and its per-epoch measurement (`remote.eagle3.acceptance`).

The split is decided by a hash of each record's file name, not by its
position, so the same records stay held out when datasets are added or a
training run is resumed, and no record is ever trained on in one run and
measured in the next.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

from remote.eagle3.epochs import EpochRecord
from remote.control_plane.progress import read_json, write_json_atomic

PLOT_EVERY = 60.0  # seconds: drawing costs seconds of CPU, so not after every short epoch
HELDOUT_LIST = "heldout.json"  # beside train's manifest: the held-out records' files
#: Beside it: every epoch measured so far, so that a resumed run (or one resumed after its last step) keeps them.
EVALUATIONS = "evaluations.json"
#: The most records held out by default: the accept length's 95 % interval narrows as one over the root of
#: the records; at this many it is a few hundredths wide, enough to tell epochs apart, and measuring
#: them after every epoch stays a small part of an epoch at the user's scale (docs/benchmarks.md, "Training
#: at the host's scale").
DEFAULT_CAP = 1024


def split(files: list[Path], records: int | None, fraction: float) -> tuple[list[Path], list[Path]]:
    """(to train on, held out): `records` of them when given (0: none), else about `fraction`, at most
    `DEFAULT_CAP`, at least one when there are two or more; training always keeps at least one."""
    ranked = sorted(files, key=_rank)
    if records is None:
        # NOTE: a threshold on the hash, not a count: whether a record is held out does not
        # depend on the others, so adding a dataset never moves a record into training (below the cap).
        records = min(DEFAULT_CAP, sum(1 for f in ranked if _rank(f) < fraction)) or (1 if len(files) > 1 else 0)
    held = set(ranked[: max(0, min(records, len(files) - 1))])
    return [f for f in files if f not in held], [f for f in files if f in held]


def _rank(path: Path) -> float:
    """A uniform number in [0, 1) from the dataset and shard folders and the file name (not the
    root, which may move)."""
    digest = hashlib.sha1("/".join(path.parts[-5:]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class EpochEvaluation:
    """The per-epoch hook of training: measure the draft on the held-out records, report, plot.

    `on_step` is fed every training step's loss; `on_epoch` measures and returns the epoch's record;
    `before_training` measures the draft training starts from (epoch 0, no loss).
    """

    def __init__(self, heldout: list[Path], load: Any, steps: int, max_length: int, plot_path: Path,
                 progress: Any, kept: Path | None = None) -> None:
        self.heldout, self.load, self.steps, self.max_length = heldout, load, steps, max_length
        self.plot_path, self.progress = plot_path, progress
        self.kept = kept or plot_path.with_name(EVALUATIONS)  # where the epochs measured so far are kept
        self.epochs: list[EpochRecord] = []
        self._losses: list[float] = []
        self._plotted_at = time.monotonic()
        # The records `inv eval` takes its prompts from: never trained on.
        write_json_atomic(plot_path.with_name(HELDOUT_LIST), [str(f) for f in heldout])

    def on_step(self, loss: float) -> None:
        self._losses.append(loss)

    def on_epoch(self, epoch: int, draft: Any, head: Any) -> EpochRecord:
        loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        self._losses = []
        record = self._measured(EpochRecord(epoch, loss), draft, head)
        self.epochs.append(record)
        write_json_atomic(self.kept, [dataclasses.asdict(e) for e in self.epochs])
        if time.monotonic() - self._plotted_at >= PLOT_EVERY:
            self.draw()  # a long run shows its curve while it trains
        return record

    def before_training(self, draft: Any, head: Any) -> EpochRecord | None:
        """Epoch 0: the draft as training starts from it (``stages.train.init_draft``'s, or a new one), so
        the epochs after it show what the data added; the only epoch kept, since nothing was trained yet."""
        if not self.heldout:
            return None
        record = self._measured(EpochRecord(0, None), draft, head)
        self.epochs = [record]
        write_json_atomic(self.kept, [dataclasses.asdict(e) for e in self.epochs])
        return record

    def _measured(self, record: EpochRecord, draft: Any, head: Any) -> EpochRecord:
        """`record` with the held-out figures of `draft` (none without held-out records), reported and printed."""
        from remote.eagle3.acceptance import accept_interval, evaluate

        if not self.heldout:
            return record
        when = "before training" if record.loss is None else f"epoch {record.epoch}"
        self.progress.note(f"{when}: measuring the draft on {len(self.heldout)} held-out records")
        tally = evaluate(draft, head, self.heldout, self.load, self.steps, self.max_length, self.progress.beat)
        record.accept_length, record.accuracies, record.positions = tally.accept_length, tally.accuracies, tally.positions
        spread = accept_interval(tally.per_record)
        record.interval = list(spread) if spread else None
        self.progress.metrics(**record.metrics())
        loss = "" if record.loss is None else f", loss {record.loss:.4f}"
        print(f"epoch {record.epoch} ({when}){loss}: held-out accept length {record.figure()} "
              f"({self.steps} steps, top-k 1), accuracy per step " + " ".join(f"{a:.3f}" for a in tally.accuracies),
              flush=True)
        return record

    def restore(self, through: int | None = None) -> None:
        """The epochs measured by the runs before this one, up to epoch `through` (None: all): the
        run goes on from there, and its manifest still reports them."""
        kept = read_json(self.kept, [])
        self.epochs = [EpochRecord(**e) for e in kept if through is None or e["epoch"] <= through]
        if self.epochs:  # what `inv status` shows until the next epoch is measured
            self.progress.metrics(**self.epochs[-1].metrics())

    def draw(self) -> None:
        """The plot of the epochs so far; `train` draws it once more at the end."""
        from remote.eagle3 import plot

        self._plotted_at = time.monotonic()
        try:
            plot.write(self.epochs, self.steps, self.plot_path)
        except ImportError:
            print("no training plot: matplotlib is not installed on this host (pip install matplotlib)", flush=True)

    def manifest(self) -> dict[str, Any]:
        """What train's manifest says about the draft's quality: the kept draft's (`remote.eagle3.kept`)."""
        from remote.eagle3 import kept

        return {
            "eval_records": len(self.heldout),
            "eval_steps": self.steps,
            **kept.manifest(self.epochs),
            "epoch_history": [e.as_dict() for e in self.epochs],
            "plot": str(self.plot_path) if self.plot_path.exists() else None,
        }

    def kept_epoch(self) -> EpochRecord | None:
        """The epoch whose draft ``draft/`` holds (None: none measured)."""
        from remote.eagle3 import kept

        return kept.best(self.epochs)
