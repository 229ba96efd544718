"""`stages.infer.concurrency: auto`: find and hold the concurrency that maximises output tokens/s.

A batching server (SGLang, vLLM) gets faster overall as more requests share a
batch, up to a point; past it, it preempts and every request slows down. The
best concurrency depends on the GPUs, the model and the mix of prompts, so it
is measured, not configured.

How it measures: each answered request brings its completion tokens and its
latency. While ``c`` requests are in flight, the server's output rate is
``c * sum(tokens) / sum(latency)`` (Little's law), counted over the requests
sent at that level only, so requests still running from an earlier level do
not blur the reading. A window at one level ends after ``max(min_window, c)``
answers: about one round of the slowest requests at that level.

How it moves:

- ``ramp``: double while a window's rate beats the last one by ``gain``.
- ``refine``: when doubling stopped paying, try halfway up (1.5x) and a quarter
  down (0.75x) once each; keep what beats the best by ``gain`` too.
- ``hold``: stay at the best level, measuring it again each window; after
  ``reprobe_every`` windows try 1.25x and 0.8x again, since the mix of prompts
  drifts over hours.
- Errors (failed requests, retries) in more than ``max_error_ratio`` of a
  window's requests mean the level is too high: step down to 0.7x of it, and
  never ramp past it again.

Standard library only, and no clock or threads of its own: the caller says
what happened and when, so the unit tests drive it with a simulated server.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Window:
    """What the requests sent at one concurrency level brought back."""

    level: int
    answers: int = 0
    errors: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def rate(self) -> float:
        """Output tokens/s the server gave at this level (Little's law)."""
        return self.level * self.tokens / self.seconds if self.seconds > 0 else 0.0

    def error_ratio(self) -> float:
        return self.errors / max(1, self.answers + self.errors)


@dataclass
class Autotuner:
    """Chooses how many requests to keep in flight; `observe` each finished request."""

    #: The most requests in flight at once (``stages.infer.max_concurrency``).
    maximum: int
    #: Where the ramp starts.
    start: int = 8
    #: Relative improvement a higher level must show to be worth its latency.
    gain: float = 0.05
    #: Answers a window needs at least (more at high levels: one per slot).
    min_window: int = 8
    #: Hold windows between two re-probes.
    reprobe_every: int = 10
    #: Share of errored requests in a window that marks its level as too high.
    max_error_ratio: float = 0.1

    phase: str = field(default="ramp", init=False)
    concurrency: int = field(default=0, init=False)
    best: int = field(default=0, init=False)
    #: Latest rate measured at each level.
    rates: dict[int, float] = field(default_factory=dict, init=False)
    #: A level that errored: nothing at or above it is tried again.
    ceiling: int = field(default=0, init=False)
    window: Window = field(init=False)
    _probes: list[int] = field(default_factory=list, init=False)
    _held: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.maximum < 1:
            raise ValueError(f"maximum concurrency must be at least 1 (got {self.maximum})")
        self.ceiling = self.maximum + 1
        self.best = self.concurrency = max(1, min(self.start, self.maximum))
        self.window = Window(self.concurrency)

    def observe(self, level: int, tokens: int, seconds: float, error: bool = False) -> None:
        """A request sent while `level` was the concurrency finished: its tokens and latency, or an error."""
        if level != self.window.level:
            return  # sent before the last change: it ran under another load
        if error:
            self.window.errors += 1
        else:
            self.window.answers += 1
            self.window.tokens += tokens
            self.window.seconds += seconds
        if self.window.answers + self.window.errors >= max(self.min_window, level):
            self._decide(self.window)

    def _decide(self, window: Window) -> None:
        level = window.level
        if window.error_ratio() > self.max_error_ratio:
            self.ceiling = min(self.ceiling, level)
            self.rates.pop(level, None)
            self.best = min(self.best, max(1, int(level * 0.7)))
            self._probes = []
            self._go("hold", self.best)
            return
        self.rates[level] = rate = window.rate()
        if self.phase == "ramp":
            if level == self.best or rate > self.rates.get(self.best, 0.0) * (1 + self.gain):
                self.best = level
                higher = min(level * 2, self.maximum, self.ceiling - 1)
                if higher > level:
                    self._go("ramp", higher)
                    return
            self._probes = self._around(self.best, 1.5, 0.75)
            self._next_probe()
        elif self.phase == "probe":
            if rate > self.rates.get(self.best, 0.0) * (1 + self.gain):
                self.best = level
            self._next_probe()
        else:  # hold: the best level, measured afresh
            self._held += 1
            if self._held >= self.reprobe_every:
                self._probes = self._around(self.best, 1.25, 0.8)
                self._next_probe()
            else:
                self._go("hold", self.best)

    def _around(self, level: int, up: float, down: float) -> list[int]:
        """Levels to try around `level`, within bounds, not `level` itself."""
        tries = [min(round(level * up), self.maximum, self.ceiling - 1), max(1, round(level * down))]
        return [t for t in dict.fromkeys(tries) if t != level]

    def _next_probe(self) -> None:
        if self._probes:
            self._go("probe", self._probes.pop(0))
        else:
            self._held = 0
            self._go("hold", self.best)

    def _go(self, phase: str, level: int) -> None:
        self.phase = phase
        self.concurrency = level
        self.window = Window(level)


class Fixed:
    """A pinned concurrency (``stages.infer.concurrency: N``): the same interface, never moves."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.phase = "pinned"

    def observe(self, level: int, tokens: int, seconds: float, error: bool = False) -> None:
        pass
