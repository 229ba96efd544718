"""Where training stands, saved so that a stopped or crashed train job goes on from there.

One file, ``<train output>/resume/state.pt`` (``torch.save``): the draft's
weights (the frozen embeddings left out), the optimizer's and the learning-rate
schedule's state, and the position -- ``epoch`` (0-based, the one under way),
``position`` (batches of that epoch already taken) and ``step`` (optimizer
steps so far). The batch order of an epoch is a fixed shuffle of the sample
list (seeded by the epoch), so skipping ``position`` batches lands exactly
where the last run left off.

``world`` is how many processes trained it: the position counts global batches of
``batch_size x world`` records, so a run over the same data goes on only with as many
(`check_world` refuses another count in one line).

``data`` fingerprints the samples the position counts in (their paths, their
contents by the checksums extract recorded, and the training settings). A
checkpoint made over other data still carries the draft and the optimizer on:
the chunked route trains one chunk of records after another, each a new list
of samples, one draft throughout; and a finished run whose states were
extracted again (new answers under the same names) trains on them.

Written to a run-unique temporary name and renamed, so a kill mid-write
leaves the previous checkpoint whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FILE = "state.pt"
#: Not saved: the target's embeddings, read again from the target on every start.
SHARED = ("embed_tokens.weight",)


@dataclass
class TrainState:
    """The training position and the optimizer's state; the draft's weights travel beside it."""

    epoch: int = 0
    position: int = 0
    step: int = 0
    optimizer: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    data: str = ""
    #: The processes that trained it (`remote.eagle3.distributed`): a global batch is `batch_size` x this.
    world: int = 1
    #: The rate it was trained at (None: not recorded), which the optimizer's and the schedule's states carry on.
    learning_rate: float | None = None


def fingerprint(files: list[Path], settings: dict[str, Any]) -> str:
    """What the position is counted in: the samples, each by its name and content (`shards.content_id`: new
    answers extracted again keep the names), and the settings that order and size its batches."""
    from remote.eagle3.shards import content_id

    return _digest([[str(f), content_id(f)] for f in files], settings)


def names_fingerprint(files: list[Path], settings: dict[str, Any]) -> str:
    """`fingerprint` as a state saved before the samples' content counted has it: their names alone."""
    return _digest([str(f) for f in files], settings)


def _digest(samples: list[Any], settings: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(samples).encode())
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def save(directory: Path, draft: torch.nn.Module, state: TrainState) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE
    tmp = directory / f".{FILE}.{os.getpid()}.tmp"
    weights = {k: v.detach().cpu() for k, v in draft.state_dict().items() if k not in SHARED}
    torch.save({"draft": weights, **state.__dict__}, tmp)
    os.replace(tmp, path)
    return path


def load(directory: Path, draft: torch.nn.Module) -> TrainState | None:
    """The saved state, with its weights copied into `draft`; None when nothing was saved."""
    path = directory / FILE
    if not path.is_file():
        return None
    saved = torch.load(path, map_location="cpu", weights_only=False)
    weights = saved.pop("draft")
    ours = draft.state_dict()
    missing = sorted(set(ours) - set(weights) - set(SHARED))
    unexpected = sorted(set(weights) - set(ours))
    resized = [f"{k} {list(v.shape)} saved, {list(ours[k].shape)} now" for k, v in weights.items()
               if k in ours and v.shape != ours[k].shape]
    if missing or unexpected or resized:
        from remote.eagle3 import StageInputError

        what = "; ".join([*resized, *(f"{k} missing" for k in missing), *(f"{k} not in this draft" for k in unexpected)])
        raise StageInputError(f"{path} holds another draft than these settings make ({what}): a setting that shapes "
                              "the draft changed since it was saved; restore it to resume, or delete the resume/ folder "
                              "to train afresh")
    draft.load_state_dict(weights, strict=False)
    return TrainState(**saved)


def saved_world(directory: Path) -> int | None:
    """How many processes trained the state saved in `directory` (None: nothing saved), its weights left unread."""
    path = directory / FILE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("world", 1)


def check_world(saved: TrainState, world: int, nproc_setting: str = "stages.train.nproc") -> None:
    """Refuse (one line) to go on from `saved` with another number of processes than trained it."""
    from remote.eagle3 import StageInputError

    if saved.world != world:
        raise StageInputError(f"{nproc_setting} is {world}, but the run to resume was trained by {saved.world} "
                              f"process{'es' if saved.world > 1 else ''} (its batches count {saved.world} ranks' "
                              f"records): set nproc: {saved.world} to resume it, or delete its resume/ folder to start over")


def after_diverging(learning_rate: float | None = None) -> str:
    """What to do once a run diverged: its saved state would only diverge again, so a lower rate starts afresh."""
    now = "" if learning_rate is None else f" ({learning_rate:g} now)"
    return f"lower stages.train.learning_rate{now} and delete its resume/ folder to train afresh"


def check_learning_rate(saved: TrainState, learning_rate: float) -> None:
    """Refuse (one line) to go on from `saved` at another learning rate: its optimizer and schedule would carry the
    old rate on, whatever the settings say, and a run that finished would keep its draft untouched."""
    from remote.eagle3 import StageInputError

    if saved.learning_rate is not None and saved.learning_rate != learning_rate:
        raise StageInputError(f"stages.train.learning_rate is {learning_rate:g}, but the run to resume was trained at "
                              f"{saved.learning_rate:g}: set it back to resume, or delete its resume/ folder to train "
                              "afresh at the new rate")
