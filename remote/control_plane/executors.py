"""Where a job runs, behind one small interface: `process` (a detached supervisor on this
host) and `slurm` (the same supervisor inside a Slurm allocation).

The executor is chosen once, by name, from the job's spec, and recorded in its
state (``"executor": "process"``); everything above this module asks the job's
executor and never which one it is.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from remote.control_plane import cgroups, processes
from remote.vocabulary import hints
from remote.vocabulary.layout import LOG, STATE
from remote.control_plane.store import HostError
from remote.control_plane.progress import write_json_atomic
from remote.vocabulary.states import JobState, quiet_for

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any


class Reading:
    """A job's state as its executor sees it now, and what to show with it: `fields`, the status keys
    only this executor has (Slurm's job id, state and node); `blocked_by`, the jobs whose failure holds
    this one for ever (only a rerun moves it)."""

    # NOTE: a plain class: `status` is a `python -S` start-up that imports only what it uses, and
    # a dataclass would bring `inspect` (a tenth of the command) into it.
    __slots__ = ("state", "message", "fields", "blocked_by")

    def __init__(self, state: JobState, message: str = "", fields: dict[str, Any] | None = None,
                 blocked_by: list[str] | None = None) -> None:
        self.state, self.message, self.fields, self.blocked_by = state, message, fields or {}, blocked_by


class Executor:
    """The interface every executor has; the job's state names its executor (`of`)."""

    # NOTE: a base class, not a typing.Protocol: `status` and `launch` then never import typing.
    name: str
    queues: bool
    """Whether jobs wait for the jobs they need in the executor's own queue (else the runner waits)."""
    detaches: bool
    """Whether `record_starting` and one detached starter may stand in for `submit` (remote.control_plane.jobs.launch_all)."""

    def submit(self, directory: Path, spec: dict[str, Any], release: Path, after: list[str]) -> dict[str, Any]:
        """Start (or queue) the job; the launch result's fields (`where`, and `pid` or `slurm_job_id`)."""
        raise NotImplementedError

    def batch_view(self, states: list[dict[str, Any]]) -> Any:
        """What the executor knows about all these jobs at once (one query), for `read`."""
        raise NotImplementedError

    def read(self, state: dict[str, Any], progress: dict[str, Any], now: float, view: Any) -> Reading:
        raise NotImplementedError

    def is_active(self, state: dict[str, Any], reading: JobState | None) -> bool:
        raise NotImplementedError

    def cancel(self, state: dict[str, Any]) -> bool:
        """End the job and whatever it left running; whether there was anything to end."""
        raise NotImplementedError

    def queue_id(self, state: dict[str, Any]) -> str | None:
        """The id a dependent job waits on, where the executor queues jobs (Slurm); None here."""
        raise NotImplementedError

    def who(self, state: dict[str, Any]) -> str:
        raise NotImplementedError


def base_message(state: dict[str, Any], progress: dict[str, Any]) -> str:
    return state.get("message") or progress.get("message") or ""


class ProcessExecutor(Executor):
    """A supervisor in a session of its own on this host; its pid is the job's process group."""

    name = "process"
    queues = False  # waiting on other jobs is the pipeline runner's (remote.orchestration.runner)

    detaches = True  # many jobs are started by one detached process (processes.Starter)

    def record_starting(self, directory: Path, spec: dict[str, Any], release: Path, starter: processes.Starter) -> dict[str, Any]:
        """The state of a job handed to the starter: alive while the starter is, until its supervisor runs."""
        write_json_atomic(directory / STATE, {
            "dataset": spec["dataset"], "stage": spec["stage"], "executor": self.name,
            "state": JobState.RUNNING.value, "starting": starter.identity,
            "release": release.name, "started_at": time.time(), "stall_after": spec["stall_after"],
        })
        return {"where": f"starting, pid {starter.pid} starts its supervisor"}

    def submit(self, directory: Path, spec: dict[str, Any], release: Path, after: list[str]) -> dict[str, Any]:
        import subprocess  # here: `status` starts nothing

        python_path = os.pathsep.join(filter(None, [str(release), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
        with open(directory / LOG, "ab") as log:
            # A new session: no controlling terminal, no SIGHUP when the SSH session ends.
            process = subprocess.Popen(
                [sys.executable, "-m", "remote.control_plane.supervisor", str(directory)],
                cwd=release, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # NOTE: at once, not when its supervisor is up: until then it is in its launcher's cgroup, and a
        # launcher that is stopped meanwhile (the pipeline runner, by `inv stop --all`) would take it along.
        cgroup = cgroups.enter(f"{spec['dataset']}.{spec['stage']}.{time.time_ns():x}-{process.pid}", process.pid)
        write_json_atomic(directory / STATE, {
            "dataset": spec["dataset"], "stage": spec["stage"], "executor": self.name,
            "state": JobState.RUNNING.value, **processes.identity(process.pid), "pgid": process.pid,
            "cgroup": cgroup, "release": release.name,
            "started_at": time.time(), "stall_after": spec["stall_after"],
        })
        return {"pid": process.pid, "where": f"pid {process.pid}"}

    def batch_view(self, states: list[dict[str, Any]]) -> Any:
        return None

    def read(self, state: dict[str, Any], progress: dict[str, Any], now: float, view: Any) -> Reading:
        recorded = JobState(state.get("state", "died"))
        message = base_message(state, progress)
        if recorded == JobState.WAITING:  # its pid is the pipeline runner's, which reports for itself
            if not processes.is_alive(state):
                message = f"not started: the pipeline runner has ended; {hints.inv('rerun', failed=True)} resumes"
            return Reading(recorded, message)
        if recorded == JobState.BLOCKED:  # recorded by the pipeline runner, which never started it
            return Reading(recorded, message, blocked_by=state.get("blocked_by"))
        if recorded not in (JobState.RUNNING, JobState.STALLED):
            return Reading(recorded, message)
        if "pid" not in state and state.get("starting"):
            if processes.is_alive(state["starting"]):
                return Reading(JobState.RUNNING, "starting")
            return Reading(JobState.DIED, f"not started: its starter (pid {state['starting'].get('pid')}) ended first")
        if not processes.is_alive(state):
            message = f"supervisor (pid {state.get('pid')}) is gone without an exit code"
            if not processes.same_boot(state):
                message += " (the host has rebooted since it started)"
            if processes.group_members(state):
                message += f"; its stage still runs ({hints.inv('stop')} or {hints.inv('rerun', failed=True)} ends it)"
            return Reading(JobState.DIED, message)
        quiet = quiet_for(state, progress, now)
        if quiet is not None:
            return Reading(JobState.STALLED, f"no progress for {quiet:.0f}s")
        return Reading(JobState.RUNNING, message)

    def is_active(self, state: dict[str, Any], reading: JobState | None) -> bool:
        if reading in (JobState.WAITING, JobState.BLOCKED):
            return False  # never started: a waiting job's pid is the runner's
        return processes.is_alive(state) or ("pid" not in state and processes.is_alive(state.get("starting") or {}))

    def cancel(self, state: dict[str, Any]) -> bool:
        if state.get("state") in (JobState.WAITING.value, JobState.BLOCKED.value):
            return False  # the runner's pid, if any: the job itself never started
        return processes.end_group(state)

    def queue_id(self, state: dict[str, Any]) -> str | None:
        return None

    def who(self, state: dict[str, Any]) -> str:
        if "pid" not in state and state.get("starting"):
            return f"starting under pid {state['starting'].get('pid')}"
        return f"pid {state.get('pid')}"


class SlurmExecutor(Executor):
    """`sbatch` of the same supervisor; Slurm's own view (one `squeue` for all jobs) corrects the record."""

    name = "slurm"
    detaches = False  # each job is submitted at once: a dependent needs its Slurm id
    queues = True  # a job waits on the ones it needs in Slurm's queue (afterok)

    def submit(self, directory: Path, spec: dict[str, Any], release: Path, after: list[str]) -> dict[str, Any]:
        from remote.control_plane import slurm_jobs

        state = slurm_jobs.submit(directory, spec, release, after)
        return {"slurm_job_id": state["slurm_job_id"], "where": f"Slurm job {state['slurm_job_id']}"}

    def batch_view(self, states: list[dict[str, Any]]) -> Any:
        from remote.control_plane import slurm_jobs

        return slurm_jobs.view(states)

    def read(self, state: dict[str, Any], progress: dict[str, Any], now: float, view: Any) -> Reading:
        from remote.control_plane import slurm_jobs

        view = self.batch_view([state]) if view is None else view
        job = view.get(state["slurm_job_id"])
        reading, note = slurm_jobs.effective(state, progress, now, job)
        message = base_message(state, progress)
        message = f"{note}: {message}" if note and message else note or message
        fields = {"slurm_job_id": state["slurm_job_id"], "slurm_state": job.state if job else None,
                  "node": job.node if job else state.get("node")}
        if reading == JobState.WAITING and job is not None and job.reason == slurm_jobs.NEVER:
            # Pending for ever in Slurm's queue behind a job that failed: blocked, as the runner's are.
            return Reading(JobState.BLOCKED, message, fields, blocked_by=state.get("waiting_for") or [])
        return Reading(reading, message, fields)

    def is_active(self, state: dict[str, Any], reading: JobState | None) -> bool:
        # NOTE: a blocked job still sits in Slurm's queue: `inv stop` and a rerun cancel it there.
        return reading in (JobState.WAITING, JobState.RUNNING, JobState.BLOCKED)

    def cancel(self, state: dict[str, Any]) -> bool:
        from remote.control_plane import slurm_jobs

        slurm_jobs.cancel(state)
        return True

    def queue_id(self, state: dict[str, Any]) -> str | None:
        return state.get("slurm_job_id")

    def who(self, state: dict[str, Any]) -> str:
        return f"Slurm job {state.get('slurm_job_id')}"


EXECUTORS: dict[str, Executor] = {"process": ProcessExecutor(), "slurm": SlurmExecutor()}


def named(name: str) -> Executor:
    if name not in EXECUTORS:
        raise HostError(f"unknown executor {name!r}: expected one of {', '.join(EXECUTORS)}")
    return EXECUTORS[name]


def for_spec(spec: dict[str, Any]) -> Executor:
    """The executor the workstation chose for this job (specs from before the name: by their resources)."""
    return named(spec.get("executor") or ("slurm" if spec.get("slurm") is not None else "process"))


def of(state: dict[str, Any]) -> Executor:
    """The executor a job's record names (records from before the name: by their Slurm id)."""
    return named(state.get("executor") or ("slurm" if state.get("slurm_job_id") else "process"))
