"""`inv rerun`: the jobs in a bad state run again, each with the workstation's fresh spec if it sent
one, saying what changed in each since its last run (`changes`: by job, `remote.vocabulary.spec_changes`).

Jobs of an `inv run` pipeline are not relaunched one by one: the pipeline runner is, resumed, so that
dependencies and the GPU's exclusivity still hold. Where the executor queues jobs itself (Slurm), they
are submitted again in plan order instead.
"""

from __future__ import annotations

import time
from pathlib import Path

from remote.control_plane import executors, jobs
from remote.vocabulary import layout
from remote.control_plane.pool import each
from remote.control_plane.queue_order import submit_in_order
from remote.vocabulary.states import BAD, JobState
from remote.control_plane.store import BrokenJob, HostError, JobStore
from remote.orchestration.start import launch_runner

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any


def relaunch(args: dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
    """Relaunch the jobs in the states asked (`states`, the bad ones by default). With `rebuild`, a
    rerun of a pipeline's jobs first answers `{"rebuild": {"datasets", "route"}}` (the last `inv run`'s),
    relaunching nothing: the workstation rebuilds that pipeline from the inventory as it is now and asks
    again with it (`runner`), whose jobs then run with their new specs."""
    root = Path(args["root"])
    only = {JobState(s) for s in args.get("states", [s.value for s in BAD])}
    runner = args.get("runner")
    fresh = args.get("specs", {}) | plan_specs(runner)
    selected = jobs.selected(root, args.get("datasets"), args.get("stages"))
    described = {layout.key_of(d): job for d, job in zip(selected, jobs.describe_all(root, selected, time.time()))}
    planned = pipeline_keys(root)
    stopped = stopped_run(root)
    # NOTE: asked for only when a pipeline's job is to run again: other reruns stay one command.
    if args.get("rebuild") and runner is None:
        to_run = {key for key, job in described.items() if JobState(job["state"]) in only or job.get("blocked_by")}
        if any(_in_pipeline(root, key, planned) for key in to_run | stopped):
            run = last_run(root)
            if run:
                return {"rebuild": run}
    if any(_executor(d, fresh).queues for d in selected):
        return rerun_in_order(root, selected, described, only, fresh, runner)
    in_asked_state = {key for key, job in described.items() if JobState(job["state"]) in only} | stopped
    results = []
    if in_asked_state & (planned | {layout.RUNNER_KEY}):
        results.append(resume_pipeline(root, runner))

    def relaunch_one(directory: Path) -> dict[str, Any]:
        stored = stored_spec(directory)
        try:
            spec = fresh.get(layout.key_of(directory)) or JobStore(root).spec(directory)
        except BrokenJob as exc:
            return {"dataset": directory.parent.name, "stage": directory.name, "launched": False, "reason": f"broken: {exc}"}
        return {**jobs.launch(root, spec, only=only), "changes": {layout.key_of(directory): _changes(stored, spec)}}

    return results + each(relaunch_one, [d for d in selected if layout.key_of(d) not in planned | {layout.RUNNER_KEY}])


def stopped_run(root: Path) -> set[str]:
    """The jobs a stopped pipeline left to do (the runner, and its jobs stopped or never started): `inv rerun
    --failed` continues that run; none where the runner has not ended `stopped`."""
    planned = pipeline_keys(root)
    if not planned or jobs.state_now(layout.runner_dir(root)) != JobState.STOPPED:
        return set()
    return {layout.RUNNER_KEY} | {key for key in planned if jobs.state_now(layout.key_dir(root, key)) == JobState.STOPPED}


def _in_pipeline(root: Path, key: str, planned: set[str]) -> bool:
    """Part of the last `inv run`: its runner, a job of its plan, or a queued job that carries it (Slurm)."""
    return key in planned or key == layout.RUNNER_KEY or "built_from" in stored_spec(layout.key_dir(root, key))


def plan_specs(runner: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The specs of a rebuilt runner's jobs, by key."""
    plan = (runner or {}).get("config", {}).get("stage", {}).get("plan", [])
    return {node["key"]: node["spec"] for node in plan}


def stored_spec(directory: Path) -> dict[str, Any]:
    """The spec the job last ran with; {} when there is none to read."""
    try:
        return JobStore(layout.root_of(directory)).spec(directory)
    except BrokenJob:
        return {}


def _changes(stored: dict[str, Any], spec: dict[str, Any]) -> list[list[Any]]:
    from remote.vocabulary import spec_changes  # here: only a rerun compares specs

    return spec_changes.changes(stored, spec) if stored else []


def last_run(root: Path) -> dict[str, Any]:
    """The datasets and route of the last `inv run` (`{"datasets", "route"}`), from which the
    workstation rebuilds its jobs' specs for `inv rerun`; {} where none is recorded (no pipeline, or one
    started by an older release)."""
    run = stored_spec(layout.runner_dir(root)).get("config", {}).get("stage", {}).get("built_from")
    if isinstance(run, dict):
        return run
    for directory in jobs.all_job_dirs(root):  # a queued pipeline (Slurm) has no runner: each job says
        run = stored_spec(directory).get("built_from")
        if isinstance(run, dict):
            return run
    return {}


def _executor(directory: Path, fresh: dict[str, Any]) -> executors.Executor:
    """The job's executor: as recorded, else as its fresh spec names it."""
    try:
        state = JobStore(layout.root_of(directory)).read(directory).state
        if state:
            return executors.of(state)
    except (BrokenJob, HostError):
        pass
    return executors.for_spec(fresh.get(layout.key_of(directory), {}))


def rerun_in_order(root: Path, selected: list[Path], described: dict[str, dict[str, Any]], only: set[JobState],
                   fresh: dict[str, Any], runner: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Resubmit the bad jobs and, after them, their dependents held for ever behind a failed job
    (`blocked_by`): all in their first submission's order, an infer job with the rebuilt runner's server."""
    stuck = {k for k, job in described.items() if job.get("blocked_by")}
    again = [d for d in selected if layout.key_of(d) in stuck or JobState(described[layout.key_of(d)]["state"]) in only]
    specs, changed = [], {}
    for directory in again:
        stored = stored_spec(directory)
        spec = dict(fresh.get(layout.key_of(directory)) or stored)
        if not spec:
            continue
        for key in ("after", "order", "built_from", "server"):
            if key in stored:
                spec.setdefault(key, stored[key])
        if "server" in stored and runner:
            spec["server"] = runner["config"]["stage"].get("server")
        changed[layout.key_of(directory)] = _changes(stored, spec)
        specs.append(spec)
    specs.sort(key=lambda spec: spec.get("order", 0))
    results = submit_in_order(root, specs, only, unstick=True)
    return [{**r, "changes": {key: changed.get(key, [])}} for r in results
            for key in [layout.job_key(r["dataset"], r["stage"])]]


def pipeline_keys(root: Path) -> set[str]:
    try:
        spec = JobStore(root).spec(layout.runner_dir(root))
        return {node["key"] for node in spec.get("config", {}).get("stage", {}).get("plan", [])}
    except (BrokenJob, AttributeError, KeyError, TypeError):
        return set()


def resume_pipeline(root: Path, runner: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restart the runner (not its jobs, which live in sessions of their own) to carry on: with `runner`
    (rebuilt from the inventory as it is now) in place of its stored spec. It says which jobs it runs
    again (`reruns`) and what changed in each since its last run (`changes`)."""
    store = JobStore(root)
    directory = layout.runner_dir(root)
    spec = runner or store.spec(directory)
    spec["config"]["stage"]["fresh"] = False
    again = [node for node in spec["config"]["stage"]["plan"]
             if jobs.describe(layout.key_dir(root, node["key"]), time.time())["state"] != JobState.SUCCEEDED.value]
    # NOTE: compared before the runner starts: it rewrites each job's spec as it launches it.
    changes = {node["key"]: _changes(stored_spec(layout.key_dir(root, node["key"])), node["spec"]) for node in again}
    with store.locked(directory):
        try:
            previous = store.read(directory).state
        except BrokenJob:
            previous = {}  # a broken record: launch starts it afresh
        if previous.get("state") in (JobState.RUNNING.value, JobState.STALLED.value):
            # A runner still ending its run (its last job failed a moment ago) is stopped on purpose:
            # asked first, so it ends `stopped` rather than `died`; gone before the new one starts.
            store.request_stop(directory)
        jobs.terminate(previous)
    return {**launch_runner(root, spec, again), "reruns": [node["key"] for node in again], "changes": changes}
