"""Jobs on a Slurm cluster: the same supervisor and stage contract, inside an allocation.

`submit` hands ``python -m remote.control_plane.supervisor JOBDIR`` to `sbatch`; the supervisor
then keeps the job's files exactly as on a single host, so records, skips, the
`empty` rule and logs behave the same. The job's state is read from both sides:
the supervisor's record and Slurm's own view (`remote.control_plane.slurm.query`, one call for
all jobs), so a job pending in the queue, or ended by Slurm itself (TIMEOUT,
OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, ...), shows as such, with Slurm's word kept.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from remote.control_plane import slurm
from remote.vocabulary import hints
from remote.vocabulary.layout import LOG, SCRIPT, STATE
from remote.control_plane.progress import write_json_atomic
from remote.control_plane.slurm import SlurmJob
from remote.vocabulary.states import JobState, quiet_for

#: End states Slurm imposes on a job; they override what the supervisor managed to record.
ENDED_BY_SLURM = {"TIMEOUT", "DEADLINE", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "CANCELLED"}
NEVER = "DependencyNeverSatisfied"  # a dependent of a failed job: it waits for ever


def is_slurm(state: dict[str, Any]) -> bool:
    return bool(state.get("slurm_job_id"))


def submit(directory: Path, spec: dict[str, Any], release: Path, after: list[str]) -> dict[str, Any]:
    """sbatch the supervisor for this job; its first state record (`waiting`, with the Slurm job id)."""
    script = directory / SCRIPT
    script.write_text(
        "#!/bin/sh\n# Written by aerie: the job's supervisor, run inside the allocation.\n"
        f"exec {shlex.quote(sys.executable)} -m remote.control_plane.supervisor {shlex.quote(str(directory))}\n")
    resources = spec["slurm"]
    job_id = slurm.submit(
        script, job_name=f"aerie-{spec['dataset']}-{spec['stage']}", output=directory / LOG, workdir=release,
        partition=resources.get("partition"), gpus=resources.get("gpus"), cpus=resources.get("cpus"),
        mem=resources.get("mem"), time=resources.get("time"), account=resources.get("account"),
        extra=resources.get("extra") or [], dependency=after,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(release), os.environ.get("PYTHONPATH")])),
             "PYTHONUNBUFFERED": "1"},
    )
    state = {
        "dataset": spec["dataset"], "stage": spec["stage"], "state": JobState.WAITING.value,
        "slurm_job_id": job_id, "release": release.name, "submitted_at": time.time(),
        "stall_after": spec["stall_after"], "waiting_for": spec.get("after") or None, "executor": "slurm",
    }
    write_json_atomic(directory / STATE, state)
    return state


def view(states: list[dict[str, Any]]) -> dict[str, SlurmJob]:
    """Slurm's view of every job in `states` that it runs: one query for them all."""
    ids = [s["slurm_job_id"] for s in states if is_slurm(s)]
    return slurm.query(ids) if ids else {}


def effective(state: dict[str, Any], progress: dict[str, Any], now: float, job: SlurmJob | None) -> tuple[JobState, str]:
    """The job's state and a note, from the supervisor's record and Slurm's view together."""
    recorded = JobState(state.get("state", "died"))
    if job is None:  # neither squeue nor the completion log knows it any more
        if recorded.is_terminal():
            return recorded, ""
        return JobState.DIED, f"Slurm job {state['slurm_job_id']} is gone without the supervisor's record"
    base = job.state.split()[0]
    if base in ENDED_BY_SLURM:
        where = f" on {job.node}" if job.node else ""
        if job.job_state == JobState.STOPPED and recorded != JobState.STOPPED:
            # NOTE: `stopped` is `inv stop`'s alone (it records it); an admin's or a script's scancel is not.
            return JobState.DIED, f"Slurm: {base}{where}, not by {hints.inv('stop')}"
        return job.job_state, f"Slurm: {base}{where}"
    if recorded.is_terminal():
        return recorded, ""
    seen = job.job_state
    if seen == JobState.WAITING:
        return seen, f"pending in Slurm ({job.reason})" if job.reason else "pending in Slurm"
    if seen == JobState.RUNNING:
        where = f"on {job.node}" if job.node else ""
        quiet = quiet_for(state, progress, now) if state.get("started_at") else None
        if quiet is not None:
            return JobState.STALLED, f"no progress for {quiet:.0f}s {where}".strip()
        return JobState.RUNNING, where
    if seen.is_terminal():
        return (JobState.DIED if seen == JobState.SUCCEEDED else seen), f"Slurm: {base} without the supervisor's record"
    return seen, f"Slurm: {job.state}"


def cancel(state: dict[str, Any]) -> None:
    slurm.cancel([state["slurm_job_id"]])
