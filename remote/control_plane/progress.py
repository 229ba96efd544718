"""The progress API that a stage uses to tell the supervisor what it has done.

A stage writes its counters with::

    from remote.control_plane.progress import Progress

    with Progress.from_env() as progress:
        for row in rows:
            ...
            progress.written()               # one record kept
            progress.skipped("no assistant turn")
        progress.metrics(step=10, loss=2.31)  # any numbers worth showing
        progress.expect(83_288)              # how many records and skips there will be, when known

With a total, the progress file also carries ``rate`` (records and skips per
second over the last minute), from which `inv status` tells the time left.

The counters land in the job's progress file (``$AERIE_PROGRESS``) as JSON,
written to a temporary name and renamed, at most every ``interval`` seconds and
once more on close. The supervisor reads the final file to tell `succeeded`
from `empty`; `inv status` reads it for records, skips and rate. Outside a job
(no ``$AERIE_PROGRESS``) the counters are kept in memory only, so the same
stage code runs under `inv validate` and in tests.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, deque
from pathlib import Path

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any

PROGRESS_ENV = "AERIE_PROGRESS"
#: Seconds of progress behind `rate`: recent enough to follow a change of speed.
RATE_WINDOW = 60.0


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON to a temporary name beside `path`, then rename it into place. A failed write (a full
    disk) leaves no torn temporary behind and raises an `OSError` that names `path`, so that whoever
    ends on it can say what could not be written (`remote.control_plane.disk.failed_write`)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if exc.filename is None or Path(exc.filename) == tmp:
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def read_json(path: Path, default: Any = None) -> Any:
    """Read a JSON file written by `write_json_atomic`; `default` when absent or torn."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def count_lines(path: Path | None) -> int:
    """A JSONL file's records, its non-empty lines (what a stage expects to write, one per record it
    reads); 0 where there is no file."""
    if path is None or not path.is_file():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def read_mapping(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; empty when absent, torn, unreadable or not an object (a reader that must go on)."""
    try:
        value = read_json(path, {})
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class Progress:
    """Counters of one stage run: records written, records skipped by reason, metrics."""

    def __init__(self, path: Path | None = None, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self.records = 0
        self.skip_reasons: Counter[str] = Counter()
        self.values: dict[str, float] = {}
        self.message = ""
        self.total: int | None = None
        self.total_by: str | None = None
        self.eta: tuple[float, float] | None = None  # (seconds left, when said): a stage's own estimate
        self._flushed_at = 0.0
        self._marks: deque[tuple[float, int]] = deque()  # (when, done) at each flush

    @classmethod
    def from_env(cls, interval: float = 1.0) -> "Progress":
        path = os.environ.get(PROGRESS_ENV)
        return cls(Path(path) if path else None, interval)

    def written(self, n: int = 1) -> None:
        self.records += n
        self._maybe_flush()

    def skipped(self, reason: str, n: int = 1) -> None:
        self.skip_reasons[reason] += n
        self._maybe_flush()

    def metrics(self, **values: float) -> None:
        """Numbers to show beside the counts (step, loss, accuracy, ...)."""
        self.values.update(values)
        self._maybe_flush()

    def note(self, message: str) -> None:
        """A short line for the status table, such as the phase the stage is in."""
        self.message = message
        self._maybe_flush()

    def expect(self, total: int, by: str | None = None) -> None:
        """How many records and skips this run will count in all (prompts, rows); with `by`, what
        that metric will reach instead (train: ``by="step"``, steps x epochs)."""
        self.total, self.total_by = total, by
        self._maybe_flush()

    def estimate(self, seconds: float) -> None:
        """Seconds left by the stage's own reckoning, for a stage whose phases run at different speeds
        (the chunked route: extract and train); `inv status` prefers it to total / rate."""
        self.eta = (seconds, time.time())
        self._maybe_flush()

    @property
    def done(self) -> float:
        """How far towards `total`."""
        return self.values.get(self.total_by, 0) if self.total_by else self.records + sum(self.skip_reasons.values())

    def resumed(self) -> None:
        """What was counted so far was done by an earlier run: it does not count towards the rate."""
        self._marks.clear()

    def beat(self) -> None:
        """Say "still working" during a long step that counts nothing, so the job is not `stalled`."""
        self._maybe_flush()

    def snapshot(self) -> dict[str, Any]:
        snapshot = {
            "records": self.records,
            "skip_reasons": dict(self.skip_reasons),
            "metrics": self.values,
            "message": self.message,
            "updated_at": time.time(),
        }
        if self.total is not None:
            snapshot.update(total=self.total, done=self.done, rate=self.rate())
        if self.eta is not None:
            snapshot.update(eta_s=round(self.eta[0], 1), eta_at=self.eta[1])
        return snapshot

    def rate(self) -> float | None:
        """`done` per second over the last `RATE_WINDOW` seconds; None before there is a span."""
        now, done = time.monotonic(), self.done
        if not self._marks or self._marks[-1][1] != done:
            self._marks.append((now, done))
        while len(self._marks) > 2 and self._marks[1][0] < now - RATE_WINDOW:
            self._marks.popleft()
        (then, before), span = self._marks[0], now - self._marks[0][0]
        return round((done - before) / span, 4) if span >= 1.0 and done > before else None

    def flush(self) -> None:
        self._flushed_at = time.monotonic()
        snapshot = self.snapshot()  # also without a file: it marks the progress behind `rate`
        if self.path is not None:
            write_json_atomic(self.path, snapshot)

    def _maybe_flush(self) -> None:
        if time.monotonic() - self._flushed_at >= self.interval:
            self.flush()

    def __enter__(self) -> "Progress":
        self.flush()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            self.flush()
        except OSError:
            if kind is None:
                raise
            # NOTE: what ended the stage is what it must say; a last count a full disk refused is not.
