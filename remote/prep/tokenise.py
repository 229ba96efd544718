"""Rendered conversations to token ids and a loss mask, a batch at a time.

The text is encoded whole, in one batched call of the fast tokenizer, so the
tokens are exactly those the target sees; the assistant character spans are
mapped to token indices with the encoding's own ``char_to_token`` (two lookups
per turn, no per-token Python work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from remote.prep.normalise import Skip

Span = tuple[int, int]


@dataclass
class Tokens:
    """One tokenised record."""

    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # int8, 1 on the tokens of assistant turns
    truncated: bool = False


class Encoder:
    """Encodes texts and masks their spans, applying the length limit."""

    def __init__(self, tokenizer: Any, max_length: int, overlong: str = "truncate") -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.overlong = overlong
        # NOTE: a tokenizer with no Rust backend (Kimi's tiktoken one under
        # trust_remote_code may be one) has no offsets; it is encoded piecewise.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def encode(self, texts: list[str], spans: list[list[Span]]) -> list[Tokens | Skip]:
        """A `Tokens` per text, or the `Skip` that says why it cannot be kept."""
        if not texts:
            return []
        if self._backend is not None:
            encoded = self._encode_fast(texts, spans)
        else:
            encoded = [self._encode_piecewise(t, s) for t, s in zip(texts, spans)]
        return [self._limit(e) if isinstance(e, Tokens) else e for e in encoded]

    def _encode_fast(self, texts: list[str], spans: list[list[Span]]) -> list[Tokens | Skip]:
        out: list[Tokens | Skip] = []
        for encoding, record_spans in zip(self._backend.encode_batch(texts, add_special_tokens=False), spans):
            ids = np.array(encoding.ids, dtype=np.int32)
            mask = np.zeros(len(ids), dtype=np.int8)
            for start, end in record_spans:
                first = _token_at(encoding, range(start, end))
                last = _token_at(encoding, range(end - 1, start - 1, -1))
                if first is not None and last is not None:
                    mask[first : last + 1] = 1
            out.append(Tokens(ids, mask) if mask.any() else Skip("no assistant tokens"))
        return out

    def _encode_piecewise(self, text: str, spans: list[Span]) -> Tokens | Skip:
        cuts = [0] + [c for span in spans for c in span] + [len(text)]
        pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
        piece_ids = self.tokenizer(pieces, add_special_tokens=False)["input_ids"]
        whole = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = [i for piece in piece_ids for i in piece]
        if ids != whole:
            return Skip("tokens differ when the text is cut at assistant turns")
        # Pieces alternate: outside, span, outside, span, ..., outside.
        mask = np.concatenate([np.full(len(p), k % 2, dtype=np.int8) for k, p in enumerate(piece_ids)])
        return Tokens(np.array(ids, dtype=np.int32), mask)

    def _limit(self, tokens: Tokens) -> Tokens | Skip:
        if len(tokens.input_ids) <= self.max_length:
            return tokens
        if self.overlong == "drop":
            return Skip(f"longer than max_length ({self.max_length} tokens)")
        kept = Tokens(tokens.input_ids[: self.max_length], tokens.loss_mask[: self.max_length], truncated=True)
        return kept if kept.loss_mask.any() else Skip(f"no assistant tokens within max_length ({self.max_length})")


def _token_at(encoding: Any, positions: range) -> int | None:
    """The token holding the first of `positions` that any token holds."""
    for position in positions:
        token = encoding.char_to_token(position)
        if token is not None:
            return token
    return None
