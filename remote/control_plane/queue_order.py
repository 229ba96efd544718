"""A pipeline on an executor that queues jobs itself (Slurm): each job submitted after the jobs it
needs (`afterok`), in plan order, so that the queue keeps the order and no runner is needed."""

from __future__ import annotations

import time
from pathlib import Path

from remote.control_plane import executors, jobs
from remote.vocabulary import layout
from remote.vocabulary.states import JobState
from remote.control_plane.store import BrokenJob, HostError, JobStore

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any


def submit_in_order(root: Path, specs: list[dict[str, Any]], only: set[JobState] | None = None,
                    unstick: bool = False) -> list[dict[str, Any]]:
    """Submit `specs` in order, each after the jobs it needs (its `after` keys).

    A needed job that is queued or running already is waited for by its queue id; one
    that has succeeded is not waited for at all.
    """
    ids: dict[str, str] = {}
    results = []
    for spec in specs:
        after = [ids.get(key) or _queued_id(root, key) for key in spec.get("after", [])]
        result = jobs.launch(root, spec, only=only, after=[a for a in after if a], unstick=unstick)
        if result.get("slurm_job_id"):
            ids[layout.job_key(spec["dataset"], spec["stage"])] = result["slurm_job_id"]
        results.append(result)
    return results


def _queued_id(root: Path, key: str) -> str | None:
    directory = layout.key_dir(root, key)
    try:
        job, reading = jobs.read(JobStore(root).read(directory), time.time())
        executor = executors.of(job.state) if job.state else None
    except (BrokenJob, HostError):
        return None
    if executor and executor.is_active(job.state, reading.state):
        return executor.queue_id(job.state)
    return None
