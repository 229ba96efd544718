"""Training sequences to token ids and a loss mask, a batch at a time.

The ids are the tokenizer's own encoding of each sequence's whole text: what
``tokenizer(text, add_special_tokens=False)`` gives (what
``apply_chat_template(tokenize=True)`` gives), special-token strings in the text
included. The mask is put on token boundaries, never guessed:

- a tiktoken tokenizer (Kimi's: slow, no offsets) gives each token's bytes, so
  the character spans map to token indices through the tokens' byte offsets;
- any other tokenizer encodes the text again cut at the span boundaries, and
  the pieces must concatenate to the whole text's ids.

A span boundary inside a token skips the record with a reason: a wrong mask is
worse than a lost record. Kimi's turns start after ``<think>`` and end with
``<|im_end|>``, special tokens, so their boundaries always fall between tokens.

NOTE: a slow tokenizer's ``__call__`` is several times slower than its
``encode`` (Kimi's: 7x). ``encode`` is used when it gives the same ids on a probe
text with special tokens, and checked against ``__call__`` on the first record
of the first batch and then of a batch every `CHECK_EVERY` records; a mismatch switches the process to ``__call__`` for good, with
a warning on stderr and a count in the manifest (``encoding.mismatches``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from remote.prep.normalise import Skip
from remote.prep.sequences import Sequence
from remote.prep.server_ids import IdStats, decoder, splice

Span = tuple[int, int]
#: Records encoded by `encode` between two checks against `__call__` (the first batch is always checked).
CHECK_EVERY = 1024
LONG_RUN = re.compile(r"\S{25001}|\s{25001}")
PROBE_TEXT = "aerie  probe\n\nhéllo 世界 ☃ 12345 {\"a\": [1, 2]}\t end"


@dataclass
class Tokens:
    """One tokenised record."""

    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # int8, 1 on the tokens of the learned turns
    reasoning_mask: np.ndarray  # bool, the reasoning among them (counted, not written)
    truncated: bool = False


@dataclass
class EncodingStats:
    """How the ids were made, for the manifest: the method and the checks against ``__call__``."""

    method: str = ""
    checked: int = 0
    mismatches: int = 0
    #: The learned turns that came with the ids infer's server generated (`remote.prep.server_ids`).
    server_ids: IdStats = field(default_factory=IdStats)

    def merge(self, other: "EncodingStats") -> None:
        self.method = self.method or other.method
        self.checked += other.checked
        self.mismatches += other.mismatches
        self.server_ids.merge(other.server_ids)


class Encoder:
    """Encodes sequences and masks their spans, applying the length limit."""

    def __init__(self, tokenizer: Any, max_length: int, overlong: str = "truncate") -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.overlong = overlong
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._byte_lengths = _tiktoken_byte_lengths(tokenizer) if self._backend is None else None
        self._quick = None if self._backend is not None else self._quick_encode()
        self.stats = EncodingStats(self._method())
        self._unchecked = 0
        #: Whether encoding runs outside the GIL (a Rust tokenizer's batch call).
        self.releases_gil = self._backend is not None

    def encode(self, batch: list[Sequence]) -> list[Tokens | Skip]:
        """A `Tokens` per sequence, or the `Skip` that says why it cannot be kept."""
        if not batch:
            return []
        texts = [s.text for s in batch]
        ids = self._encode_texts(texts)
        out = []
        for sequence, record_ids in zip(batch, ids):
            tokens = self._masked(sequence, np.fromiter(record_ids, dtype=np.int32, count=len(record_ids)))
            if isinstance(tokens, Tokens) and any(g is not None for g in sequence.generated):
                tokens = Tokens(*splice(tokens.input_ids, tokens.loss_mask, tokens.reasoning_mask, sequence.generated,
                                        decoder(self.tokenizer), self.stats.server_ids))
            out.append(self._limit(tokens) if isinstance(tokens, Tokens) else tokens)
        return out

    def _method(self) -> str:
        if self._backend is not None:
            return "fast tokenizer, mask by pieces"
        encoder = getattr(self._quick, "method", "encode") if self._quick is not None else "__call__"
        return f"{encoder}, mask by " + ("token bytes" if self._byte_lengths is not None else "pieces")

    # -- ids --------------------------------------------------------------------------------

    def _own(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _quick_encode(self) -> Callable[[str], list[int]] | None:
        """The tokenizer's `encode`, called the way that gives `__call__`'s ids on the probe, if any."""
        probe = PROBE_TEXT + "".join(self.tokenizer.all_special_tokens) + PROBE_TEXT
        expected = self._own(probe)
        candidates = (self._tiktoken_encode(), lambda t: self.tokenizer.encode(t),
                      lambda t: self.tokenizer.encode(t, add_special_tokens=False))
        for candidate in candidates:
            if candidate is None:
                continue
            try:
                if list(candidate(probe)) == list(expected):
                    return candidate
            except Exception:  # a signature it does not take: try the next
                continue
        return None

    def _tiktoken_encode(self) -> Callable[[str], list[int]] | None:
        """Kimi's `encode` without its Python pre-pass, for the texts that pre-pass leaves whole.

        NOTE: Kimi's `encode` cuts a text into pieces under 400k characters and runs of at most
        25k spaces or non-spaces (a tiktoken limit), in a per-character Python loop that costs
        three times the encoding itself, then hands each piece to tiktoken with every special
        token allowed. A text it would not cut goes to tiktoken directly; any other to `encode`.
        Checked like every `encode`: on the probe, and on a record of every batch.
        """
        model = getattr(self.tokenizer, "model", None)
        if self._byte_lengths is None or not hasattr(model, "encode"):
            return None

        def encode(text: str) -> list[int]:
            if len(text) <= 400_000 and not LONG_RUN.search(text):
                return model.encode(text, allowed_special="all")
            return self.tokenizer.encode(text)

        encode.method = "tiktoken"  # type: ignore[attr-defined]
        return encode

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]
        if self._quick is None:
            return [self._own(t) for t in texts]
        ids = [self._quick(t) for t in texts]
        self._unchecked += len(texts)
        if self.stats.checked and self._unchecked < CHECK_EVERY:
            return ids
        self._unchecked = 0
        self.stats.checked += 1
        if list(ids[0]) != list(self._own(texts[0])):
            self.stats.mismatches += 1
            self._quick = None
            self.stats.method = self._method()
            print("prep: WARNING: the tokenizer's encode() differs from its __call__ on a record; "
                  "every later record is encoded with __call__ (slower)", file=sys.stderr)
            return [self._own(t) for t in texts]
        return ids

    def _encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(pieces, add_special_tokens=False)]
        encode = self._quick or self._own
        return [list(encode(p)) if p else [] for p in pieces]

    # -- mask -------------------------------------------------------------------------------

    def _masked(self, sequence: Sequence, ids: np.ndarray) -> Tokens | Skip:
        if self._byte_lengths is not None:
            tokens = self._masked_by_bytes(sequence, ids)
            if tokens is not None:
                return tokens
        tokens = self._masked_by_pieces(sequence, ids, with_reasoning=True)
        if tokens is None:
            # NOTE: a reasoning boundary inside a token costs the record only its reasoning count.
            tokens = self._masked_by_pieces(sequence, ids, with_reasoning=False)
        if tokens is None:
            return Skip("a turn boundary falls inside a token")
        return tokens

    def _masked_by_bytes(self, sequence: Sequence, ids: np.ndarray) -> Tokens | Skip | None:
        """The mask from each token's byte length; None when they do not add up to the text."""
        text = sequence.text
        if not ids.size or int(ids.max()) >= len(self._byte_lengths):
            return None
        ends = np.cumsum(self._byte_lengths[ids])
        ascii_text = text.isascii()
        if ends[-1] != (len(text) if ascii_text else len(text.encode("utf-8"))):
            return None

        cuts = [c for span in sequence.spans + sequence.reasoning for c in span]
        at = np.array(cuts if ascii_text else [len(text[:c].encode("utf-8")) for c in cuts], dtype=np.int64)
        index = np.searchsorted(ends, at, side="right")
        # A cut is on a token boundary when the tokens before it end exactly there.
        aligned = (at == 0) | ((index > 0) & (ends[np.maximum(index - 1, 0)] == at))
        loss = np.zeros(len(ids), dtype=np.int8)
        reasoning = np.zeros(len(ids), dtype=bool)
        k = 0
        for spans, mask in ((sequence.spans, loss), (sequence.reasoning, reasoning)):
            for _ in spans:
                if aligned[k] and aligned[k + 1]:
                    mask[index[k] : index[k + 1]] = 1
                elif mask is loss:
                    return Skip("a turn boundary falls inside a token")
                # else: a reasoning boundary inside a token: that reasoning is not counted
                k += 2
        return Tokens(ids, loss, reasoning)

    def _masked_by_pieces(self, sequence: Sequence, ids: np.ndarray, with_reasoning: bool) -> Tokens | None:
        """The text encoded cut at every boundary; None unless the pieces give the whole's ids."""
        text = sequence.text
        spans = sequence.spans + (sequence.reasoning if with_reasoning else [])
        cuts = sorted({0, len(text), *(c for span in spans for c in span)})
        pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
        piece_ids = self._encode_pieces(pieces)
        if [i for piece in piece_ids for i in piece] != ids.tolist():
            return None
        loss = np.zeros(len(ids), dtype=np.int8)
        reasoning = np.zeros(len(ids), dtype=bool)
        at = 0
        for (start, end), piece in zip(zip(cuts, cuts[1:]), piece_ids):
            if any(a <= start and end <= b for a, b in sequence.spans):
                loss[at : at + len(piece)] = 1
            if with_reasoning and any(a <= start and end <= b for a, b in sequence.reasoning):
                reasoning[at : at + len(piece)] = True
            at += len(piece)
        return Tokens(ids, loss, reasoning)

    def _limit(self, tokens: Tokens) -> Tokens | Skip:
        if not tokens.loss_mask.any():
            return Skip("no assistant tokens")
        if len(tokens.input_ids) <= self.max_length:
            return tokens
        if self.overlong == "drop":
            return Skip(f"longer than max_length ({self.max_length} tokens)")
        n = self.max_length
        kept = Tokens(tokens.input_ids[:n], tokens.loss_mask[:n], tokens.reasoning_mask[:n], truncated=True)
        return kept if kept.loss_mask.any() else Skip(f"no assistant tokens within max_length ({self.max_length})")


#: Byte-length tables already built, by tiktoken `Encoding` (kept alive with its table).
_BYTE_LENGTHS: dict[int, tuple[Any, np.ndarray]] = {}


def _tiktoken_byte_lengths(tokenizer: Any) -> np.ndarray | None:
    """Each token id's length in bytes, for a tokenizer over a tiktoken `Encoding` (Kimi's); else None.

    Every record checks that its tokens' lengths add up to its text's, so a wrong table
    can only send records the slower way (by pieces), never give a wrong mask.
    """
    model = getattr(tokenizer, "model", None)
    if not type(model).__module__.startswith("tiktoken"):
        return None
    if id(model) not in _BYTE_LENGTHS:
        _BYTE_LENGTHS[id(model)] = (model, _byte_lengths(model))
    return _BYTE_LENGTHS[id(model)][1]


def _byte_lengths(model: Any) -> np.ndarray:
    lengths = np.zeros(model.n_vocab, dtype=np.int64)
    ranks, specials = getattr(model, "_mergeable_ranks", None), getattr(model, "_special_tokens", None)
    if isinstance(ranks, dict) and isinstance(specials, dict):
        # NOTE: tiktoken's own tables, read directly: a third of a second faster per process
        # than asking for each of the 164k tokens' bytes.
        for table in (ranks, {text.encode("utf-8"): token for text, token in specials.items()}):
            lengths[np.fromiter(table.values(), dtype=np.int64, count=len(table))] = np.fromiter(
                (len(b) for b in table), dtype=np.int64, count=len(table))
        return lengths
    for token in range(model.n_vocab):
        try:
            lengths[token] = len(model.decode_single_token_bytes(token))
        except KeyError:  # an unused id: never produced, so its length never counts
            pass
    return lengths
