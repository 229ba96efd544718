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
    #: The accept length's 95 % interval over the held-out records (`remote.eagle3.acceptance.accept_interval`).
    interval: list[float] | None = None

    def metrics(self) -> dict[str, Any]:
        if self.accept_length is None:
            return {}
        spread = {} if self.interval is None else {"accept_low": round(self.interval[0], 4),
                                                   "accept_high": round(self.interval[1], 4)}
        return {"accept_length": round(self.accept_length, 4), **spread, "eval_positions": self.positions,
                **{f"eval_acc_{k}": round(a, 4) for k, a in enumerate(self.accuracies)}}

    def figure(self) -> str:
        """``3.71 [3.52, 3.88]``: the accept length and its interval."""
        if self.accept_length is None:
            return "not measured"
        spread = "" if self.interval is None else f" [{self.interval[0]:.2f}, {self.interval[1]:.2f}]"
        return f"{self.accept_length:.2f}{spread}"

    def within_noise(self, other: "EpochRecord") -> bool:
        """Whether the two figures cannot be told apart: their intervals overlap (without intervals: equal)."""
        if self.interval is None or other.interval is None:
            return self.accept_length == other.accept_length
        return self.interval[0] <= other.interval[1] and other.interval[0] <= self.interval[1]

    def as_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "loss": None if self.loss is None else round(self.loss, 5), **self.metrics()}
