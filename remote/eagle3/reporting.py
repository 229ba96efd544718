"""Training's curves where ML people look (``stages.train.report_to``): TensorBoard or Weights & Biases.

aerie's trainer (`remote.stages.train`, and the chunked route's resident
trainer) reports every optimizer step's loss and per-step accuracy, and each
epoch's held-out figures (`remote.eagle3.heldout`), all against the optimizer
step, as SpecForge's and Hugging Face's trainers do:

- ``train/loss``, ``train/acc_<k>`` (step ``k`` of the training-time-test chain);
- ``train/epoch``, ``eval/loss`` (the epoch's mean training loss), ``eval/accept_length``
  and ``eval/acc_<k>``, at the step where the epoch was measured (step 0: before training).

``tensorboard``: event files under ``$AERIE_OUTPUT/tensorboard/`` beside the draft; a
run resumed from step T hides what the killed run logged after step T (TensorBoard's
``purge_step``), so the curves read as one run. ``wandb``: a run under
``$AERIE_OUTPUT/wandb/``, offline (``wandb sync`` uploads it later) unless the host has
a W&B key or ``WANDB_MODE`` says otherwise. SpecForge's engine gets the same choice as
its own ``tracking.report_to`` (`tracking_config`).

Neither package is imported unless chosen: the train stage imports this module on
a host that has neither.
"""

from __future__ import annotations

import hashlib
import importlib.util
import netrc
import os
from pathlib import Path
from typing import Any, Callable

from remote.eagle3 import StageInputError
from remote.eagle3.epochs import EpochRecord

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
#: What to install for each choice: tensorboard as pyproject's `host` extra pins it; wandb is the user's to add.
PACKAGES = {"tensorboard": "tensorboard==2.21.0", "wandb": "wandb==0.31.0"}
WANDB_PROJECT = "aerie"


def require(kind: str) -> None:
    """Refuse, in one line naming what to install, a `kind` whose package this host's Python lacks;
    checked before anything trains (nothing is imported)."""
    if kind != "none" and importlib.util.find_spec(kind) is None:
        raise StageInputError(f"stages.train.report_to {kind}: this host's Python has no {kind}; "
                              f"pip install {PACKAGES[kind]} on the host (or set report_to: none)")


class Reporter:
    """Where the curves go; this base reports nowhere (``report_to: none``)."""

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Log `values` (tag: number) at optimizer step `step`."""

    def flush(self) -> None:
        """Make what was logged readable now (after each epoch: a watcher sees it at once)."""

    def close(self) -> None:
        """Flush and end the run."""

    def step(self, step: int, loss: float, accuracies: list[float]) -> None:
        self.scalars({"train/loss": loss, **{f"train/acc_{k}": a for k, a in enumerate(accuracies)}}, step)

    def epoch(self, record: EpochRecord, step: int) -> None:
        values = {"train/epoch": float(record.epoch), "eval/loss": record.loss}
        if record.accept_length is not None:
            values["eval/accept_length"] = record.accept_length
            values.update({f"eval/acc_{k}": a for k, a in enumerate(record.accuracies)})
        # Neither NaN (an epoch of no steps) nor None (epoch 0: measured before any training, so no loss)
        self.scalars({k: v for k, v in values.items() if v is not None and v == v}, step)
        self.flush()


class TensorBoardReporter(Reporter):
    """Event files under `logdir`; a run resumed at step `resumed_at` hides what earlier files logged from there on."""

    def __init__(self, logdir: Path, resumed_at: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # `require` found it, yet it does not import (a broken install)
            raise StageInputError(f"stages.train.report_to tensorboard: tensorboard does not import on this host; "
                                  f"pip install {PACKAGES['tensorboard']}") from None
        # NOTE: whenever earlier event files are there, TensorBoard hides what they logged from the first
        # step this run takes again (a fresh run over a killed one's files: everything), so the curves read
        # as one run; what they logged at the step it resumes from (its epoch's figures) stays theirs.
        earlier = logdir.is_dir() and any(logdir.glob("events.out.tfevents.*"))
        purge = (resumed_at + 1 if resumed_at else 0) if earlier else None
        self.writer = SummaryWriter(str(logdir), purge_step=purge, flush_secs=30)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbReporter(Reporter):
    """One W&B run per train output (resumed under the same id), offline unless the host has a key."""

    def __init__(self, directory: Path, name: str, config: dict[str, Any]) -> None:
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        run_id = "aerie-" + hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), name=name, id=run_id,
                              resume="allow", dir=str(directory), mode=wandb_mode(), config=config)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_mode(env: dict[str, str] | None = None, netrc_path: Path | None = None) -> str:
    """``WANDB_MODE`` when set; else ``online`` where the host has a W&B key (``WANDB_API_KEY`` or
    ``~/.netrc``'s api.wandb.ai, what ``wandb login`` writes); else ``offline``: no run ever waits on
    a network it cannot reach, and ``wandb sync`` uploads it later."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if env.get("WANDB_API_KEY") or _netrc_has_key(netrc_path or Path.home() / ".netrc") else "offline"


def _netrc_has_key(path: Path) -> bool:
    try:
        return path.is_file() and bool((netrc.netrc(str(path)).authenticators("api.wandb.ai") or (None,) * 3)[2])
    except (OSError, netrc.NetrcParseError):
        return False


def open_reporter(kind: str, output: Path, resumed_at: int, name: str, config: dict[str, Any]) -> Reporter:
    """The reporter `kind` names, writing beside the draft in `output`; `resumed_at` is the step the
    run goes on from (0: a fresh run), `name` and `config` name the run in W&B."""
    require(kind)
    if kind == "tensorboard":
        return TensorBoardReporter(output / TENSORBOARD_DIR, resumed_at)
    if kind == "wandb":
        return WandbReporter(output / WANDB_DIR, name, config)
    return Reporter()


class Observer:
    """The trainer's callbacks, each also reporting: every step, and every epoch `evaluation` (a
    `remote.eagle3.heldout.EpochEvaluation`) adds to its ``epochs``.

    An epoch is reported at the step it was measured after: one measured before the first step
    (epoch 0) at the step the run started from. A run resumed at step T > 0 leaves the epochs
    already there to the runs that measured (and reported) them; a fresh run reports them all.
    """

    def __init__(self, reporter: Reporter, evaluation: Any, step: int) -> None:
        self.reporter, self.evaluation, self.at = reporter, evaluation, step
        self.reported = len(evaluation.epochs) if step else 0

    def wrap(self, callbacks: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
        """`callbacks` (``on_step``, ``on_epoch``, ``on_checkpoint``) with reporting added after each."""
        on_step, on_epoch = callbacks["on_step"], callbacks["on_epoch"]
        on_checkpoint = callbacks.get("on_checkpoint") or (lambda state: None)

        def step(step: int, loss: float, accuracies: list[float], records: int) -> None:
            on_step(step, loss, accuracies, records)
            self.report(step, loss, accuracies)

        def epoch(number: int) -> None:
            on_epoch(number)
            self.report_epochs()

        def checkpoint(state: Any) -> None:
            on_checkpoint(state)
            self.reporter.flush()  # a run killed now resumes here: every step before it is on disk

        return {**callbacks, "on_step": step, "on_epoch": epoch, "on_checkpoint": checkpoint}

    def report(self, step: int, loss: float, accuracies: list[float]) -> None:
        self.report_epochs()  # measured before this step
        self.reporter.step(step, loss, accuracies)
        self.at = step

    def report_epochs(self) -> None:
        epochs = self.evaluation.epochs
        for record in epochs[self.reported:]:
            self.reporter.epoch(record, self.at)
        self.reported = len(epochs)

    def close(self) -> None:
        self.report_epochs()
        self.reporter.close()


def tracking_config(kind: str, output: Path, name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """SpecForge's ``tracking:`` for `kind`: its own ``report_to`` (TensorBoard: SpecForge writes
    ``<output_dir>/runs``); W&B offline unless the host has a key, its files under `output`."""
    tracking: dict[str, Any] = {"report_to": kind}
    if kind == "wandb":
        tracking.update(wandb_project=(env or os.environ).get("WANDB_PROJECT", WANDB_PROJECT), wandb_name=name,
                        wandb_dir=str(output / WANDB_DIR), wandb_offline=wandb_mode(env) == "offline")
    return tracking
