"""The rows of a status view refreshed in place, grouped and folded until they fit the terminal
(local/views/status_table.py): bad jobs that failed alike as one row, one row per waiting or finished dataset."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from rich.text import Text

from local.views.status_data import Job
from remote.vocabulary import hints
from remote.vocabulary.states import JobState


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


def more_row(jobs: list[Job], shown: list[Job]) -> Job:
    """One row for the jobs that the `shown` rows leave out: how many, in which states (`inv status` lists all)."""
    seen = {id(job) for row in shown for job in row.get("covers", [row])}
    counts = Counter(job["state"] for job in jobs if id(job) not in seen)
    said = ", ".join(f"{counts[state.value]} {state.value}" for state in JobState if counts[state.value])
    return _row("...", "", "stopped", more=True, folded=True, message=f"{sum(counts.values())} more: {said}")


def total_lines(lines: list[Text], height: Callable[[Text], int], limit: int) -> int:
    """The lines `lines` take, counted only until they pass `limit`."""
    total = 0
    for line in lines:
        total += height(line)
        if total > limit:
            break
    return total


def fill_lines(lines: list[Text], count: int, height: Callable[[Text], int], room: int) -> list[Text]:
    """As many of `lines` (the first of `count`) as fit in `room`, with a last one that says how many
    more there are."""
    if count == len(lines) and total_lines(lines, height, room) <= room:
        return lines
    shown: list[Text] = []
    used = 1  # the line that says how many are left out
    for line in lines:
        if used + height(line) > room:
            break
        shown.append(line)
        used += height(line)
    note = Text(f"... {count - len(shown)} more errors: {hints.inv('status')} shows every one in full", style="red")
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
