"""One epoch's figures: what training's held-out measurement records and the plot draws."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EpochRecord:
    """One epoch's figures, as the manifest, the metrics and the plot show them."""

    epoch: int
    #: The epoch's mean training loss; None for epoch 0, the draft as training starts from it.
    loss: float | None
    accept_length: float | None = None
    accuracies: list[float] = field(default_factory=list)
    positions: int = 0

    def metrics(self) -> dict[str, Any]:
        if self.accept_length is None:
            return {}
        return {"accept_length": round(self.accept_length, 4), "eval_positions": self.positions,
                **{f"eval_acc_{k}": round(a, 4) for k, a in enumerate(self.accuracies)}}

    def as_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "loss": None if self.loss is None else round(self.loss, 5), **self.metrics()}
