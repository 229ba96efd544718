"""The concurrency autotuner against a simulated batching server, in simulated time.

The server shares its output rate among the requests in flight: ``rate(n)``
tokens/s in all for ``n`` requests, growing to a best level and falling past
it (preemption). The client keeps ``tuner.concurrency`` requests in flight, as
the infer stage does, and the tests compare the tokens/s it got with the
server's best. Deterministic: the clock is simulated and the seed fixed.
"""

from __future__ import annotations

import random
from typing import Callable

import pytest

from remote.infer.autotune import Autotuner, Fixed


def saturating(knee: int, per_request: float = 50.0, decay: float = 0.5) -> Callable[[int], float]:
    """Tokens/s in all with n in flight: linear up to `knee`, then falling as (knee / n) ** decay."""
    return lambda n: per_request * n if n <= knee else per_request * knee * (knee / n) ** decay


def simulate(tuner: Autotuner | Fixed, rate: Callable[[int], float], seconds: float, seed: int = 1,
             errors_above: int | None = None, mean_tokens: int = 400) -> tuple[float, list[tuple[float, int]]]:
    """Run the client against the server for `seconds`; the tokens/s of the last half and the level over time."""
    rng = random.Random(seed)
    now, trace, served = 0.0, [], []
    active: list[dict] = []  # each: remaining tokens, tokens, sent at, level sent at
    while now < seconds:
        while len(active) < tuner.concurrency:
            tokens = max(1, int(rng.expovariate(1 / mean_tokens)))
            active.append({"left": float(tokens), "tokens": tokens, "sent": now, "level": tuner.concurrency})
        each = rate(len(active)) / len(active)
        first = min(active, key=lambda r: r["left"])
        step = first["left"] / each
        now += step
        for request in active:
            request["left"] -= each * step
        active.remove(first)
        failed = errors_above is not None and len(active) + 1 > errors_above
        tuner.observe(first["level"], first["tokens"], now - first["sent"], error=failed)
        if not failed:
            served.append((now, first["tokens"]))
        trace.append((now, tuner.concurrency))
    late = [tokens for at, tokens in served if at >= seconds / 2]
    return sum(late) / (seconds / 2), trace


def best_rate(rate: Callable[[int], float], maximum: int) -> float:
    return max(rate(n) for n in range(1, maximum + 1))


@pytest.mark.parametrize("knee", [3, 12, 16, 20, 45, 100])
def test_auto_holds_at_least_085_of_the_servers_best_tokens_per_second(knee: int) -> None:
    rate = saturating(knee)
    got, _ = simulate(Autotuner(maximum=256), rate, seconds=3000)
    assert got >= 0.85 * best_rate(rate, 256), f"knee {knee}: {got:.0f} tok/s of {best_rate(rate, 256):.0f}"


def test_auto_beats_both_pinned_levels_either_side_of_the_knee() -> None:
    rate = saturating(16)
    auto, _ = simulate(Autotuner(maximum=256), rate, seconds=3000)
    low, _ = simulate(Fixed(4), rate, seconds=3000)
    high, _ = simulate(Fixed(64), rate, seconds=3000)
    assert auto > 1.5 * low and auto > 1.5 * high


def test_the_ramp_stops_at_max_concurrency() -> None:
    _, trace = simulate(Autotuner(maximum=24), saturating(200), seconds=2000)
    assert max(level for _, level in trace) == 24
    assert trace[-1][1] == 24


def test_a_server_that_fails_past_a_level_is_never_pushed_there_again() -> None:
    tuner = Autotuner(maximum=256)
    _, trace = simulate(tuner, saturating(200), seconds=3000, errors_above=40)
    assert tuner.ceiling <= 64
    late = [level for at, level in trace if at > 1000]
    assert late and max(late) <= 40


def test_it_reprobes_and_follows_a_server_that_got_faster_at_higher_concurrency() -> None:
    tuner = Autotuner(maximum=256, reprobe_every=3)
    simulate(tuner, saturating(16), seconds=2000)
    assert 12 <= tuner.best <= 24
    simulate(tuner, saturating(40), seconds=4000, seed=2)  # shorter prompts now: the knee moved
    assert tuner.best >= 30


def test_a_level_is_judged_only_by_requests_sent_at_that_level() -> None:
    tuner = Autotuner(maximum=64, start=8, min_window=2)
    for _ in range(8):
        tuner.observe(8, 100, 1.0)
    assert tuner.concurrency == 16
    tuner.observe(8, 1, 1000.0)  # a straggler from the old level: ignored
    assert tuner.window.answers == 0


def test_maximum_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Autotuner(maximum=0)
