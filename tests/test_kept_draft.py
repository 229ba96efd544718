"""Which epoch's draft is kept (`remote.eagle3.kept`) and the held-out figure's spread (`accept_interval`)."""

from __future__ import annotations

import pytest

from remote.eagle3 import kept
from remote.eagle3.acceptance import Tally, accept_interval
from remote.eagle3.epochs import EpochRecord


def epoch(number: int, accept: float | None, interval: tuple[float, float] | None = None) -> EpochRecord:
    return EpochRecord(number, None if number == 0 else 0.5, accept, interval=list(interval) if interval else None)


def test_the_best_epoch_is_kept_and_of_two_equal_the_later() -> None:
    epochs = [epoch(0, 1.0), epoch(1, 3.2), epoch(2, 3.5), epoch(3, 3.5), epoch(4, 3.1)]

    assert kept.best(epochs).epoch == 3
    assert kept.is_best(epochs[3], epochs[:4]) and not kept.is_best(epochs[4], epochs)


def test_the_reason_names_the_kept_epoch_the_last_and_whether_they_are_within_noise() -> None:
    close = [epoch(0, 1.0, (1.0, 1.0)), epoch(1, 3.5, (3.3, 3.7)), epoch(2, 3.4, (3.2, 3.6))]
    apart = [epoch(0, 1.0, (1.0, 1.0)), epoch(1, 3.5, (3.4, 3.6)), epoch(2, 2.9, (2.8, 3.0))]

    assert kept.reason(close) == ("kept epoch 1's draft: best held-out accept length 3.50 [3.30, 3.70]; "
                                  "last/ is epoch 2, 3.40 [3.20, 3.60], within noise")
    assert kept.reason(apart).endswith("last/ is epoch 2, 2.90 [2.80, 3.00]")
    assert kept.manifest(apart) == {"kept_epoch": 1, "kept_reason": kept.reason(apart), "last_epoch": 2,
                                    "accept_length": 3.5, "accept_interval": [3.4, 3.6], "eval_accuracies": [],
                                    "last_accept_length": 2.9}


def test_a_start_no_epoch_beats_is_kept_and_said_so() -> None:
    epochs = [epoch(0, 3.77, (3.6, 3.9)), epoch(1, 3.15, (3.0, 3.3))]

    assert kept.best(epochs).epoch == 0
    assert kept.reason(epochs).startswith("kept epoch 0's draft (the one training started from), accept length 3.77")
    assert "every epoch measured below it (last, epoch 1: 3.15 [3.00, 3.30])" in kept.reason(epochs)


def test_without_held_out_records_the_last_epoch_is_kept() -> None:
    epochs = [epoch(1, None), epoch(2, None)]

    assert kept.best(epochs) is None and kept.is_best(epochs[-1], epochs)
    assert kept.manifest(epochs)["kept_epoch"] == 2
    assert kept.reason(epochs) == "kept the last epoch's draft: no held-out records to choose by"


def records(rates: list[float], count: int, positions: int = 40) -> list[tuple[list[int], list[int]]]:
    """`count` records of `positions` chains each, every step accepted at about `rates` (varied per record)."""
    import random

    rng, out = random.Random(0), []
    for _ in range(count):
        reached, accepted, alive = [], [], positions
        for rate in rates:
            hit = sum(1 for _ in range(alive) if rng.random() < rate)
            reached.append(alive)
            accepted.append(hit)
            alive = hit
        out.append((reached, accepted))
    return out


def test_the_interval_holds_the_pooled_figure_and_narrows_with_more_records() -> None:
    few, many = records([0.9, 0.8, 0.7], 8), records([0.9, 0.8, 0.7], 200)
    pooled = Tally(3)
    for reached, accepted in many:
        pooled.add(Tally(3, reached=reached, accepted=accepted, valid=reached, hits=accepted))

    low, high = accept_interval(many)
    few_low, few_high = accept_interval(few)

    assert low <= pooled.accept_length <= high
    assert high - low < (few_high - few_low) / 2  # 25 times the records: about a fifth of the width
    assert accept_interval(many[:1]) is None
    assert accept_interval(many) == accept_interval(many)  # the same draws: figures a rerun repeats


def test_two_figures_are_within_noise_when_their_intervals_overlap() -> None:
    assert epoch(1, 3.5, (3.3, 3.7)).within_noise(epoch(2, 3.6, (3.55, 3.8)))
    assert not epoch(1, 3.5, (3.4, 3.6)).within_noise(epoch(2, 3.8, (3.7, 3.9)))
    assert epoch(1, 3.5).within_noise(epoch(2, 3.5)) and not epoch(1, 3.5).within_noise(epoch(2, 3.6))
    assert epoch(1, 3.51, (3.3, 3.7)).figure() == "3.51 [3.30, 3.70]"
