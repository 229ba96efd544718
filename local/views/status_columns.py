"""The status table's columns: what each cell of a job's row says (local/views/status_table.py draws them).

The counts' columns hold numbers only, so that they keep a fixed width; the
last column says what the numbers do not: the error, what a job waits for,
the stage's own note, the top reason rows were skipped, and only those metrics
the note does not already state (never `rows=2 tokens=626 kept 2 of 2 rows, 626 tokens`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from rich.text import Text

from local.views.status_data import Job, next_step
from remote.vocabulary.states import JobState


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


#: Metrics the line under the table says whole (`status_data.accept_length`), with the draft's `eval_acc_*`.
UNDER_THE_TABLE = {"accept_length", "eval_positions"}

#: Metrics with a short name in the note.
SHORT = {"concurrency": "c={:,}", "tokens_per_s": "{:,.0f} tok/s"}


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Job, "View"], str | Text]
    justify: str = "left"
    wide_only: bool = False
    """Shown only when the terminal is at least `WIDE` columns."""
    needed: Callable[[list[Job], "View"], bool] = lambda jobs, view: True
    """Shown only where it says something of these jobs."""


@dataclass(frozen=True)
class View:
    """What the table needs besides the jobs: the host's clock and current release (per host, for several)."""

    now: float
    current_release: str | dict[str, str | None] | None
    errors_below: bool = False
    """Bad jobs' errors are shown in full under the table (where they do not fit their cells), not in them."""
    one_line: bool = False
    """Every cell one line (a view refreshed in place counts its rows); else the last column wraps at words."""
    runner: str | None = None
    """The pipeline's runner's state, where the status shows one: the next step of a stopped job depends on it."""

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
    """The count alone: its top reason is the last column's (`skip_note`), which wraps."""
    return "" if job.get("more") else f"{job['skipped']:,}"


def skip_note(job: Job) -> str:
    """Why rows were skipped, the top reason ("" where none were, or the job's message already says it)."""
    reasons = job.get("skip_reasons") or {}
    if not job.get("skipped") or not reasons:
        return ""
    reason, _ = max(reasons.items(), key=lambda kv: kv[1])
    if reason in (job.get("message") or ""):
        return ""
    return f"{'most ' if len(reasons) > 1 else ''}skipped: {reason}"


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


def any_old(jobs: list[Job], view: View) -> bool:
    """Whether a job ran on a release that is not the current one (else the column would repeat one name)."""
    return any(job.get("release") and view.current_for(job) and job["release"] != view.current_for(job) for job in jobs)


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
        if not isinstance(value, (int, float)) or value == 0 or _plain(value) in said or key in UNDER_THE_TABLE \
                or key.startswith("eval_acc_"):
            continue
        if key in SHORT:
            shown.append(SHORT[key].format(value))
        else:
            shown.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value:,}")
    return shown


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def message(job: Job, view: View) -> Text:
    """The error in full for a bad job (its start, where the whole is under the table); else what it waits
    for, or its metrics and note; with the top skip reason, and the next step where the state has one
    (`status_data.next_step`). Wrapped at words, or one line where the view asks."""
    if JobState(job["state"]).is_bad():
        return Text(error(job, view.runner), style="red", **_cut(view.one_line or view.errors_below))
    note = job.get("message") or ""
    if job.get("waiting_for"):
        needs = ", ".join(job["waiting_for"])
        text = f"waits for the GPU ({needs})" if "GPU" in note else f"waits for {needs}"
    else:
        text = " ".join([*facts(job), note]).strip()
    if job.get("out_of_date"):  # a succeeded job whose settings or inputs changed since (local/tasks/out_of_date.py)
        text = f"out of date ({job['out_of_date']}): {text}" if text else f"out of date ({job['out_of_date']})"
    step = "" if job.get("more") else next_step(job, view.runner)
    return Text("; ".join(part for part in (text, skip_note(job), step) if part), **_cut(view.one_line))


def _cut(one_line: bool) -> dict[str, Any]:
    """A cell's text on one line, cut with an ellipsis; else wrapped at words."""
    return {"no_wrap": True, "overflow": "ellipsis"} if one_line else {}


def error(job: Job, runner: str | None = None) -> str:
    """A bad job's error, the top skip reason, and the next step where its message does not say one."""
    text = job.get("message") or f"exit {job.get('exit_code')}"
    return "; ".join(part for part in (text, skip_note(job), next_step(job, runner)) if part)


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
    Column("release", release, wide_only=True, needed=any_old),
    Column("last line / error", message),
]


HOST = Column("host", lambda job, view: job.get("host", ""))
