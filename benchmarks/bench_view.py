"""The watch view (`inv status --watch`, `inv run --follow`, `inv demo`) drawn for many bad jobs.

One frame at 80x24, as `local.views.live.refresh` draws it, for 20 to 1,000 `empty` jobs: all
failed alike (one bug in every dataset: their errors differ only in counts, so they fold into
one row) and each with an error of its own (they cannot fold: the rows that do not fit become
one "... N more" row). The baseline is a plain rich table of one screenful (22 rows) drawn on
the same console: what any frame has to cost. Before the view counted rows (issue 22) it drew
every candidate layout to measure it: 0.17, 0.59, 2.6 and 12.3 s for 20, 40, 80 and 160 bad
jobs, and no frame in 100 s for 1,000.
"""

from __future__ import annotations

import io
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from benchmarks.harness.pairing import median_seconds
from local.views import status_table

COUNTS = (20, 40, 80, 160, 1000)
NOW = 1_000_000.0


def bad_status(count: int, alike: bool) -> dict[str, Any]:
    jobs = []
    for i in range(count):
        keys = "id, text" if alike else "".join(chr(97 + int(d)) for d in str(i))  # keys of its own, no digits
        jobs.append({"dataset": f"D{i:04d}", "stage": "prep", "state": "empty", "records": 0, "skipped": i + 1,
                     "skip_reasons": {f"no conversations field (keys: {keys})": i + 1}, "metrics": {},
                     "exit_code": 0, "release": "20261201-101010-aaaa1111", "started_at": NOW - 60, "ended_at": NOW,
                     "message": f"exit 0 with zero records: no conversations field (keys: {keys}) ×{i + 1}"})
    return {"now": NOW, "current_release": "20261201-101010-aaaa1111", "jobs": jobs}


def frame(status: dict[str, Any]) -> Callable[[], int]:
    def draw() -> int:
        console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True, color_system="truecolor")
        console.print(status_table.render(status, title="gpu:/root/eagle3-train", fit=True))
        return len(console.file.getvalue().splitlines())  # type: ignore[attr-defined]
    return draw


def screenful() -> int:
    console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True, color_system="truecolor")
    table = Table()
    for header in ("dataset", "stage", "state", "records", "rate", "eta", "last line / error"):
        table.add_column(header, no_wrap=True)
    for i in range(22):
        table.add_row(f"D{i:04d}", "prep", "empty", "0", "-", "-", "exit 0 with zero records: no conversations field")
    console.print(table)
    return 0


def run(repeat: int = 5) -> dict[str, Any]:
    baseline = median_seconds(screenful, repeat)
    figures: dict[str, Any] = {"screenful_table_s": round(baseline, 4)}
    for alike in (True, False):
        for count in COUNTS:
            status = bad_status(count, alike)
            draw = frame(status)
            lines = draw()
            seconds = median_seconds(draw, repeat)
            figures[f"{'alike' if alike else 'distinct'}_{count}"] = {
                "seconds": round(seconds, 4), "x_screenful": round(seconds / baseline, 2), "lines": lines}
    return figures


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
