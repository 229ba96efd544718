"""The status table's columns: what each cell of a job's row says (local/views/status_table.py draws them).

The last column says what the numbers do not: the error, what a job waits
for, the stage's own note, and only those metrics the note does not already
state (never `rows=2 tokens=626 kept 2 of 2 rows, 626 tokens`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from rich.text import Text

from local.views.status_data import Job, next_step
from remote.control_plane.states import JobState


STATE_STYLES = {
    JobState.WAITING: "dim",
    JobState.RUNNING: "cyan",
    JobState.STALLED: "yellow",
    JobState.SUCCEEDED: "green",
    JobState.EMPTY: "bold red",
    JobState.FAILED: "bold red",
    JobState.BLOCKED: "red",
    JobState.DIED: "bold magenta",
    JobState.STOPPED: "dim",
    JobState.BROKEN: "bold red",
}


#: Below this width the table keeps only the columns a watch needs.
WIDE = 120


#: Metrics with a short name in the note.
SHORT = {"concurrency": "c={:,}", "tokens_per_s": "{:,.0f} tok/s"}


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Job, "View"], str | Text]
    justify: str = "left"
    wide_only: bool = False
    """Shown only when the terminal is at least `WIDE` columns."""


@dataclass(frozen=True)
class View:
    """What the table needs besides the jobs: the host's clock and current release (per host, for several)."""

    now: float
    current_release: str | dict[str, str | None] | None
    errors_below: bool = False
    """Bad jobs' errors are shown in full under the table (narrow terminals), not in their cells."""

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
    if seconds < 100 * 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def skipped(job: Job, view: View) -> str:
    if job.get("more"):
        return ""
    if not job["skipped"]:
        return "0"
    reason, _ = max(job["skip_reasons"].items(), key=lambda kv: kv[1])
    return f"{job['skipped']:,} ({reason})"


def records(job: Job, view: View) -> str:
    return "" if job.get("more") else f"{job['records']:,}"


def rate(job: Job, view: View) -> str:
    seconds = elapsed(job, view)
    folded = job.get("folded")  # several stages' span: no one rate
    return f"{job['records'] / seconds:,.1f}/s" if seconds > 0 and job["records"] and not folded else "-"


def eta(job: Job, view: View) -> str:
    """Time left, where the stage said its total; a pipeline's that lacks an estimate for some job is a floor."""
    seconds = job.get("eta_s")
    if seconds is None:
        return "-"
    return ("≥" if job.get("eta_complete") is False else "") + duration(seconds)


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


def facts(job: Job) -> list[str]:
    """The job's metrics that its message does not already state; zero counters say nothing."""
    said = {n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", job.get("message") or "")}
    shown = []
    for key, value in (job.get("metrics") or {}).items():
        if not isinstance(value, (int, float)) or value == 0 or _plain(value) in said:
            continue
        if key in SHORT:
            shown.append(SHORT[key].format(value))
        else:
            shown.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value:,}")
    return shown


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def message(job: Job, view: View) -> Text:
    """The error in full for a bad job; else what it waits for, or its metrics and note, on one line;
    with the next step where the state has one (`status_data.next_step`)."""
    state = JobState(job["state"])
    if state.is_bad():
        text = error(job)
        if view.errors_below:
            return Text(text, style="red", no_wrap=True, overflow="ellipsis")
        return Text(text, style="red", overflow="fold")
    note = job.get("message") or ""
    if job.get("waiting_for"):
        needs = ", ".join(job["waiting_for"])
        text = f"waits for the GPU ({needs})" if "GPU" in note else f"waits for {needs}"
    else:
        text = " ".join([*facts(job), note]).strip()
    if job.get("out_of_date"):  # a succeeded job whose settings or inputs changed since (local/tasks/out_of_date.py)
        text = f"out of date ({job['out_of_date']}): {text}" if text else f"out of date ({job['out_of_date']})"
    step = "" if job.get("more") else next_step(job)
    return Text(f"{text}; {step}" if text and step else text or step, no_wrap=True, overflow="ellipsis")


def error(job: Job) -> str:
    """A bad job's error, and the next step where its message does not say one."""
    text = job.get("message") or f"exit {job.get('exit_code')}"
    step = next_step(job)
    return f"{text}; {step}" if step else text


def state_cell(job: Job, view: View) -> Text:
    if job.get("more"):
        return Text("")
    return Text(job["state"], style=STATE_STYLES[JobState(job["state"])])


COLUMNS = [
    Column("dataset", lambda job, view: job["dataset"]),
    Column("stage", lambda job, view: job["stage"]),
    Column("state", state_cell),
    Column("records", records, "right"),
    Column("skipped", skipped, "right", wide_only=True),
    Column("rate", rate, "right"),
    Column("elapsed", lambda job, view: duration(elapsed(job, view)) if job.get("started_at") else "-", "right",
           wide_only=True),
    Column("eta", eta, "right"),
    Column("release", release, wide_only=True),
    Column("last line / error", message),
]


HOST = Column("host", lambda job, view: job.get("host", ""))
