"""`--watch` and `--follow` without a terminal (a pipe, a log file, a CI step): lines, not frames.

A table redrawn in place means nothing in a file, and rich's live view writes its frames to a
pipe only when it ends, so an hours-long run would show nothing until its end. Here each job's
change of state is one line, written and flushed as it is seen; every `summary_every` seconds a
line says where the whole run stands (its time left and the jobs per state), as the table's
last line does.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from local.views.status_data import Job, in_pipeline_order, job_name
from local.visible import visible
from remote.vocabulary.states import JobState

if TYPE_CHECKING:
    from rich.console import Console

#: Seconds between two summary lines.
SUMMARY_EVERY = 60.0
#: Shown once at the start: what a job already is, when it says more than "nothing has happened yet".
QUIET_AT_START = {JobState.WAITING.value, JobState.SUCCEEDED.value}


def follow(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float,
           until: Callable[[dict[str, Any]], bool], summary_every: float = SUMMARY_EVERY,
           clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Fetch every `interval` seconds until `until(state)` or Ctrl-C, printing each change; the last state."""
    state = fetch()
    seen = _states(state)
    _print(console, [_summary(state, f"{visible(title)}: "),
                     *(_line(job) for job in in_pipeline_order(state["jobs"]) if job["state"] not in QUIET_AT_START)])
    said_at = clock()
    try:
        while not until(state):
            time.sleep(interval)
            state = fetch()
            now = _states(state)
            changed = [job for job in in_pipeline_order(state["jobs"]) if seen.get(job_name(job)) != job["state"]]
            lines, at = [_line(job) for job in changed], clock()
            if at - said_at >= summary_every or (until(state) and changed):
                lines.append(_summary(state))
                said_at = at
            _print(console, lines)
            seen = now
    except KeyboardInterrupt:
        pass
    return state


def _states(state: dict[str, Any]) -> dict[str, str]:
    return {job_name(job): job["state"] for job in state["jobs"]}


def _line(job: Job) -> str:
    """`12:00:03 B5/infer failed: <its message>`: the job, its new state and what it says."""
    said = visible(str(job.get("message") or ""))
    if job["state"] == JobState.SUCCEEDED.value:
        said = f"{job.get('records') or 0:,} records" + (f", {job['skipped']:,} skipped" if job.get("skipped") else "")
    elif job["state"] == JobState.WAITING.value and job.get("waiting_for"):
        said = f"waits for {', '.join(job['waiting_for'])}"
    if said.startswith(job["state"] + " "):  # "blocked by B5/infer (failed)": one sentence
        return f"{time.strftime('%H:%M:%S')} {visible(job_name(job))} {said}"
    return f"{time.strftime('%H:%M:%S')} {visible(job_name(job))} {job['state']}" + (f": {said}" if said else "")


def _summary(state: dict[str, Any], where: str = "") -> str:
    from local.views.status_table import summary  # rich: the summary's words are the table's own

    return f"{time.strftime('%H:%M:%S')} {where}" + " · ".join(text.plain for text in summary(state))


def _print(console: Console, lines: list[str]) -> None:
    # NOTE: written straight to the console's file, flushed: a line that waits in a buffer is the bug
    # this module is for. Never markup: a job's message is the host's text.
    for line in lines:
        console.file.write(line + "\n")
    console.file.flush()
