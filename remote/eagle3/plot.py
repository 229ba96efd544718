"""The training curve beside the draft: loss, held-out per-step accuracy and acceptance length per epoch
(with its 95 % interval, and a star on the epoch whose draft is kept: `remote.eagle3.kept`)."""

from __future__ import annotations

import os
from pathlib import Path

from remote.eagle3 import kept
from remote.eagle3.epochs import EpochRecord

PLOT_NAME = "training.png"


def write(epochs: list[EpochRecord], steps: int, path: Path) -> Path:
    """Draw the curves into `path` (a PNG), through a temporary name and a rename."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a GPU host
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    measured = [e for e in epochs if e.accept_length is not None]
    figure, (loss_ax, acc_ax, accept_ax) = plt.subplots(1, 3, figsize=(13, 3.8), sharex=True, constrained_layout=True)
    trained = [e for e in epochs if e.loss is not None]  # epoch 0 (before training) has no loss
    loss_ax.plot([e.epoch for e in trained], [e.loss for e in trained], marker="o")
    loss_ax.set(title="training loss (mean per epoch)", xlabel="epoch")
    for k in range(len(measured[0].accuracies) if measured else 0):
        acc_ax.plot([e.epoch for e in measured], [e.accuracies[k] for e in measured], marker="o", label=f"step {k}")
    acc_ax.set(title="held-out accuracy per draft step", xlabel="epoch", ylim=(0, 1))
    if measured:
        acc_ax.legend(fontsize="small")
        accept_ax.plot([e.epoch for e in measured], [e.accept_length for e in measured], marker="o", color="tab:green")
        spread = [e for e in measured if e.interval]
        if spread:  # the 95 % interval over the held-out records
            accept_ax.fill_between([e.epoch for e in spread], [e.interval[0] for e in spread],
                                   [e.interval[1] for e in spread], color="tab:green", alpha=0.15, linewidth=0)
        chosen = kept.best(measured)
        accept_ax.plot([chosen.epoch], [chosen.accept_length], marker="*", markersize=16, color="tab:red",
                       linestyle="none", label=f"kept: epoch {chosen.epoch}")
        accept_ax.legend(fontsize="small", loc="lower right")
    accept_ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)  # a draft that is never used
    accept_ax.set(title=f"expected acceptance length ({steps} steps, top-k 1)", xlabel="epoch",
                  ylim=(0.9, steps + 1.1))
    if not measured:
        accept_ax.text(0.5, 0.5, "no held-out records", ha="center", transform=accept_ax.transAxes)
    for ax in (loss_ax, acc_ax, accept_ax):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs, never crowded
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    figure.savefig(tmp, dpi=100)
    plt.close(figure)
    os.replace(tmp, path)
    return path
