"""What prep did with a dataset, counted as it goes: the numbers behind its manifest and `inv validate`.

Every row read ends up either kept or counted under a skip reason, so the summary always adds up
(``rows == kept + skipped``); batches' summaries merge into the dataset's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from remote.prep.tokenise import EncodingStats


@dataclass
class Summary:
    """What prep did with a dataset: the numbers behind the manifest and `inv validate`."""

    rows: int = 0
    #: Rows that gave at least one record.
    kept: int = 0
    skip_reasons: Counter = field(default_factory=Counter)
    formats: Counter = field(default_factory=Counter)
    #: Records written: one per kept row, more where a row's turns need contexts of their own.
    records: int = 0
    #: Assistant turns learned, and those that took a record of their own (`remote.prep.sequences`).
    assistant_turns: int = 0
    turns_expanded: int = 0
    #: Records of kept rows left out (e.g. overlong with ``overlong: drop``), by reason.
    records_skipped: Counter = field(default_factory=Counter)
    #: Tokens of the records (for prompts: of the rendered prompts).
    tokens: int = 0
    #: Tokens under the loss mask, and the reasoning among them.
    loss_tokens: int = 0
    reasoning_tokens: int = 0
    min_tokens: int = 0
    max_tokens: int = 0
    truncated: int = 0
    encoding: EncodingStats = field(default_factory=EncodingStats)
    #: Fields of turns that prep does not use, by name: how many turns held each (never lost silently).
    dropped_fields: Counter = field(default_factory=Counter)
    #: Rows with tools, by how the template declared them (`remote.prep.template.tool_declaration`).
    tool_declarations: Counter = field(default_factory=Counter)
    #: Prompts: the target's turns infer will ask for (`remote.prep.prompt_turns.ask_points`), and those of
    #: agent rows that write their actions in the text, left out.
    turns_to_ask: int = 0
    turns_left_out: int = 0

    @property
    def skipped(self) -> int:
        return sum(self.skip_reasons.values())

    @property
    def mean_tokens(self) -> float | None:
        count = self.records or self.kept
        return round(self.tokens / count, 1) if count and self.tokens else None

    def add_tokens(self, count: int, loss: int = 0, reasoning: int = 0) -> None:
        self.min_tokens = min(self.min_tokens, count) if self.tokens else count
        self.max_tokens = max(self.max_tokens, count)
        self.tokens += count
        self.loss_tokens += loss
        self.reasoning_tokens += reasoning

    def merge(self, other: "Summary") -> None:
        if other.tokens:
            self.min_tokens = min(self.min_tokens, other.min_tokens) if self.tokens else other.min_tokens
        self.max_tokens = max(self.max_tokens, other.max_tokens)
        for name in ("rows", "kept", "records", "assistant_turns", "turns_expanded", "tokens", "loss_tokens",
                     "reasoning_tokens", "truncated", "turns_to_ask", "turns_left_out"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.skip_reasons.update(other.skip_reasons)
        self.formats.update(other.formats)
        self.records_skipped.update(other.records_skipped)
        self.dropped_fields.update(other.dropped_fields)
        self.tool_declarations.update(other.tool_declarations)
        self.encoding.merge(other.encoding)

    def top_reasons(self, n: int = 5) -> list[tuple[str, int]]:
        return self.skip_reasons.most_common(n)

    def counts(self) -> dict[str, Any]:
        """The counts every report shows (manifest, `inv validate`, the stage's last line)."""
        return {
            "rows": self.rows,
            "kept": self.kept,
            "skipped": self.skipped,
            "skip_reasons": dict(self.skip_reasons.most_common()),
            "formats": dict(self.formats.most_common()),
            "records": self.records,
            "assistant_turns": self.assistant_turns,
            "turns_expanded": self.turns_expanded,
            "records_skipped": dict(self.records_skipped.most_common()),
            "reasoning_tokens": self.reasoning_tokens,
            "learned_tokens": self.loss_tokens,
            "mean_tokens": self.mean_tokens,
            "dropped_fields": dict(self.dropped_fields.most_common()),
            "tool_declarations": dict(self.tool_declarations.most_common()),
            "turns_to_ask": self.turns_to_ask,
            "turns_left_out": self.turns_left_out,
        }

    def token_stats(self) -> dict[str, Any]:
        return {
            "total": self.tokens,
            "mean": self.mean_tokens,
            "min": self.min_tokens,
            "max": self.max_tokens,
            "loss_tokens": self.loss_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "loss_fraction": round(self.loss_tokens / self.tokens, 4) if self.tokens else None,
            "truncated": self.truncated,
        }
