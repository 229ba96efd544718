"""The offline acceptance estimator on chains whose answer is known."""

from __future__ import annotations

import pytest
import torch

from remote.eagle3.acceptance import Tally, tally_chains

VOCAB = 1000


def greedy_record(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A record the target wrote greedily: x[t+1] is the target's top token at t."""
    generator = torch.Generator().manual_seed(seed)
    top = torch.randint(0, VOCAB, (1, length), generator=generator)
    ids = torch.cat([torch.randint(0, VOCAB, (1, 1), generator=generator), top[:, :-1]], dim=1)
    return ids, top


def perfect_draft(top: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Step k at t proposes exactly the target's token, top(t+k+1)."""
    return [torch.cat([top[:, k + 1:], torch.zeros_like(top[:, : k + 1])], dim=1) for k in range(steps)]


@pytest.mark.parametrize("steps", [1, 3, 7])
def test_a_draft_that_reproduces_the_target_is_accepted_whole_plus_the_bonus_token(steps: int) -> None:
    ids, top = greedy_record(200)
    mask = torch.ones_like(ids)

    tally = tally_chains(perfect_draft(top, steps), top, ids, mask)

    assert tally.accept_length == steps + 1
    assert tally.accuracies == [1.0] * steps
    assert tally.positions == 200 - 2  # every start whose first proposal lies inside the record


def test_a_random_draft_is_about_useless() -> None:
    ids, top = greedy_record(4000)
    guesses = [torch.randint(0, VOCAB, top.shape, generator=torch.Generator().manual_seed(k + 7)) for k in range(3)]

    tally = tally_chains(guesses, top, ids, torch.ones_like(ids))

    assert 1.0 <= tally.accept_length < 1.01
    assert all(a < 0.01 for a in tally.accuracies)


def test_a_draft_right_at_every_other_first_step_accepts_half_a_token_more() -> None:
    ids, top = greedy_record(101)
    draft = perfect_draft(top, 2)
    draft[0][:, 1::2] = -1  # wrong at odd starts
    draft[1][:, :] = -1  # never right at the second step

    tally = tally_chains(draft, top, ids, torch.ones_like(ids))

    assert tally.reached[0] == 99 and tally.accepted[0] == 50
    assert tally.accept_length == pytest.approx(1 + 50 / 99)
    assert tally.accuracies == [pytest.approx(50 / 99), 0.0]


def test_positions_outside_the_trained_turns_do_not_count() -> None:
    ids, top = greedy_record(60)
    mask = torch.zeros_like(ids)
    mask[:, 30:] = 1  # the prompt is not trained on: chains whose proposal lies in it are not counted
    draft = perfect_draft(top, 2)
    draft[0][:, :20] = -1  # wrong only where nothing counts

    tally = tally_chains(draft, top, ids, mask)

    assert tally.accept_length == 3.0
    assert tally.valid[0] == 30 and tally.reached[0] == 30


def test_a_chain_is_followed_only_while_the_record_stays_on_the_target_s_greedy_path() -> None:
    ids, top = greedy_record(50)
    ids[:, 10::3] = (ids[:, 10::3] + 1) % VOCAB  # text the target did not write: sampled, or a human's
    draft = perfect_draft(top, 3)

    tally = tally_chains(draft, top, ids, torch.ones_like(ids))

    # Every replayable step is accepted: leaving the path cuts chains short, it does not reject them.
    assert tally.accept_length == 4.0
    assert tally.reached[2] < tally.reached[1] < tally.reached[0]


def test_tallies_of_batches_add_up_to_the_tally_of_all() -> None:
    ids, top = greedy_record(120)
    draft = perfect_draft(top, 3)
    draft[1][:, ::4] = -1
    whole = tally_chains(draft, top, ids, torch.ones_like(ids))
    first = tally_chains([d[:, :60] for d in draft], top[:, :60], ids[:, :60], torch.ones(1, 60, dtype=torch.long))
    second = tally_chains([d[:, 60:] for d in draft], top[:, 60:], ids[:, 60:], torch.ones(1, 60, dtype=torch.long))

    summed = Tally(3)
    summed.add(first)
    summed.add(second)

    assert summed.accepted[0] == first.accepted[0] + second.accepted[0]
    assert 1.0 < summed.accept_length < 4.0 and 1.0 < whole.accept_length < 4.0
    assert Tally(3).accept_length == 1.0  # nothing measured: no claim that the draft helps
