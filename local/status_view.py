"""The `inv status` table: one row per job, built from a list of columns."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.table import Table
from rich.text import Text

from remote.states import JobState

STATE_STYLES = {
    JobState.WAITING: "dim",
    JobState.RUNNING: "cyan",
    JobState.STALLED: "yellow",
    JobState.SUCCEEDED: "green",
    JobState.EMPTY: "bold red",
    JobState.FAILED: "bold red",
    JobState.DIED: "bold magenta",
    JobState.STOPPED: "dim",
    JobState.BROKEN: "bold red",
}

Job = dict[str, Any]


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Job, "View"], str | Text]
    justify: str = "left"


@dataclass(frozen=True)
class View:
    """What the table needs besides the jobs: the host's clock and current release (per host, for several)."""

    now: float
    current_release: str | dict[str, str | None] | None

    def current_for(self, job: Job) -> str | None:
        if isinstance(self.current_release, dict):
            return self.current_release.get(job.get("host", ""))
        return self.current_release


def elapsed(job: Job, view: View) -> float:
    started = job.get("started_at")
    return ((job.get("ended_at") or view.now) - started) if started else 0.0


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def skipped(job: Job, view: View) -> str:
    if not job["skipped"]:
        return "0"
    reason, _ = max(job["skip_reasons"].items(), key=lambda kv: kv[1])
    return f"{job['skipped']:,} ({reason})"


def rate(job: Job, view: View) -> str:
    seconds = elapsed(job, view)
    return f"{job['records'] / seconds:,.1f}/s" if seconds > 0 and job["records"] else "-"


def release(job: Job, view: View) -> Text:
    """The release's content digest (its id's last part), marked when it is not the current one."""
    name = job.get("release")
    if not name:
        return Text("-")
    short = name.rsplit("-", 1)[-1]
    current = view.current_for(job)
    if current and name != current:
        return Text(f"{short} (old)", style="yellow")
    return Text(short)


def message(job: Job, view: View) -> Text:
    metrics = job.get("metrics") or {}
    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
    text = job.get("message") or ""
    if job.get("waiting_for"):
        text = "waits for " + ", ".join(job["waiting_for"])
    bad = JobState(job["state"]).is_bad()
    return Text(" ".join(part for part in (shown, text) if part), style="red" if bad else "")


COLUMNS = [
    Column("dataset", lambda job, view: job["dataset"]),
    Column("stage", lambda job, view: job["stage"]),
    Column("state", lambda job, view: Text(job["state"], style=STATE_STYLES[JobState(job["state"])])),
    Column("records", lambda job, view: f"{job['records']:,}", "right"),
    Column("skipped", skipped, "right"),
    Column("rate", rate, "right"),
    Column("elapsed", lambda job, view: duration(elapsed(job, view)) if job.get("started_at") else "-", "right"),
    Column("release", release),
    Column("last line / error", message),
]


HOST = Column("host", lambda job, view: job.get("host", ""))
UNREACHABLE = "unreachable"


def render(status: dict[str, Any], title: str | None = None) -> Table | Text:
    """The table; with several hosts, a host column and a row for each host that did not answer."""
    unreachable = status.get("unreachable", [])
    if not status["jobs"] and not unreachable:
        return Text("No jobs yet.")
    view = View(now=status.get("now") or time.time(), current_release=status.get("current_release"))
    columns = [HOST, *COLUMNS] if isinstance(view.current_release, dict) else COLUMNS
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column.header, justify=column.justify, overflow="fold" if column.header.startswith("last") else "ellipsis")  # type: ignore[arg-type]
    for job in status["jobs"]:
        table.add_row(*(column.cell(job, view) for column in columns))
    for host in unreachable:
        blank = [""] * (len(columns) - 3)
        table.add_row(host["host"], "*", Text(UNREACHABLE, "bold red"), *blank[:-1], Text(host["message"], "red"))
    return table


def any_bad(status: dict[str, Any]) -> bool:
    return bool(status.get("unreachable")) or any(JobState(job["state"]).is_bad() for job in status["jobs"])


JSON_KEYS = ("host", "dataset", "stage", "state", "records", "skipped", "skip_reasons", "exit_code", "release",
             "started_at", "ended_at", "message", "metrics", "waiting_for", "blocked_by", "signal", "slurm_job_id", "slurm_state",
             "node")


#: Keys shown only where they apply: several hosts, the Slurm backend.
OPTIONAL_KEYS = {"host", "slurm_job_id", "slurm_state", "node"}


def as_json(status: dict[str, Any]) -> list[dict[str, Any]]:
    jobs = [{key: job.get(key) for key in JSON_KEYS if key in job or key not in OPTIONAL_KEYS} for job in status["jobs"]]
    return jobs + [{"host": h["host"], "state": UNREACHABLE, "message": h["message"]} for h in status.get("unreachable", [])]
