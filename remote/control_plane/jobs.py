"""Jobs on the host: launch, describe, stop, over the job store and each job's executor.

Where each job's files lie is `remote.vocabulary.layout`'s, their checked reading `remote.control_plane.store`'s;
where a job runs (a detached supervisor here, or Slurm) is its executor's
(`remote.control_plane.executors`). Only the supervisor writes ``state.json`` while it lives;
launch writes the first one and `stop` the last one when the supervisor is
already gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from remote.control_plane import executors, freshness, processes
from remote.vocabulary import layout
from remote.control_plane.logfile import last_line
from remote.control_plane.store import BrokenJob, HostError, Job, JobStore
from remote.vocabulary.states import JobState

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Callable

HEARTBEAT_SECONDS = 5.0
#: Why a launch skips a job (`keep_done`) whose output stands for the spec it is given.
UP_TO_DATE = "is up to date: it has succeeded with these settings, after what it reads; its output is kept"


def all_job_dirs(root: Path) -> list[Path]:
    return JobStore(root).directories()


# -- reading -----------------------------------------------------------------


def read(job: Job, now: float, views: dict[str, Any] | None = None) -> tuple[Job, executors.Reading]:
    """The job's state now, from its record and its executor's view (`views`: by executor name), and
    the job as last read.

    Where the executor says the job has ended but the record does not, the record is read again. A
    supervisor records the end and then exits, so a record read before its exit and a check made
    after it would call a job that has just ended `died` (Slurm: "without the supervisor's record"),
    and `rerun --failed` or the pipeline runner would act on that. A read after the check sees the end.
    """
    for _ in range(3):  # a job handed on (starter → supervisor) may end between two reads as well
        reading = _reading(job, now, views)
        if not (reading.state.is_terminal() and job.state and not JobState(job.state["state"]).is_terminal()):
            break
        again = JobStore(layout.root_of(job.directory)).read(job.directory)
        if again.state == job.state:
            break
        job = again
    return job, reading


def _reading(job: Job, now: float, views: dict[str, Any] | None) -> executors.Reading:
    if not job.state:
        return executors.Reading(JobState.BROKEN, f"{layout.STATE} is empty")
    executor = executors.of(job.state)
    return executor.read(job.state, job.progress, now, (views or {}).get(executor.name))


def describe(directory: Path, now: float, views: dict[str, Any] | None = None, job: Job | None = None) -> dict[str, Any]:
    """One job as the workstation shows it; a job that cannot be read is `broken`, with the reason."""
    try:
        job, reading = read(job or JobStore(layout.root_of(directory)).read(directory), now, views)
    except (BrokenJob, HostError, ValueError, KeyError, TypeError, OSError) as exc:
        return broken(directory, str(exc) if isinstance(exc, (BrokenJob, HostError)) else f"{type(exc).__name__}: {exc}")
    return {**_job_fields(job, reading), **reading.fields}


def broken(directory: Path, reason: str) -> dict[str, Any]:
    job = Job(directory, {}, {})
    return _job_fields(job, executors.Reading(JobState.BROKEN, f"broken: {reason}"))


def _job_fields(job: Job, reading: executors.Reading) -> dict[str, Any]:
    state, progress, directory = job.state, job.progress, job.directory
    skip_reasons = progress.get("skip_reasons", {})
    log_line = last_line(directory / layout.LOG)
    return {
        "dataset": directory.parent.name,
        "stage": directory.name,
        "state": reading.state.value,
        "records": progress.get("records") or 0,
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
        "blocked_by": reading.blocked_by,
        "pid": state.get("pid"),
        "message": reading.message or log_line,
        "log_line": log_line,
    }


def read_all(root: Path, directories: list[Path]) -> tuple[dict[Path, Job | str], dict[str, Any]]:
    """Every job read on its own (a reason in place of a broken one), and each executor's view of them."""
    store = JobStore(root)
    jobs: dict[Path, Job | str] = {}
    for directory in directories:
        try:
            jobs[directory] = store.read(directory)
        except BrokenJob as exc:
            jobs[directory] = str(exc)
    by_executor: dict[str, list[dict[str, Any]]] = {}
    for job in jobs.values():
        if isinstance(job, Job) and job.state:
            try:
                by_executor.setdefault(executors.of(job.state).name, []).append(job.state)
            except HostError:
                pass  # its own reading says so
    views = {name: executors.named(name).batch_view(states) for name, states in by_executor.items()}  # one query each
    return jobs, views


def describe_all(root: Path, directories: list[Path], now: float) -> list[dict[str, Any]]:
    jobs, views = read_all(root, directories)
    return [broken(d, job) if isinstance(job, str) else describe(d, now, views, job) for d, job in jobs.items()]


def status(root: Path) -> dict[str, Any]:
    now = time.time()
    link = root / "current"
    return {
        "now": now,
        "current_release": link.resolve().name if link.exists() else None,
        "jobs": describe_all(root, all_job_dirs(root), now),
    }


# -- launching and stopping --------------------------------------------------


def launch(root: Path, spec: dict[str, Any], only: set[JobState] | None = None, after: list[str] = [],
           unstick: bool = False, keep_done: bool = False,
           before_it_runs: Callable[[], None] | None = None) -> dict[str, Any]:
    """Start one job with its executor (queued after the jobs `after`, where the executor queues), unless
    it runs already (or, with `only`, is in another state). `unstick`: also start again a job held for
    ever behind a failed one. `keep_done`: not over a job that has succeeded and is up to date
    (`remote.control_plane.freshness`; `inv launch` without --force): one out of date runs again, and its
    result says why (`out_of_date`). `before_it_runs`: called once the job is submitted, still under its
    lock, which its supervisor waits for: what it writes comes before anything the job writes."""

    def submit(directory: Path, release: Path) -> dict[str, Any]:
        submitted = executors.for_spec(spec).submit(directory, spec, release, after)
        if before_it_runs is not None:
            before_it_runs()
        return submitted

    return _launch_one(JobStore(root), spec, only, unstick, submit, keep_done=keep_done)


def launch_all(root: Path, specs: list[dict[str, Any]], each: Any = map, keep_done: bool = False) -> list[dict[str, Any]]:
    """`launch` of many jobs, answering without waiting for their supervisors to start: each job is
    checked and recorded (`starting`) here, then one detached starter starts them all (processes.Starter).
    Jobs of an executor that cannot wait so (Slurm: sbatch is the start) are launched one by one."""
    store = JobStore(root)
    release = store.current_release()
    if sum(executors.for_spec(s).detaches for s in specs) < 2:  # one fork saved is not worth a second process
        return list(each(lambda spec: launch(root, spec, keep_done=keep_done), specs))
    # NOTE: forked before any thread exists (`each` may start a pool): a fork copies only its caller.
    starter = processes.Starter(lambda directory: _start_handed(store, Path(directory), release))

    def record(spec: dict[str, Any]) -> dict[str, Any]:
        executor = executors.for_spec(spec)
        if not executor.detaches:
            return launch(root, spec, keep_done=keep_done)

        def starting(directory: Path, release: Path) -> dict[str, Any]:
            return {**executor.record_starting(directory, spec, release, starter), "directory": str(directory)}

        return _launch_one(store, spec, None, False, starting, release, keep_done=keep_done)

    results = list(each(record, specs))
    starter.hand_over([r.pop("directory") for r in results if "directory" in r])
    return results


def _launch_one(store: JobStore, spec: dict[str, Any], only: set[JobState] | None, unstick: bool,
                step: Callable[[Path, Path], dict[str, Any]], release: Path | None = None,
                keep_done: bool = False) -> dict[str, Any]:
    """What every launch does under the job's lock: the refusal check, a fresh start, then `step(directory,
    release)`, which submits the job or records it as starting (`release`: the current one when None)."""
    directory = store.directory(spec["dataset"], spec["stage"])
    directory.mkdir(parents=True, exist_ok=True)
    with store.locked(directory):
        stale = freshness.staleness(store.root, spec) if keep_done else {}
        if keep_done and not stale:
            return {**_result(spec), "reason": UP_TO_DATE, "up_to_date": True, "succeeded": True}
        refused = _refusal(directory, spec, only, unstick)
        if refused:
            return refused
        release = release or store.current_release()
        store.prepare(directory, spec)  # NOTE: the job's files only: its output stays until the new run replaces it
        why = {} if "state" in stale else {"out_of_date": stale}
        return {**_result(spec), "launched": True, **why, **step(directory, release)}


def _start_handed(store: JobStore, directory: Path, release: Path) -> None:
    """In the starter: start the job's supervisor, unless it was stopped or relaunched meanwhile."""
    with store.locked(directory):
        try:
            state = store.read(directory).state
        except BrokenJob:
            return
        if "pid" in state or (state.get("starting") or {}).get("pid") != os.getpid() or state.get("state") != "running":
            return  # started, relaunched or stopped meanwhile
        spec = store.spec(directory)
        executors.named(state["executor"]).submit(directory, spec, release, [])


def _result(spec: dict[str, Any]) -> dict[str, Any]:
    return {"dataset": spec["dataset"], "stage": spec["stage"], "launched": False}


def _refusal(directory: Path, spec: dict[str, Any], only: set[JobState] | None, unstick: bool) -> dict[str, Any] | None:
    """Why the job must not start now (under its lock), or None after ending what must end first."""
    # NOTE: decided under the lock: a concurrent rerun may have just relaunched it.
    try:
        job, reading = read(JobStore(layout.root_of(directory)).read(directory), time.time())
        reading = reading if job.state else None
    except BrokenJob:
        job, reading = None, executors.Reading(JobState.BROKEN)
    now_state = reading.state if reading else None
    stuck = unstick and bool(reading and reading.blocked_by)
    if only is not None and now_state not in only and not stuck:
        return {**_result(spec), "reason": f"is {now_state.value if now_state else 'not started'}"}
    if job is not None and job.state:
        previous = executors.of(job.state)
        if now_state == JobState.STALLED or stuck:
            previous.cancel(job.state)
        elif previous.is_active(job.state, now_state):
            return {**_result(spec), "reason": f"already running ({previous.who(job.state)})"}
        elif now_state == JobState.DIED:
            previous.cancel(job.state)  # a killed supervisor's stage may live on: never two runs at once
    return None


def terminate(state: dict[str, Any], grace: float = 10.0) -> None:
    """End the job wherever it runs, and what its stage left running."""
    if state:
        executors.of(state).cancel(state)


def stop(root: Path, dataset: str, stage: str) -> dict[str, Any]:
    store = JobStore(root)
    directory = store.directory(dataset, stage)
    result = {"dataset": dataset, "stage": stage, "stopped": False}
    with store.locked(directory):
        try:
            job = store.read(directory)
        except BrokenJob as exc:
            return {**result, "reason": f"broken: {exc}"}
        if not job.state:
            return result
        job, reading = read(job, time.time())
        executor, now_state = executors.of(job.state), reading.state
        active = executor.is_active(job.state, now_state)
        if not (active or now_state == JobState.DIED):
            return result
        store.request_stop(directory)  # before any signal: the supervisor tells `inv stop` from any other sender
        if not executor.cancel(job.state) and not active:  # a killed supervisor's stage, if any is left
            return result
        # The supervisor records `stopped` itself; write it only if it could not.
        try:
            state = store.read(directory).state
        except BrokenJob:
            state = job.state
        if not JobState(state["state"]).is_terminal() or now_state == JobState.DIED:
            state.update(state=JobState.STOPPED.value, ended_at=state.get("ended_at") or time.time(),
                         message="stopped by inv stop")
            store.write_state(directory, state)
    return {**result, "stopped": True}


def selected(root: Path, datasets: list[str] | None, stages: list[str] | None) -> list[Path]:
    """The job directories of `datasets` and `stages` (all of either where none is named)."""
    return [d for d in all_job_dirs(root)
            if (not datasets or d.parent.name in datasets) and (not stages or d.name in stages)]


def state_now(directory: Path) -> JobState:
    return JobState(describe(directory, time.time())["state"])
