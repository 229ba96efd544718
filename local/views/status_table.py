"""The `inv status` view: a table of jobs, the host's GPUs, and a summary line.

Two shapes of one view:

- printed once (`inv status`): one row per job, every column that fits;
- refreshed in place (`--watch`, `inv run --follow`): it fits the terminal.
  Every row is one line, and the fit is decided by counting rows, never by
  drawing a layout to measure it. Rows are grouped per dataset: a dataset whose
  stages all succeeded is one row, its waiting stages are one row, and its
  succeeded stages are folded into the counts; bad jobs of one stage and state
  whose errors differ only in numbers (the bug that breaks every dataset) are
  one row with a count. Each bad row's error is shown in full under the table.
  When that is still too tall, finished and waiting datasets fold into one row
  each, then running rows give way to an "... N more" row, then the full
  errors, and last the bad rows themselves.

The last column says what the numbers do not: the error, what a job waits
for, the stage's own note, and only those metrics the note does not already
state (never `rows=2 tokens=626 kept 2 of 2 rows, 626 tokens`).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from local.views.status_data import UNREACHABLE, Job, in_pipeline_order, next_step
from local.visible import visible, visible_all
from remote.control_plane.states import RUNNER_STAGE, JobState

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


def render(status: dict[str, Any], title: str | None = None, fit: bool = False) -> RenderableType:
    """The view; `fit`: grouped and folded to the terminal's height (for a view refreshed in place)."""
    if not status["jobs"] and not status.get("unreachable"):
        return Text("No jobs yet.")
    return StatusView(status, title, fit)


class StatusView:
    """Sized at render time, from the console it is drawn on."""

    def __init__(self, status: dict[str, Any], title: str | None, fit: bool) -> None:
        shown = visible_all(status)  # every string the host sent, shown and never obeyed
        self.status = {**shown, "jobs": in_pipeline_order(shown["jobs"])}
        self.title = visible(title) if title else title
        self.fit = fit
        self.view = View(now=status.get("now") or time.time(), current_release=status.get("current_release"))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        multi = isinstance(self.view.current_release, dict)
        wide = options.max_width >= WIDE
        columns = [c for c in ([HOST, *COLUMNS] if multi else COLUMNS) if wide or not c.wide_only]
        tail = [*gpu_lines(self.status.get("gpus") or []), *summary(self.status, options.max_width)]
        if not self.fit:
            yield self.table(columns, replace(self.view, errors_below=not wide), self.status["jobs"], boxed=True)
            yield from [*(errors(self.status["jobs"]) if not wide else []), *tail]
            return
        if self.title:
            yield Text(self.title, no_wrap=True, overflow="ellipsis", style="bold")
        room = (options.height or options.size.height) - (1 if self.title else 0) - self.lines(console, options, *tail)
        rows, below = self.fitted(room, lambda text: len(text.wrap(console, options.max_width)))
        yield self.table(columns, replace(self.view, errors_below=True), rows, one_line=True)
        yield from [*below, *tail]

    @staticmethod
    def lines(console: Console, options: ConsoleOptions, *renderables: RenderableType) -> int:
        return sum(len(console.render_lines(r, options.update(height=None), pad=False)) for r in renderables)

    def fitted(self, room: int, height: Callable[[Text], int]) -> tuple[list[Job], list[Text]]:
        """The rows and the error lines under them that fill at most `room` lines, counted, not drawn:
        every row of the watched table is one line, under a header of two.

        Less and less is shown until it fits: finished datasets fold into one row, then waiting ones;
        then the running rows give way to a row that counts them; then the full errors (each bad row
        still starts its own); then the bad rows themselves (`inv status` lists every job).
        """
        jobs, left = self.status["jobs"], room - 2 - len(self.status.get("unreachable", []))
        kinds = Kinds.of(jobs)
        bad = kinds.bad
        below = errors(bad[:max(left, 0) + 1])  # more than fit are never measured: one line each at least
        for level in range(3):
            rows = kinds.at(level)
            if len(rows) + _total(below, height, left) <= left and len(below) == len(bad):
                return rows, below
        rest = rows[len(bad):]
        if len(bad) + 1 > left:  # not even the bad rows: as many as fit, and one row for the others
            keep = bad[:max(left - 1, 0)]
            return keep + [_more(jobs, keep)], []
        shown = _fill(below, len(bad), height, left - len(bad) - 1)
        left -= len(bad) + 1 + sum(height(line) for line in shown)
        return bad + rest[:left] + ([_more(jobs, bad + rest[:left])] if rest[left:] else []), shown

    def table(self, columns: list[Column], view: View, jobs: Iterable[Job], boxed: bool = False,
              one_line: bool = False) -> Table:
        if boxed:
            table = Table(title=self.title, title_justify="left")
        else:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        rows = [[_text(column.cell(job, view)) for column in columns] for job in jobs]
        for host in self.status.get("unreachable", []):
            blank = [""] * (len(columns) - 3)
            rows.append([_text(cell) for cell in (host["host"], "*", Text(UNREACHABLE, "bold red"), *blank[:-1],
                                                  Text(host["message"], "red", no_wrap=one_line,
                                                       overflow="ellipsis" if one_line else None))])
        for index, column in enumerate(columns):
            wraps = column.header == COLUMNS[-1].header  # its cells are one line where `one_line` asks
            # NOTE: a one-line cell that never wraps is as wide as its text: given here, rich skips
            # measuring every cell of the column, a fifth of drawing 40 rows. It still narrows the
            # column to fit the terminal.
            width = None if wraps else max(cell_len(text) for text in [column.header, *(r[index].plain for r in rows)])
            header = Text(column.header, no_wrap=one_line, overflow="ellipsis" if one_line else None)
            table.add_column(header, justify=column.justify,  # type: ignore[arg-type]
                             no_wrap=not wraps, overflow="ellipsis", width=width)
        for row in rows:
            table.add_row(*row)
        return table


def _text(cell: str | Text) -> Text:
    # NOTE: a str cell would be parsed as console markup: slower (a regex per cell), and not what a
    # value is (a message holding "[...]" would lose it).
    return Text(cell) if isinstance(cell, str) else cell


# -- grouping ----------------------------------------------------------------


#: States shown as rows of their own (by value: an enum lookup per job is a tenth of a frame of 1,000).
BAD_STATES = {state.value for state in JobState if state.is_bad()}
FOLDED_STATES = {JobState.WAITING.value, JobState.SUCCEEDED.value}


@dataclass(frozen=True)
class Kinds:
    """The rows of a view that fits, by kind: bad jobs (those that failed alike as one row), running
    ones, one row per waiting dataset, one per finished dataset."""

    bad: list[Job]
    active: list[Job]
    waiting: list[Job]
    done: list[Job]

    @classmethod
    def of(cls, jobs: list[Job]) -> "Kinds":
        bad, active, waiting, done = [], [], [], []
        for its in _by_dataset(jobs).values():
            shown = [j for j in its if j["state"] not in FOLDED_STATES]
            bad += [j for j in shown if j["state"] in BAD_STATES]
            active += [j for j in shown if j["state"] not in BAD_STATES]
            queued = [j for j in its if j["state"] == JobState.WAITING.value]
            if queued and not shown:
                waiting.append(_waiting_row(queued))
            elif not shown and not queued:
                done.append(_done_row(its))
        return cls(_alike(bad), active, waiting, done)

    def at(self, level: int) -> list[Job]:
        """Level 1 folds the finished datasets into one row; level 2 the waiting ones too."""
        done = [_many(self.done, JobState.SUCCEEDED)] if level >= 1 and len(self.done) > 1 else self.done
        waiting = [_many(self.waiting, JobState.WAITING)] if level >= 2 and len(self.waiting) > 1 else self.waiting
        return self.bad + self.active + waiting + done


#: What two bad jobs' errors may differ in and still be one bug: counts, sizes, line numbers.
NUMBER = re.compile(r"\d[\d,.]*")


def _alike(bad: list[Job]) -> list[Job]:
    """Bad jobs of one stage and state whose errors differ only in numbers and their dataset's name, as
    one row with a count: the bug that breaks every dataset is one row, not a thousand."""
    groups: dict[tuple[Any, ...], list[tuple[Job, str]]] = {}
    for job in bad:
        message = job.get("message") or f"exit {job.get('exit_code')}"
        if len(job["dataset"]) > 1:  # a one-letter name would match inside words
            message = message.replace(job["dataset"], "*")
        # NOTE: the exit code is no number that merely differs: exit 1 and exit 2 are two failures.
        key = (job.get("host", ""), job["stage"], job["state"], job.get("exit_code"), NUMBER.sub("N", message))
        groups.setdefault(key, []).append((job, message))
    rows = []
    for (host, stage, state, _, _), members in groups.items():
        if len(members) == 1:
            rows.append(members[0][0])
            continue
        jobs = [job for job, _ in members]
        reasons: Counter[str] = Counter()
        for job in jobs:
            reasons.update(job.get("skip_reasons") or {})
        rows.append({**_row(f"{len(jobs)} datasets", stage, state, folded=True, covers=jobs, host=host,
                            members=[j["dataset"] for j in jobs], message=_common([m for _, m in members])),
                     "records": sum(j["records"] for j in jobs), "skipped": sum(j["skipped"] for j in jobs),
                     "skip_reasons": dict(reasons)})
    return rows


def _common(messages: list[str]) -> str:
    """The message with each number that differs between them shown as N."""
    numbers = [NUMBER.findall(m) for m in messages]
    parts = NUMBER.split(messages[0])
    shown = [parts[0]]
    for index, part in enumerate(parts[1:]):
        same = {n[index] for n in numbers}
        shown += [numbers[0][index] if len(same) == 1 else "N", part]
    return "".join(shown)


def _more(jobs: list[Job], shown: list[Job]) -> Job:
    """One row for the jobs that the `shown` rows leave out: how many, in which states (`inv status` lists all)."""
    seen = {id(job) for row in shown for job in row.get("covers", [row])}
    counts = Counter(job["state"] for job in jobs if id(job) not in seen)
    said = ", ".join(f"{counts[state.value]} {state.value}" for state in JobState if counts[state.value])
    return _row("...", "", "stopped", more=True, folded=True, message=f"{sum(counts.values())} more: {said}")


def _total(lines: list[Text], height: Callable[[Text], int], limit: int) -> int:
    """The lines `lines` take, counted only until they pass `limit`."""
    total = 0
    for line in lines:
        total += height(line)
        if total > limit:
            break
    return total


def _fill(lines: list[Text], count: int, height: Callable[[Text], int], room: int) -> list[Text]:
    """As many of `lines` (the first of `count`) as fit in `room`, with a last one that says how many
    more there are."""
    if count == len(lines) and _total(lines, height, room) <= room:
        return lines
    shown: list[Text] = []
    used = 1  # the line that says how many are left out
    for line in lines:
        if used + height(line) > room:
            break
        shown.append(line)
        used += height(line)
    note = Text(f"... {count - len(shown)} more errors: `inv status` shows every one in full", style="red")
    return shown + ([note] if room > len(shown) else [])


def _by_dataset(jobs: list[Job]) -> dict[str, list[Job]]:
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(f"{job.get('host', '')}\0{job['dataset']}", []).append(job)
    return groups


def _row(dataset: str, stage: str, state: str, **fields: Any) -> Job:
    return {"dataset": dataset, "stage": stage, "state": state, "records": 0, "skipped": 0, "skip_reasons": {},
            "metrics": {}, "message": "", **fields}


def _done_row(jobs: list[Job]) -> Job:
    last = jobs[-1]
    started = [j["started_at"] for j in jobs if j.get("started_at")]
    ended = [j["ended_at"] for j in jobs if j.get("ended_at")]
    if len(jobs) == 1:
        return last
    return {**last, "stage": f"{len(jobs)} stages", "folded": True, "covers": jobs,
            "started_at": min(started, default=None), "ended_at": max(ended, default=None)}


def _waiting_row(jobs: list[Job]) -> Job:
    """A dataset's waiting stages: the first, and how many follow it."""
    first = jobs[0]
    return {**first, "stage": first["stage"] + (f" +{len(jobs) - 1}" if len(jobs) > 1 else ""), "covers": jobs}


def _many(rows: list[Job], state: JobState) -> Job:
    names = ", ".join(r["dataset"] for r in rows)
    return _row(f"{len(rows)} datasets", "", state.value, records=sum(r["records"] for r in rows),
                message=names, folded=True, covers=[job for row in rows for job in row.get("covers", [row])])


# -- GPUs and the summary -----------------------------------------------------


def errors(jobs: list[Job]) -> list[Text]:
    """Each bad job's error in full, under a table whose cells can hold only its start (a row of
    `Kinds` may stand for all the datasets that failed alike: it names them)."""
    lines = []
    for job in jobs:
        if job["state"] in BAD_STATES:
            where = f"{job.get('host') + ' ' if job.get('host') else ''}"
            if job.get("members"):
                names = job["members"]
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                line = Text(f"{where}{job['stage']} {job['state']} in {len(names)} datasets ({shown}): ", style="bold red")
            else:
                line = Text(f"{where}{job['dataset']}/{job['stage']} {job['state']}: ", style="bold red")
            line.append(error(job), style="red")
            lines.append(line)
    return lines


def gpu_lines(gpus: list[dict[str, Any]]) -> list[Text]:
    """One line per group of GPUs with the same holder: indices, utilisation range, memory."""
    groups: dict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = {}
    for gpu in gpus:
        groups.setdefault((gpu.get("host", ""), tuple(gpu.get("held_by") or ())), []).append(gpu)
    lines = []
    for (host, holders), members in groups.items():
        utils = [g["utilization"] for g in members if g.get("utilization") is not None]
        used = sum(g.get("memory_used") or 0 for g in members) / 1024
        total = sum(g.get("memory_total") or 0 for g in members) / 1024
        util = "-" if not utils else f"{min(utils):.0f}%" if min(utils) == max(utils) else f"{min(utils):.0f}-{max(utils):.0f}%"
        label = "GPU" if len(members) == 1 else "GPUs"
        where = f"{host} " if host else ""
        line = Text(f"{where}{label} {_ranges([g['index'] for g in members])}: ", style="bold")
        line.append(f"util {util}, mem {used:,.0f}/{total:,.0f} GiB, ")
        line.append(", ".join(holders) if holders else "idle", style="cyan" if holders else "dim")
        line.no_wrap, line.overflow = True, "ellipsis"
        lines.append(line)
    return lines


def _ranges(indices: list[int]) -> str:
    parts, run = [], []
    for i in sorted(indices):
        if run and i != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(i)
    parts.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in parts if r)


def summary(status: dict[str, Any], width: int = 10_000) -> list[Text]:
    """The time left and the output tokens/s of the running jobs, then the jobs per state (in lifecycle
    order): one line, or two where one would not fit `width`."""
    jobs = status["jobs"]
    counts = Counter(JobState(j["state"]) for j in jobs)
    running = [j for j in jobs if j["state"] in ("running", "stalled")]
    tokens = sum((j.get("metrics") or {}).get("tokens_per_s", 0) for j in running)
    figures = Text(" · ".join(f for f in (_time_left(running), f"{tokens:,.0f} tok/s" if tokens else "") if f),
                   style="bold")
    states = Text(f"{len(jobs)} job{'s' * (len(jobs) != 1)}: ")
    states.append_text(Text(", ").join(Text(f"{counts[s]} {s.value}", style=STATE_STYLES[s]) for s in JobState if counts[s]))
    if status.get("unreachable"):
        states.append(f" · {len(status['unreachable'])} host(s) unreachable", style="bold red")
    if not figures.plain:
        return [states]
    if len(figures) + 3 + len(states) > width:
        return [figures, states]
    return [Text(" · ").join([figures, states])]


def _time_left(running: list[Job]) -> str:
    """The pipeline's estimate when a runner has one; else the longest running job's."""
    runners = [j for j in running if j["stage"] == RUNNER_STAGE and j.get("eta_s") is not None]
    if runners:
        longest = max(runners, key=lambda j: j["eta_s"])
        return f"ETA {eta(longest, View(0, None))}"
    etas = [j for j in running if j.get("eta_s") is not None]
    return f"ETA {eta(max(etas, key=lambda j: j['eta_s']), View(0, None))}" if etas else ""
