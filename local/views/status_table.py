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
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Iterable

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from local.views.status_columns import COLUMNS, HOST, STATE_STYLES, WIDE, Column, View, error, eta
from local.views.status_data import UNREACHABLE, Job, accept_length, in_pipeline_order, runner_state
from local.views.status_rows import BAD_STATES, Kinds, fill_lines, more_row, total_lines
from local.visible import visible, visible_all
from remote.vocabulary.layout import job_key
from remote.vocabulary.states import RUNNER_STAGE, JobState


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
        self.view = View(now=status.get("now") or time.time(), current_release=status.get("current_release"),
                         runner=runner_state(status))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        multi = isinstance(self.view.current_release, dict)
        wide = options.max_width >= WIDE
        columns = [c for c in ([HOST, *COLUMNS] if multi else COLUMNS)
                   if (wide or not c.wide_only) and c.needed(self.status["jobs"], self.view)]
        tail = [*gpu_lines(self.status.get("gpus") or []), *accept_lines(self.status["jobs"]),
                *summary(self.status, options.max_width)]
        if not self.fit:
            table, below = self.table(columns, self.view, self.status["jobs"], boxed=True, width=options.max_width)
            yield table
            yield from [*(errors(self.status["jobs"], self.view.runner) if below else []), *tail]
            return
        if self.title:
            yield Text(self.title, no_wrap=True, overflow="ellipsis", style="bold")
        room = (options.height or options.size.height) - (1 if self.title else 0) - self.lines(console, options, *tail)
        rows, below = self.fitted(room, lambda text: len(text.wrap(console, options.max_width)))
        yield self.table(columns, replace(self.view, errors_below=True, one_line=True), rows, one_line=True)[0]
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
        below = errors(bad[:max(left, 0) + 1], self.view.runner)  # more than fit are never measured: one line each at least
        for level in range(3):
            rows = kinds.at(level)
            if len(rows) + total_lines(below, height, left) <= left and len(below) == len(bad):
                return rows, below
        rest = rows[len(bad):]
        if len(bad) + 1 > left:  # not even the bad rows: as many as fit, and one row for the others
            keep = bad[:max(left - 1, 0)]
            return keep + [more_row(jobs, keep)], []
        shown = fill_lines(below, len(bad), height, left - len(bad) - 1)
        left -= len(bad) + 1 + sum(height(line) for line in shown)
        return bad + rest[:left] + ([more_row(jobs, bad + rest[:left])] if rest[left:] else []), shown

    def table(self, columns: list[Column], view: View, jobs: list[Job], boxed: bool = False,
              one_line: bool = False, width: int | None = None) -> tuple[Table, bool]:
        """The table, and whether the bad jobs' errors go under it: where one does not fit its cell on one
        line at `width` (a row of ten wrapped lines reads worse than a sentence under the table)."""
        if boxed:
            table = Table(title=self.title, title_justify="left")
        else:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        rows = [[_text(column.cell(job, view)) for column in columns[:-1]] for job in jobs]
        if width is not None:
            view = replace(view, errors_below=_errors_below(columns, rows, jobs, view.runner, width))
        for row, job in zip(rows, jobs):
            row.append(_text(columns[-1].cell(job, view)))
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
            fixed = None if wraps else max(cell_len(text) for text in [column.header, *(r[index].plain for r in rows)])
            header = Text(column.header, no_wrap=one_line, overflow="ellipsis" if one_line else None)
            table.add_column(header, justify=column.justify,  # type: ignore[arg-type]
                             no_wrap=not wraps, overflow="ellipsis", width=fixed)
        for row in rows:
            table.add_row(*row)
        return table, view.errors_below


def _errors_below(columns: list[Column], rows: list[list[Text]], jobs: list[Job], runner: str | None,
                  width: int) -> bool:
    """Whether a bad job's error is longer than the last column can hold on one line at `width`, the other
    columns (`rows`' cells, one line each) as wide as their widest cell."""
    widths = [max(cell_len(text) for text in [column.header, *(row[index].plain for row in rows)])
              for index, column in enumerate(columns[:-1])]
    room = width - sum(widths) - 3 * len(columns) - 1  # each cell's padding and rule, and the edge
    return any(cell_len(error(job, runner)) > room for job in jobs if job["state"] in BAD_STATES)


def _text(cell: str | Text) -> Text:
    # NOTE: a str cell would be parsed as console markup: slower (a regex per cell), and not what a
    # value is (a message holding "[...]" would lose it).
    return Text(cell) if isinstance(cell, str) else cell


def errors(jobs: list[Job], runner: str | None = None) -> list[Text]:
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
                line = Text(f"{where}{job_key(job['dataset'], job['stage'])} {job['state']}: ", style="bold red")
            line.append(error(job, runner), style="red")
            lines.append(line)
    return lines


def accept_lines(jobs: list[Job]) -> list[Text]:
    """The draft's held-out accept length, whole, under the table whenever a train job shows one (its
    cell holds only the start of the metrics)."""
    return [Text(line, style="bold") for line in map(accept_length, jobs) if line]


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
