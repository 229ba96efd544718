"""Which epoch's draft training keeps: the best on the held-out records, not merely the last.

After every epoch the draft is measured (`remote.eagle3.heldout`) and written to
``last/``; it is written to ``draft/`` too when its held-out accept length is
at least the best so far (ties go to the later epoch: as good, and trained on
more). Epoch 0, the draft training starts from, takes part: a warm start
(``stages.train.init_draft``) whose every epoch measures below it keeps the
draft it began with, and says so. Without held-out records nothing is
measured, and ``draft/`` is the last epoch's.
"""

from __future__ import annotations

from typing import Any

from remote.eagle3.epochs import EpochRecord

DRAFT, LAST = "draft", "last"
#: Epoch 0's draft, held aside until an epoch has trained on every record: a run that fails on its
#: first read of the states leaves no ``draft/`` it never trained.
START = ".start"


def best(epochs: list[EpochRecord]) -> EpochRecord | None:
    """The measured epoch with the highest accept length, the later of equals; None when none was measured."""
    chosen = None
    for record in epochs:
        if record.accept_length is not None and (chosen is None or record.accept_length >= chosen.accept_length):
            chosen = record
    return chosen


def is_best(record: EpochRecord, epochs: list[EpochRecord]) -> bool:
    """Whether `record` (the epoch just measured, among `epochs`) is the one to keep; always, unmeasured."""
    return record.accept_length is None or best(epochs) is record


def reason(epochs: list[EpochRecord]) -> str:
    """Why `draft/` holds the epoch it holds, in one line (the train job's last status line)."""
    kept, last = best(epochs), (epochs[-1] if epochs else None)
    if kept is None:
        return "kept the last epoch's draft: no held-out records to choose by"
    if kept.epoch == 0 and last is not None and last.epoch > 0:
        return (f"kept epoch 0's draft (the one training started from), accept length {kept.figure()}: every epoch "
                f"measured below it (last, epoch {last.epoch}: {last.figure()}{_noise(kept, last)})")
    said = f"kept epoch {kept.epoch}'s draft: best held-out accept length {kept.figure()}"
    if last is not None and last is not kept:
        said += f"; last/ is epoch {last.epoch}, {last.figure()}{_noise(kept, last)}"
    return said


def _noise(kept: EpochRecord, other: EpochRecord) -> str:
    return ", within noise" if kept.within_noise(other) else ""


def manifest(epochs: list[EpochRecord]) -> dict[str, Any]:
    """What the train manifest says of the kept draft: its epoch, its figures and why."""
    kept = best(epochs)
    last = epochs[-1] if epochs else None
    return {
        "kept_epoch": kept.epoch if kept else (last.epoch if last else None),
        "kept_reason": reason(epochs),
        "last_epoch": last.epoch if last else None,
        "accept_length": round(kept.accept_length, 4) if kept else None,
        "accept_interval": [round(x, 4) for x in kept.interval] if kept and kept.interval else None,
        "eval_accuracies": [round(a, 4) for a in kept.accuracies] if kept else [],
        "last_accept_length": round(last.accept_length, 4) if last and last.accept_length is not None else None,
    }
