"""The draft's reduced vocabulary: the most frequent trained tokens, and their mappings.

``t2d`` (target vocab, bool) marks the kept tokens; ``d2t`` (draft vocab,
int64) holds ``target_id - draft_id``, the offset SGLang adds back
(``hot_token_id = d2t + arange(draft_vocab_size)``). Kept ids are sorted, so
draft id order follows target id order, as in SpecForge.
"""

from __future__ import annotations

from typing import Iterable

import torch


def token_counts(samples: Iterable[dict], vocab_size: int) -> torch.Tensor:
    """How often each token is a trained (loss-masked) token; all tokens when none is masked."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    everything = torch.zeros(vocab_size, dtype=torch.long)
    for sample in samples:
        ids, mask = sample["input_ids"].long(), sample["loss_mask"].bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
        everything += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts if counts.sum() else everything


def build_mapping(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for the `draft_vocab_size` most frequent tokens (ties: lower id first)."""
    vocab = counts.numel()
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"draft vocabulary {draft_vocab_size} must lie in 1..{vocab}")
    order = torch.argsort(-counts, stable=True)
    kept = torch.sort(order[:draft_vocab_size]).values
    d2t = kept - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d
