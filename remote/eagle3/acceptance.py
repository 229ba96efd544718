"""How good a draft is, offline: per-step accuracy and the expected acceptance length.

SGLang's EAGLE-3 with ``--speculative-eagle-topk 1`` drafts a chain of
``num_steps`` tokens after each verified token; the target checks them in one
forward pass and keeps the longest prefix it agrees with (greedy: the token is
the target's own top token), plus one token of its own, the *bonus*. The
acceptance length SGLang reports (``completion_tokens / spec_verify_ct``) is
therefore ``accepted drafts + 1``: 1.0 is a draft that is never used,
``num_steps + 1`` one that is always right.

Here the chain is replayed on held-out records from the target's own states.
A chain starts at position ``t`` (the target's features up to ``t`` and the
token ``x[t+1]`` it just verified); step ``k`` proposes the token at
``t+k+2`` and is accepted when it is the target's top token there,
``argmax lm_head(z[t+k+1])``, over the full vocabulary (a token outside the
draft's reduced vocabulary is a miss, as it is on the server).

Teacher forcing: step ``k >= 1`` reads ``x[t+k+1]`` where the server would feed
the draft's own previous token. The two agree exactly when the previous draft
was accepted *and* the record follows the target's greedy choice there
(``x[t+k+1] == argmax z[t+k]``). Where a record leaves the greedy path (text
the target did not write, or sampled at a temperature), the chain cannot be
replayed further and is left out from that step on, rather than counted as
rejected. The estimate is then a product of per-step conditional acceptance
rates,

    accept_length = 1 + a_0 + a_0 a_1 + ... + a_0 ... a_{n-1},
    a_k = P(step k accepted | steps 0..k-1 accepted, chain replayable to k),

which on records the target wrote greedily is exactly the mean of
``1 + leading accepted drafts`` over every chain start. Only positions whose
proposed token is a trained token (``loss_mask``: the assistant's turns) count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from remote.eagle3.model import Eagle3Draft, shift_left


@dataclass
class Tally:
    """Counts over chains, added up batch by batch; the figures are read from them at the end."""

    steps: int
    reached: list[int] = field(default_factory=list)
    """Per step: replayable chains whose earlier drafts were all accepted."""
    accepted: list[int] = field(default_factory=list)
    """Per step: of those, the chains whose draft at this step was accepted too."""
    valid: list[int] = field(default_factory=list)
    """Per step: positions with a trained token to predict (the accuracy's denominator)."""
    hits: list[int] = field(default_factory=list)
    """Per step: of those, where the draft's top token is the target's (teacher-forced)."""
    per_record: list[tuple[list[int], list[int]]] = field(default_factory=list)
    """Each record's own (`reached`, `accepted`), for the figure's spread (`accept_interval`)."""

    def __post_init__(self) -> None:
        for name in ("reached", "accepted", "valid", "hits"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.steps)

    def add(self, other: "Tally") -> None:
        for name in ("reached", "accepted", "valid", "hits"):
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name))])

    def acceptance_rates(self) -> list[float]:
        """`a_k` of every step; a step no chain reached counts as never accepted."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached)]

    @property
    def accept_length(self) -> float:
        """Expected tokens per verification: accepted drafts plus the bonus token (1.0: useless)."""
        total, survive = 1.0, 1.0
        for rate in self.acceptance_rates():
            survive *= rate
            total += survive
        return total

    @property
    def accuracies(self) -> list[float]:
        """Per step: how often the draft's top token is the target's, on trained positions."""
        return [h / v if v else 0.0 for h, v in zip(self.hits, self.valid)]

    @property
    def positions(self) -> int:
        """Chain starts counted (step 0's replayable chains)."""
        return self.reached[0] if self.reached else 0


def tally_chains(draft_top: list[torch.Tensor], target_top: torch.Tensor, input_ids: torch.Tensor,
                 loss_mask: torch.Tensor) -> Tally:
    """Count one batch of chains.

    `draft_top[k]` (B, T): the target-vocabulary id that step ``k`` proposes at
    chain start ``t``; `target_top` (B, T): the target's top token after
    position ``t`` (its guess for ``t+1``); `input_ids`, `loss_mask` (B, T): the
    record, right-padded with mask 0.
    """
    steps = len(draft_top)
    tally = Tally(steps)
    mask = loss_mask.bool()
    # Whether the record follows the target's greedy choice at each position: x[t+1] == top(t).
    greedy = shift_left(input_ids, 1) == target_top
    alive = torch.ones_like(mask)
    for k in range(steps):
        valid = shift_left(mask, k + 2)  # the proposed token (t+k+2) exists and is trained
        hit = draft_top[k] == shift_left(target_top, k + 1)
        if k > 0:
            # Step k read x[t+k+1]; the server would have fed the accepted draft, top(t+k).
            alive = alive & shift_left(greedy, k)
        reached = alive & valid
        tally.reached[k] = int(reached.sum())
        tally.accepted[k] = int((reached & hit).sum())
        tally.valid[k] = int(valid.sum())
        tally.hits[k] = int((valid & hit).sum())
        alive = alive & hit
    return tally


@torch.no_grad()
def target_top_tokens(final: torch.Tensor, head: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """The target's top token at each position, from its final states and lm_head, over the full vocabulary."""
    tops = []
    for start in range(0, final.shape[1], chunk):
        # NOTE: chunked so a 160k vocabulary never needs a full T x V tensor.
        tops.append((final[:, start : start + chunk].float() @ head.float().T).argmax(-1))
    return torch.cat(tops, dim=1)


@torch.no_grad()
def evaluate(draft: Eagle3Draft, head: torch.Tensor, samples: Iterable[Any], load: Callable[[Any], dict[str, Any]],
             steps: int, max_length: int, beat: Callable[[], None] = lambda: None) -> Tally:
    """Replay `steps`-long chains of `draft` over held-out `samples`, one record at a time."""
    device = head.device
    dtype = draft.fc.weight.dtype
    was_training = draft.training
    draft.eval()
    tally = Tally(steps)
    try:
        for sample in samples:
            record = load(sample)
            n = min(max_length, len(record["input_ids"]))
            input_ids = record["input_ids"][None, :n].to(device)
            loss_mask = record["loss_mask"][None, :n].to(device)
            aux = record["aux_hidden_state"][:, :n].to(device, dtype)
            final = record["hidden_state"][:, :n].to(device)
            logits = draft(input_ids, aux, steps)
            proposed = [draft.draft_to_target(step.argmax(-1)) for step in logits]
            one = tally_chains(proposed, target_top_tokens(final, head), input_ids, loss_mask)
            tally.add(one)
            tally.per_record.append((one.reached, one.accepted))
            beat()
    finally:
        draft.train(was_training)
    return tally


def accept_interval(per_record: list[tuple[list[int], list[int]]], level: float = 0.95, draws: int = 2000,
                    seed: int = 0) -> tuple[float, float] | None:
    """The `level` interval of the accept length over the held-out records (a bootstrap: records drawn
    with replacement, the figure pooled over each draw as `Tally.accept_length` pools it); None under two records.

    NOTE: over records, not positions: the chains of one record share its text, so positions are not
    independent draws and an interval over them would be too narrow."""
    import numpy as np

    if len(per_record) < 2:
        return None
    reached = np.array([r for r, _ in per_record], dtype=np.float64)
    accepted = np.array([a for _, a in per_record], dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(per_record), size=(draws, len(per_record)))
    r, a = reached[picks].sum(axis=1), accepted[picks].sum(axis=1)
    rates = np.divide(a, r, out=np.zeros_like(a), where=r > 0)
    lengths = 1.0 + np.cumprod(rates, axis=1).sum(axis=1)
    low, high = np.quantile(lengths, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
