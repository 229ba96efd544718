"""The job store on the host: one directory per (dataset, stage) under ``<root>/jobs``.

Each job directory holds::

    spec.json      what to run (written by launch)
    state.json     the supervisor's record: pid, pid_start, release, times, exit code
    progress.json  the stage's counters (remote.progress)
    log            the stage's output; the previous run's is kept as log.1
    launch.lock    taken while a launch checks and starts the job

Only the supervisor writes ``state.json`` while it lives; launch writes the
first one and `stop` the last one when the supervisor is already gone.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from remote import slurm_jobs
from remote.progress import read_json, write_json_atomic
from remote.slurm import SlurmJob
from remote.states import JobState

HEARTBEAT_SECONDS = 5.0
SUPERVISOR_MARK = "[aerie]"  # the supervisor's own lines in a job's log


class HostError(Exception):
    """A refusal the workstation shows as one line."""


def job_dir(root: Path, dataset: str, stage: str) -> Path:
    return root / "jobs" / dataset / stage


def all_job_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in (root / "jobs").glob("*/*/state.json"))


def current_release(root: Path) -> Path:
    link = root / "current"
    if not link.exists():
        raise HostError(f"nothing deployed under {root}: run `inv deploy` first")
    return link.resolve()


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock: two terminals launching the same job take turns."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# -- processes ---------------------------------------------------------------


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid`, so a reused pid is not taken for the job."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return _process_start_ps(pid)
    # The command name may hold spaces and parentheses; fields restart after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _process_start_ps(pid: int) -> str | None:
    # NOTE: only where there is no /proc (a macOS workstation on the local backend).
    if not Path("/proc").is_dir():
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True)
        return out.stdout.strip() or None
    return None


def is_alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    return bool(pid) and process_start(pid) == state.get("pid_start")


# -- reading -----------------------------------------------------------------


def last_line(log: Path, limit: int = 160) -> str:
    """The stage's last non-empty line in a log (not the supervisor's own), read from its tail only."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    text = next((line.strip() for line in reversed(lines) if line.strip() and not line.startswith(SUPERVISOR_MARK)), "")
    return text[:limit]


def effective_state(state: dict[str, Any], progress: dict[str, Any], now: float,
                    slurm_view: dict[str, SlurmJob] | None = None) -> JobState:
    """The recorded state, corrected by what the host (or Slurm) sees now."""
    if slurm_jobs.is_slurm(state):
        return _slurm_reading(state, progress, now, slurm_view)[0]
    recorded = JobState(state.get("state", "died"))
    if recorded == JobState.WAITING:
        return recorded  # its pid is the pipeline runner's, which reports for itself
    if recorded in (JobState.RUNNING, JobState.STALLED):
        if not is_alive(state):
            return JobState.DIED
        last_sign = max(progress.get("updated_at", 0), state.get("started_at", 0))
        if now - last_sign > state.get("stall_after", 600):
            return JobState.STALLED
        return JobState.RUNNING
    return recorded


def _slurm_reading(state: dict[str, Any], progress: dict[str, Any], now: float,
                   slurm_view: dict[str, SlurmJob] | None) -> tuple[JobState, str, SlurmJob | None]:
    view = slurm_jobs.view([state]) if slurm_view is None else slurm_view
    job = view.get(state["slurm_job_id"])
    return (*slurm_jobs.effective(state, progress, now, job), job)


def describe(directory: Path, now: float, slurm_view: dict[str, SlurmJob] | None = None) -> dict[str, Any]:
    """One job as the workstation shows it."""
    state = read_json(directory / "state.json", {})
    progress = read_json(directory / "progress.json", {})
    message = state.get("message") or progress.get("message") or ""
    if slurm_jobs.is_slurm(state):
        effective, note, slurm_job = _slurm_reading(state, progress, now, slurm_view)
        message = f"{note}: {message}" if note and message else note or message
        extra = {"slurm_job_id": state["slurm_job_id"], "slurm_state": slurm_job.state if slurm_job else None,
                 "node": slurm_job.node if slurm_job else state.get("node")}
        return {**_job_fields(directory, state, progress, effective, message), **extra}
    effective = effective_state(state, progress, now)
    if effective == JobState.DIED and not state.get("ended_at"):
        message = f"supervisor (pid {state.get('pid')}) is gone without an exit code"
    elif effective == JobState.WAITING and not is_alive(state):
        message = "not started: the pipeline runner has ended; `inv rerun --failed` resumes"
    elif effective == JobState.STALLED:
        message = f"no progress for {now - max(progress.get('updated_at', 0), state.get('started_at', 0)):.0f}s"
    return _job_fields(directory, state, progress, effective, message)


def _job_fields(directory: Path, state: dict[str, Any], progress: dict[str, Any], effective: JobState,
                message: str) -> dict[str, Any]:
    skip_reasons = progress.get("skip_reasons", {})
    log_line = last_line(directory / "log")
    return {
        "dataset": state.get("dataset", directory.parent.name),
        "stage": state.get("stage", directory.name),
        "state": effective.value,
        "records": progress.get("records", 0),
        "skipped": sum(skip_reasons.values()),
        "skip_reasons": skip_reasons,
        "metrics": progress.get("metrics", {}),
        "exit_code": state.get("exit_code"),
        "signal": state.get("signal"),
        "release": state.get("release"),
        "started_at": state.get("started_at"),
        "ended_at": state.get("ended_at"),
        "heartbeat_at": state.get("heartbeat_at"),
        "waiting_for": state.get("waiting_for"),
        "pid": state.get("pid"),
        "message": message or log_line,
        "log_line": log_line,
    }


def status(root: Path) -> dict[str, Any]:
    now = time.time()
    link = root / "current"
    directories = all_job_dirs(root)
    slurm_view = slurm_jobs.view([read_json(d / "state.json", {}) for d in directories])  # one query for all
    return {
        "now": now,
        "current_release": link.resolve().name if link.exists() else None,
        "jobs": [describe(d, now, slurm_view) for d in directories],
    }


# -- launching and stopping --------------------------------------------------


def launch(root: Path, spec: dict[str, Any], only: set[JobState] | None = None, after: list[str] = [],
           unstick: bool = False) -> dict[str, Any]:
    """Start one job under a supervisor (on Slurm: submit it, after the jobs `after`), unless it
    runs already (or, with `only`, is in another state). `unstick`: also resubmit a Slurm job
    held for ever behind a failed one."""
    directory = job_dir(root, spec["dataset"], spec["stage"])
    directory.mkdir(parents=True, exist_ok=True)
    result = {"dataset": spec["dataset"], "stage": spec["stage"], "launched": False}
    with locked(directory / "launch.lock"):
        # NOTE: decided again under the lock: a concurrent rerun may have just relaunched it.
        state = read_json(directory / "state.json", {})
        progress = read_json(directory / "progress.json", {})
        now_state, note = _reading(state, progress) if state else (None, "")
        stuck = unstick and slurm_jobs.NEVER in note
        if only is not None and now_state not in only and not stuck:
            return {**result, "reason": f"is {now_state.value if now_state else 'not started'}"}
        if now_state == JobState.STALLED or stuck:
            end(state)
        elif is_active(state, now_state):
            return {**result, "reason": f"already running ({_who(state)})"}
        release = current_release(root)
        _prepare(directory, spec)
        if spec.get("slurm") is not None:
            submitted = slurm_jobs.submit(directory, spec, release, after)
            return {**result, "launched": True, "slurm_job_id": submitted["slurm_job_id"]}
        pid = _spawn(directory, spec, release)
    return {**result, "launched": True, "pid": pid}


def _reading(state: dict[str, Any], progress: dict[str, Any]) -> tuple[JobState, str]:
    """The job's state now, and Slurm's note on it (empty off Slurm)."""
    if slurm_jobs.is_slurm(state):
        reading, note, _ = _slurm_reading(state, progress, time.time(), None)
        return reading, note
    return effective_state(state, progress, time.time()), ""


def is_active(state: dict[str, Any], now_state: JobState | None) -> bool:
    if slurm_jobs.is_slurm(state):
        return now_state in (JobState.WAITING, JobState.RUNNING)
    return now_state != JobState.WAITING and is_alive(state)  # a waiting job's pid is the pipeline runner's


def _who(state: dict[str, Any]) -> str:
    return f"Slurm job {state['slurm_job_id']}" if slurm_jobs.is_slurm(state) else f"pid {state['pid']}"


def end(state: dict[str, Any]) -> None:
    """End a job wherever it runs: its process group here, or `scancel` on Slurm."""
    if slurm_jobs.is_slurm(state):
        slurm_jobs.cancel(state)
    else:
        terminate(state)


def _prepare(directory: Path, spec: dict[str, Any]) -> None:
    """A fresh start: the new spec, no old counters, the previous log kept as log.1."""
    write_json_atomic(directory / "spec.json", spec)
    (directory / "progress.json").unlink(missing_ok=True)
    if (directory / "log").exists():
        os.replace(directory / "log", directory / "log.1")


def _spawn(directory: Path, spec: dict[str, Any], release: Path) -> int:
    python_path = os.pathsep.join(filter(None, [str(release), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
    with open(directory / "log", "ab") as log:
        # A new session: no controlling terminal, no SIGHUP when the SSH session ends.
        process = subprocess.Popen(
            [sys.executable, "-m", "remote.supervisor", str(directory)],
            cwd=release, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    write_json_atomic(directory / "state.json", {
        "dataset": spec["dataset"],
        "stage": spec["stage"],
        "state": JobState.RUNNING.value,
        "pid": process.pid,
        "pid_start": process_start(process.pid),
        "release": release.name,
        "started_at": time.time(),
        "stall_after": spec.get("stall_after", 600),
    })
    return process.pid


def terminate(state: dict[str, Any], grace: float = 10.0) -> None:
    """End the job's whole process group: TERM, then KILL after `grace` seconds."""
    if not is_alive(state):
        return
    pgid = state["pid"]  # the supervisor leads its own session and process group
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while is_alive(state) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop(root: Path, dataset: str, stage: str) -> dict[str, Any]:
    directory = job_dir(root, dataset, stage)
    with locked(directory / "launch.lock"):
        state = read_json(directory / "state.json", {})
        progress = read_json(directory / "progress.json", {})
        was_alive = is_active(state, effective_state(state, progress, time.time()) if state else None)
        if was_alive:
            end(state)
        # The supervisor records `stopped` itself; write it only if it could not.
        state = read_json(directory / "state.json", {})
        if was_alive and not JobState(state["state"]).is_terminal():
            state.update(state=JobState.STOPPED.value, ended_at=time.time(), message="stopped by inv stop")
            write_json_atomic(directory / "state.json", state)
    return {"dataset": dataset, "stage": stage, "stopped": was_alive}
