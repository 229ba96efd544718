"""The counts of turns behind infer's manifest and its status metrics, read from the records themselves.

Each finished record says what infer did with its row (``regenerated``: the row's turns, each kept
answer's finish_reason, why its conversation ended, the truncated answers dropped), so a resumed run
counts the records of earlier runs exactly as it counts its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from remote.infer.conversation import DIVERGED


@dataclass
class Tally:
    """Turns of the answered records: the row's, the target's answers, and those not regenerated, by reason."""

    rows_turns: int = 0
    answered: int = 0
    truncated: int = 0
    dropped: int = 0
    #: Turns of the rows not regenerated, by why their conversation ended.
    left: Counter = field(default_factory=Counter)
    #: Conversations ended before their row's end, by reason.
    ended: Counter = field(default_factory=Counter)

    def add(self, record: dict[str, Any]) -> None:
        """Count one finished record (of this run or an earlier one)."""
        meta = record.get("regenerated") or {}
        reasons = meta.get("finish_reasons") or []
        turns = int(meta.get("turns") or len(reasons))
        self.rows_turns += turns
        self.answered += len(reasons)
        self.dropped += int(meta.get("dropped") or 0)
        self.truncated += reasons.count("length") + int(meta.get("dropped") or 0)
        if meta.get("ended") and turns > len(reasons):
            self.left[meta["ended"]] += turns - len(reasons)
            self.ended[meta["ended"]] += 1

    def metrics(self) -> dict[str, int]:
        """What `inv status` shows beside the records (zeros are not shown)."""
        return {"turns": self.answered, "truncated": self.truncated, "truncated_dropped": self.dropped,
                "tool_calls_diverged": self.ended[DIVERGED], "turns_not_regenerated": sum(self.left.values())}

    def manifest(self) -> dict[str, Any]:
        return {"of_rows": self.rows_turns, "answered": self.answered, "truncated": self.truncated,
                "truncated_dropped": self.dropped, "not_regenerated": dict(self.left.most_common()),
                "conversations_ended": dict(self.ended.most_common())}
