"""Two commands timed in turn, pair by pair: what every as-typed figure of `inv bench` is made of.

A machine shared with others drifts in speed during a run. Two commands timed one right after the
other see nearly the same machine, so the ratio of each pair moves far less than either time does;
the median of those ratios is the figure, their min and max how far one pair can stray. Where many
share the machine even a pair's wall time strays: the CPU time each side used (`meters`), which
waiting for a core does not add to, is then the steadier figure.
"""

from __future__ import annotations

import resource
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


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have ended: a command run here, whole."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _ratios(prefix: str, a: list[float], b: list[float]) -> dict[str, float]:
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    if not ratios:
        return {}
    return {f"{prefix}ratio": statistics.median(ratios), f"{prefix}ratio_min": min(ratios),
            f"{prefix}ratio_max": max(ratios)}


def median_seconds(action: Callable[[], object], repeat: int) -> float:
    return statistics.median(seconds(action) for _ in range(repeat))


def paired(action: Callable[[], object], baseline: Callable[[], object], repeat: int,
           before: Callable[[], object] = _nothing, between: Callable[[], object] = _nothing,
           clock: Clock = time.perf_counter, meters: dict[str, Clock] | None = None) -> dict[str, float]:
    """B and A in turn (B A B A ...), the ratio A/B taken pair by pair and its median quoted.

    `before` runs untimed ahead of each pair, `between` untimed between B and A. The baseline goes
    first, so that what A leaves running (a launch's 40 jobs) never slows it; `between` is where to
    wait for what B left running. Each of `meters` (a name and a running total, e.g. CPU seconds) is
    read around each side too, outside the wall clock's reading: its ratios come as NAME_ratio.
    """
    meters = meters or {}
    a_times, b_times = [], []
    a_used: dict[str, list[float]] = {name: [] for name in meters}
    b_used: dict[str, list[float]] = {name: [] for name in meters}
    for _ in range(repeat):
        before()
        b_times.append(_run(baseline, clock, meters, b_used))
        between()
        a_times.append(_run(action, clock, meters, a_used))
    figures = {"seconds": statistics.median(a_times), "baseline_seconds": statistics.median(b_times),
               **_ratios("", a_times, b_times)}
    for name in meters:
        figures |= _ratios(f"{name}_", a_used[name], b_used[name])
    return figures


def _run(action: Callable[[], object], clock: Clock, meters: dict[str, Clock], used: dict[str, list[float]]) -> float:
    """`action`'s wall seconds; what each meter counted meanwhile appended to `used`."""
    start = {name: meter() for name, meter in meters.items()}
    wall = seconds(action, clock)
    for name, meter in meters.items():
        used[name].append(meter() - start[name])
    return wall


def against_ref(this: Callable[[], object], ref: Callable[[], object], repeat: int,
                ready: Callable[[], object] = _nothing, clock: Clock = time.perf_counter,
                meters: dict[str, Clock] | None = None) -> dict[str, float]:
    """A command in this checkout against the same command in the checkout of REF, paired (REF first).

    `ready` runs untimed ahead of each side alike (both sides' jobs ended, no connection open), so
    neither finds what the other left behind. The ratios are this/REF: above 1, this checkout is slower.
    """
    figures = paired(this, ref, repeat, before=ready, between=ready, clock=clock, meters=meters)
    figures["ref_seconds"] = figures.pop("baseline_seconds")
    return figures
