"""The target's own token ids for a regenerated turn, where infer's server returned them.

Re-encoding an answer's text need not give the ids the target generated: a model can sample a
tokenisation that the tokenizer's merges would not produce for the same text. The draft must learn
to predict what the target generates, so a learned turn whose server ids render to the same text
as the turn's own tokens trains on the server's ids. A turn whose ids render to other text (a server
whose parser rewrote the calls, a template that renders the turn otherwise) keeps the text's tokens,
and is counted: a wrong mask is worse than a re-encoded turn.

The server's ids may lack the end-of-turn token (SGLang leaves a matched stop token out of some
outputs): the turn's own last token is then kept after them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class IdStats:
    """How the server's ids compared with the text's, for tokenize's manifest (``encoding.server_ids``)."""

    #: Learned turns that came with the server's ids, and those whose ids differ from the text's re-encoding.
    turns: int = 0
    turns_differing: int = 0
    #: Records with a turn whose ids differ: the drift that training on the text alone would carry.
    records_differing: int = 0
    #: Turns whose server ids render to other text than the turn's: trained on the text's tokens.
    turns_unusable: int = 0

    def merge(self, other: "IdStats") -> None:
        for name in ("turns", "turns_differing", "records_differing", "turns_unusable"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The `[start, end)` runs of ones in `mask`, in order."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def splice(ids: np.ndarray, loss: np.ndarray, reasoning: np.ndarray, generated: list[list[int] | None],
           decode: Callable[[list[int]], str], stats: IdStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`ids` with each learned turn that has server ids replaced by them; the masks moved with them."""
    spans = runs(loss)
    if len(spans) != len(generated) or not any(g is not None for g in generated):
        stats.turns_unusable += sum(g is not None for g in generated) if len(spans) != len(generated) else 0
        return ids, loss, reasoning
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    at, differs = 0, False
    for (a, b), server in zip(spans, generated):
        own = ids[a:b].tolist()
        replaced = None if server is None else _usable(own, server, decode, stats)
        if replaced is None or replaced == own:
            continue
        differs = True
        think = int(reasoning[a:b].sum())
        ended = own[think] if think < len(own) else None
        new_reasoning = np.zeros(len(replaced), dtype=bool)
        if think and ended in replaced:
            new_reasoning[: replaced.index(ended)] = True
        pieces += [(ids[at:a], loss[at:a], reasoning[at:a]),
                   (np.asarray(replaced, dtype=ids.dtype), np.ones(len(replaced), dtype=loss.dtype), new_reasoning)]
        at = b
    stats.records_differing += differs
    if not differs:
        return ids, loss, reasoning
    pieces.append((ids[at:], loss[at:], reasoning[at:]))
    return tuple(np.concatenate([p[k] for p in pieces]) for k in range(3))  # type: ignore[return-value]


def _usable(own: list[int], server: list[int], decode: Callable[[list[int]], str], stats: IdStats) -> list[int] | None:
    """The server's ids for the turn (with its own end token when they lack it), or None when they render
    to other text."""
    stats.turns += 1
    if server == own:
        return own
    text = decode(own)
    for candidate in (list(server), list(server) + own[-1:]):
        if candidate == own:
            return own  # the same ids, less the end token the server left out
        if decode(candidate) == text:
            stats.turns_differing += 1
            return candidate
    stats.turns_unusable += 1
    return None


def decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """Ids to text with every special token written out, as the template writes them."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
