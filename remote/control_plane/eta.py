"""Time left: per job from its progress, and for an `inv run` pipeline as a whole.

A stage that knows its total says so (`Progress.expect`), and its progress
file carries ``total``, ``done`` and a recent ``rate``; a job's ``eta_s`` is
then ``(total - done) / rate``. A stage whose phases run at different speeds
says its own estimate instead (`Progress.estimate`: the chunked route's, from
the extract and train time of the passes it has done), counted down since.
A job that has not started yet is estimated from what is known of it: its total from the jobs it reads (infer answers the
prompts prep kept; extract reads what prep or tokenize kept), its rate from a
job of the same stage that ran or runs. The pipeline's time left replays the
runner's rules over those estimates (a job starts when the jobs it needs are
done; GPU jobs one at a time); where a job cannot be estimated it counts as
nothing, and ``eta_complete`` says the figure is then a lower bound.

Standard library only; reads the progress files beside the job store, so the
job store itself needs no change (`annotate` is called by the status verb).
"""

from __future__ import annotations

import time
from pathlib import Path

from remote.vocabulary import layout
from remote.control_plane.progress import read_mapping
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE, JobState

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any


def job_eta(progress: dict[str, Any], state: str) -> float | None:
    """Seconds left for a running job whose stage said its total; None when unknown."""
    total, done, rate = progress.get("total"), progress.get("done"), progress.get("rate")
    if state not in ("running", "stalled"):
        return None
    if isinstance(progress.get("eta_s"), (int, float)) and isinstance(progress.get("eta_at"), (int, float)):
        # The stage's own estimate (the chunked route's, from its passes' measured times), counted down since.
        return round(max(0.0, progress["eta_s"] - max(0.0, time.time() - progress["eta_at"])), 1)
    if total is None or done is None:
        return None
    if done >= total:
        return 0.0
    return round((total - done) / rate, 1) if rate else None


def annotate(root: Path, status: dict[str, Any]) -> dict[str, Any]:
    """Add ``total``, ``done``, ``rate`` and ``eta_s`` to each job; ``eta_s`` to the runner for the whole pipeline."""
    jobs = status.get("jobs", [])
    for job in jobs:
        progress = read_mapping(layout.job_dir(root, job["dataset"], job["stage"]) / layout.PROGRESS)
        job["total"], job["done"], job["rate"] = progress.get("total"), progress.get("done"), progress.get("rate")
        job["eta_s"] = job_eta(progress, job["state"])
    runner = next((j for j in jobs if (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE)), None)
    if runner is not None and runner["state"] in ("running", "stalled"):
        try:
            plan = read_mapping(layout.runner_dir(root) / layout.SPEC)["config"]["stage"]["plan"]
            runner["eta_s"], runner["eta_complete"] = pipeline_eta(plan, jobs)
        except (KeyError, TypeError, AttributeError):
            pass  # a spec it cannot read: no estimate, and the job's own reading says why
    return status


def pipeline_eta(plan: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> tuple[float, bool]:
    """Seconds until every job of `plan` is done, replaying the runner's rules; and whether every job had an estimate."""
    by_key = {layout.job_key(j["dataset"], j["stage"]): j for j in jobs}
    left: dict[str, float | None] = {}
    for node in plan:
        left[node["key"]] = remaining(node, by_key, jobs)
    complete = all(seconds is not None for seconds in left.values())
    return round(replay(plan, {k: v or 0.0 for k, v in left.items()}, by_key), 1), complete


def remaining(node: dict[str, Any], by_key: dict[str, dict[str, Any]], jobs: list[dict[str, Any]]) -> float | None:
    """Seconds this job still needs: none when done, its own ETA when running, an estimate when not started."""
    job = by_key.get(node["key"], {})
    if job.get("state") and JobState(job["state"]).is_terminal():
        return 0.0  # done, not run again by this runner, or blocked behind a failed job
    if job.get("state") in ("running", "stalled"):
        return job.get("eta_s")
    stage = node["spec"]["stage"]
    total = expected_total(node, by_key)
    rate = stage_rate(stage, jobs)
    return round(total / rate, 1) if total is not None and rate else None


def expected_total(node: dict[str, Any], by_key: dict[str, dict[str, Any]]) -> int | None:
    """What a job not started yet will count: what the jobs it reads kept (or will count, if they run)."""
    if node["spec"]["stage"] in ("prep", "train"):
        return None  # prep's rows are read from the source; train counts steps, not records
    counts = []
    for need in node["needs"]:
        upstream = by_key.get(need, {})
        counts.append(upstream.get("records") if upstream.get("state") == "succeeded" else upstream.get("total"))
    return sum(counts) if counts and None not in counts else None


def stage_rate(stage: str, jobs: list[dict[str, Any]]) -> float | None:
    """Units per second of the stage's jobs that ran (records and skips over their run) or run (their rate)."""
    rates = []
    for job in jobs:
        if job["stage"] != stage or job["dataset"] == DRAFT:
            continue
        if job["state"] in ("running", "stalled") and job.get("rate"):
            rates.append(job["rate"])
        elif job["state"] == "succeeded" and job.get("started_at") and job.get("ended_at"):
            seconds = job["ended_at"] - job["started_at"]
            if seconds > 0:
                rates.append((job["records"] + job["skipped"]) / seconds)
    return sum(rates) / len(rates) if rates else None


def replay(plan: list[dict[str, Any]], left: dict[str, float], by_key: dict[str, dict[str, Any]]) -> float:
    """When the last job ends if each takes `left` seconds from now: the runner's order, one GPU job at a time."""
    ends: dict[str, float] = {}
    gpu_free = 0.0
    running_gpu = [n for n in plan if n["gpu"] and by_key.get(n["key"], {}).get("state") in ("running", "stalled")]
    for node in running_gpu:  # the GPU's holder keeps it first
        ends[node["key"]] = gpu_free = left[node["key"]]
    pending = [n for n in plan if n["key"] not in ends]
    while pending:
        ready = [n for n in pending if all(need in ends for need in n["needs"])]
        if not ready:
            break  # a need outside the plan: nothing more can be said
        # The runner starts whichever job is ready first (in plan order on a tie).
        node = min(ready, key=lambda n: max([ends[need] for need in n["needs"]] or [0.0]))
        start = max([ends[need] for need in node["needs"]] or [0.0])
        if node["gpu"]:
            start = max(start, gpu_free)
            gpu_free = start + left[node["key"]]
        ends[node["key"]] = start + left[node["key"]]
        pending.remove(node)
    return max(ends.values(), default=0.0)
