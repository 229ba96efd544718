"""Two commands timed in turn, pair by pair: what every as-typed figure of `inv bench` is made of.

A machine shared with others drifts in speed during a run. Two commands timed one right after the
other see nearly the same machine, so the ratio of each pair moves far less than either time does;
the median of those ratios is the figure, their min and max how far one pair can stray.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def _nothing() -> None:
    pass


Clock = Callable[[], float]


def seconds(action: Callable[[], object], clock: Clock = time.perf_counter) -> float:
    started = clock()
    action()
    return clock() - started


def median_seconds(action: Callable[[], object], repeat: int) -> float:
    return statistics.median(seconds(action) for _ in range(repeat))


def paired(action: Callable[[], object], baseline: Callable[[], object], repeat: int,
           before: Callable[[], object] = _nothing, between: Callable[[], object] = _nothing,
           clock: Clock = time.perf_counter) -> dict[str, float]:
    """B and A in turn (B A B A ...), the ratio A/B taken pair by pair and its median quoted.

    `before` runs untimed ahead of each pair, `between` untimed between B and A. The baseline goes
    first, so that what A leaves running (a launch's 40 jobs) never slows it; `between` is where to
    wait for what B left running.
    """
    a_times, b_times = [], []
    for _ in range(repeat):
        before()
        b_times.append(seconds(baseline, clock))
        between()
        a_times.append(seconds(action, clock))
    ratios = [a / b for a, b in zip(a_times, b_times)]
    return {"seconds": statistics.median(a_times), "baseline_seconds": statistics.median(b_times),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def against_ref(this: Callable[[], object], ref: Callable[[], object], repeat: int,
                ready: Callable[[], object] = _nothing, clock: Clock = time.perf_counter) -> dict[str, float]:
    """A command in this checkout against the same command in the checkout of REF, paired (REF first).

    `ready` runs untimed ahead of each side alike (both sides' jobs ended, no connection open), so
    neither finds what the other left behind. The ratio is this/REF: above 1, this checkout is slower.
    """
    figures = paired(this, ref, repeat, before=ready, between=ready, clock=clock)
    return {"seconds": figures["seconds"], "ref_seconds": figures["baseline_seconds"], "ratio": figures["ratio"],
            "ratio_min": figures["ratio_min"], "ratio_max": figures["ratio_max"]}
