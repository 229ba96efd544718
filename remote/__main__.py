"""The host's command line: ``python -m remote VERB 'JSON'``, one tagged JSON answer.

Run from the current release by the workstation (over SSH or locally). Every
verb takes one JSON object and prints one payload (`remote.control_plane.wire`); a refusal is
``{"error": "..."}`` with exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from remote.control_plane import eta, executors, gpus, jobs, layout, logfile, secrets
from remote.control_plane.states import BAD, DRAFT, JobState
from remote.control_plane.store import BrokenJob, HostError, JobStore
from remote.control_plane.wire import emit

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Callable


def status(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    from remote.control_plane import freshness

    query = gpus.Query()  # nvidia-smi answers while the jobs are read
    state = freshness.annotate(root, eta.annotate(root, jobs.status(root)))  # what is newer than each job's run
    return gpus.annotate(root, state, query)  # time left and GPUs: one round trip


def each(work: Callable[[Any], Any], items: list[Any], threads: int = 8) -> list[Any]:
    """`work` over the jobs on a few threads, the results in order: it overlaps the file system's
    rename latency, the forks and stop's waits. Each job has its own lock, so jobs never race with
    each other. Every item is worked even when one fails; the first failure is raised after.

    Plain threads, each taking every `threads`-th item: `concurrent.futures` (with the `logging` it
    imports) takes longer to import than a launch of 40 jobs takes to record them."""
    import threading

    results: list[Any] = [None] * len(items)
    failures: list[BaseException] = []

    def share(first: int) -> None:
        for index in range(first, len(items), threads):
            try:
                results[index] = work(items[index])
            except BaseException as exc:  # noqa: BLE001 — raised below, in the caller's thread
                failures.append(exc)

    workers = [threading.Thread(target=share, args=(first,)) for first in range(min(threads, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    return results


def launch(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    if any("after" in spec for spec in args["specs"]):
        return submit_in_order(root, args["specs"])
    # NOTE: a finished job is run again only when asked (`inv launch --force`): a relaunch replaces its output.
    return jobs.launch_all(root, args["specs"], each=each, keep_done=not args.get("force"))


def run(args: dict[str, Any]) -> Any:
    """`inv run`: the plan under the pipeline runner (a job itself), or, where the executor queues jobs
    itself (Slurm), every job queued at once after the jobs it needs (`queued`).

    Its up-to-date jobs are left out (`up_to_date`; all of them run with `force`), and it says why each
    succeeded job it runs again is out of date (`out_of_date`, `remote.control_plane.freshness`); with
    nothing out of date, no runner starts (`runner`: None)."""
    from remote.control_plane import freshness

    root, spec = Path(args["root"]), args["spec"]
    stage = spec["config"]["stage"]
    current: list[str] = []
    stale: dict[str, Any] = {}
    if not args.get("force"):
        stage["plan"], current, stale = freshness.prune(root, stage["plan"])
    found = {"up_to_date": current, "out_of_date": stale}
    if not stage["plan"]:
        return {"runner": None, **found}
    return {**_start_pipeline(root, spec), **found}


def _start_pipeline(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    stage = spec["config"]["stage"]
    plan = stage["plan"]
    if plan and all(executors.for_spec(node["spec"]).queues for node in plan):
        # NOTE: no runner: the queue keeps the order, its resources keep the GPUs exclusive, and an
        # infer job starts its own server inside its allocation.
        specs = [node["spec"] | {"after": node["needs"], "order": index, "built_from": stage.get("built_from")}
                 | ({"server": stage.get("server")} if node["server"] else {})
                 for index, node in enumerate(plan)]
        return {"queued": submit_in_order(root, specs)}
    return {"runner": launch_runner(root, spec, plan)}


def launch_runner(root: Path, spec: dict[str, Any], plan: list[dict[str, Any]]) -> dict[str, Any]:
    """Start the runner, with the jobs of `plan` it is to run recorded `waiting` on it before it runs
    and before the answer: nothing shows the last run's end states as this run's (the first frame the
    workstation draws, a `wait_state` right after the command), and no record of the queue lands over
    one the runner wrote (a job it started, and which may have ended already)."""
    from remote.orchestration import runner  # here: only a run needs it

    def queue() -> None:
        runner.queue(root, plan, JobStore(root).read(layout.runner_dir(root)).state)

    return jobs.launch(root, spec, before_it_runs=queue)


def submit_in_order(root: Path, specs: list[dict[str, Any]], only: set[JobState] | None = None,
                    unstick: bool = False) -> list[dict[str, Any]]:
    """A pipeline on an executor that queues jobs (Slurm): each job submitted after the jobs it needs
    (`afterok`), in plan order.

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


def rerun(args: dict[str, Any]) -> Any:
    """Relaunch the jobs in a bad state, each with the workstation's fresh spec if it sent one, and
    say what changed in each since its last run (`changes`: by job, `remote.control_plane.spec_changes`).
    With `rebuild`, a rerun of a pipeline's jobs first answers `{"rebuild": {"datasets", "route"}}` (the
    last `inv run`'s), relaunching nothing: the workstation rebuilds that pipeline from the inventory as
    it is now and asks again with it (`runner`).

    Jobs of an `inv run` pipeline are not relaunched one by one: the pipeline runner is,
    resumed, so that dependencies and the GPU's exclusivity still hold; with `runner` (its spec
    rebuilt from the inventory as it is now), it runs the jobs with their new specs. Where the
    executor queues jobs itself (Slurm), they are submitted again in plan order instead.
    """
    root = Path(args["root"])
    only = {JobState(s) for s in args.get("states", [s.value for s in BAD])}
    runner = args.get("runner")
    fresh = args.get("specs", {}) | plan_specs(runner)
    selected = [d for d in jobs.all_job_dirs(root) if _selected(args, d.parent.name, d.name)]
    described = {layout.key_of(d): job for d, job in zip(selected, jobs.describe_all(root, selected, time.time()))}
    planned = pipeline_keys(root)
    bad = {key for key, job in described.items() if JobState(job["state"]) in only or job.get("blocked_by")}
    bad |= stopped_run(root)
    # NOTE: asked for only when a pipeline's job is to run again: other reruns stay one command.
    if args.get("rebuild") and runner is None and any(_in_pipeline(root, key, planned) for key in bad):
        run = last_run(args)
        if run:
            return {"rebuild": run}
    if any(_executor(d, fresh).queues for d in selected):
        return rerun_in_order(root, selected, described, only, fresh, runner)
    bad = {key for key, job in described.items() if JobState(job["state"]) in only} | stopped_run(root)
    results = []
    if bad & (planned | {layout.RUNNER_KEY}):
        results.append(resume_pipeline(root, runner))

    def relaunch(directory: Path) -> dict[str, Any]:
        stored = stored_spec(directory)
        try:
            spec = fresh.get(layout.key_of(directory)) or JobStore(root).spec(directory)
        except BrokenJob as exc:
            return {"dataset": directory.parent.name, "stage": directory.name, "launched": False, "reason": f"broken: {exc}"}
        return {**jobs.launch(root, spec, only=only), "changes": {layout.key_of(directory): _changes(stored, spec)}}

    return results + each(relaunch, [d for d in selected if layout.key_of(d) not in planned | {layout.RUNNER_KEY}])


def stopped_run(root: Path) -> set[str]:
    """The jobs a stopped pipeline left to do (the runner, and its jobs stopped or never started): `inv rerun
    --failed` continues that run; none where the runner has not ended `stopped`."""
    planned = pipeline_keys(root)
    if not planned or _state(layout.runner_dir(root)) != JobState.STOPPED:
        return set()
    return {layout.RUNNER_KEY} | {key for key in planned if _state(layout.key_dir(root, key)) == JobState.STOPPED}


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
    from remote.control_plane import spec_changes  # here: only a rerun compares specs

    return spec_changes.changes(stored, spec) if stored else []


def last_run(args: dict[str, Any]) -> dict[str, Any]:
    """The datasets and route of the last `inv run` (`{"datasets", "route"}`), from which the
    workstation rebuilds its jobs' specs for `inv rerun`; {} where none is recorded (no pipeline, or one
    started by an older release)."""
    root = Path(args["root"])
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


def stop(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    selected = [d for d in jobs.all_job_dirs(root) if _selected(args, d.parent.name, d.name)]
    return each(lambda d: jobs.stop(root, d.parent.name, d.name), selected)


def _selected(args: dict[str, Any], dataset: str, stage: str) -> bool:
    return (not args.get("datasets") or dataset in args["datasets"]) and (
        not args.get("stages") or stage in args["stages"]
    )


def logs(args: dict[str, Any]) -> None:
    """Print the last lines of the job's log, then (with follow) what it adds until the job ends. Raw
    bytes, no payload; a line longer than logfile.LINE_LIMIT shows its end after an `[aerie: line cut, ...]` marker."""
    directory = _log_dir(Path(args["root"]), args["dataset"], args.get("stage"))
    path = directory / layout.LOG
    # A Slurm job writes its log only once it leaves the queue: follow waits for it to appear.
    while True:
        job = jobs.describe(directory, time.time())
        if job["state"] == JobState.BLOCKED.value:  # any log there is an earlier run's: say why none is new
            said = str(job["message"] or "")
            if not said.startswith("blocked by"):  # Slurm's word for it: the needs are the record's
                said = f"blocked by {', '.join(job.get('blocked_by') or [])}" + (f" ({said})" if said else "")
            raise HostError(f"{layout.key_of(directory)} has no log: it never started, {said}; "
                            "fix that, then `inv rerun --failed`")
        if path.exists():
            break
        if not args.get("follow") or JobState(job["state"]).is_terminal():
            raise HostError(f"{layout.key_of(directory)} has no log yet (it is {job['state']})")
        time.sleep(0.25)

    # NOTE: read from the end, a block at a time: a log may be far larger than the host's memory, and a
    # line longer than logfile.LINE_LIMIT (a progress bar without newlines) keeps only its end.
    with open(path, "rb") as handle:
        end = logfile.write_last_lines(handle, args.get("lines", 50), _write)
        if args.get("follow"):
            logfile.follow(path, handle, end, lambda: _state(directory).is_terminal(), _write)


def _state(directory: Path) -> JobState:
    return JobState(jobs.describe(directory, time.time())["state"])


def _write(text: bytes) -> None:
    sys.stdout.buffer.write(text)
    sys.stdout.flush()


def _log_dir(root: Path, dataset: str, stage: str | None) -> Path:
    candidates = [d for d in jobs.all_job_dirs(root) if d.parent.name == dataset and stage in (None, d.name)]
    if not candidates:
        raise HostError(f"no job for dataset {dataset}{' stage ' + stage if stage else ''} under {root}")
    # Without a stage, the most recently started job of the dataset.
    return max(candidates, key=lambda d: jobs.describe(d, time.time()).get("started_at") or 0)


def check(args: dict[str, Any]) -> Any:
    from remote import preflight, readiness

    return preflight.run(args) + readiness.checks(args)


def plan(args: dict[str, Any]) -> Any:
    """`inv plan`'s figures, and what `inv run` would refuse to start on (`remote.readiness`)."""
    from remote import readiness, sizing

    try:
        return {**sizing.plan(args), "refusals": readiness.refusals(args)}
    except sizing.PlanError as exc:
        raise HostError(str(exc)) from None


def assets(args: dict[str, Any]) -> Any:
    """Build the demo's tiny target (tokenizer and a Llama wired to recite, `remote.demo.tiny_model`)
    offline, unless it is there."""
    from remote.demo import tiny_model

    out = Path(args["root"]) / "assets" / "tiny-target"
    # NOTE: a target without the recital file is an older demo's random one: its draft cannot learn.
    if (out / "config.json").exists() and (out / tiny_model.RECITAL_FILE).exists():
        return {"path": str(out), "built": False}
    import shutil

    from remote.demo import tiny_tokenizer

    building = out.with_name(out.name + ".tmp")
    shutil.rmtree(building, ignore_errors=True)  # left by an interrupted build
    tiny_tokenizer.build_tokenizer(building)
    tiny_model.main([str(building), "--tokenizer", str(building), "--recite", tiny_model.DEMO_RECITAL])
    shutil.rmtree(out, ignore_errors=True)
    os.replace(building, out)
    return {"path": str(out), "built": True}


def eval_report(args: dict[str, Any]) -> Any:
    """The last `inv eval` report (remote/stages/eval.py)."""
    from remote.control_plane.progress import read_json

    report = read_json(layout.output_dir(Path(args["root"]), DRAFT, "eval") / "report.json")
    if report is None:
        raise HostError("no eval report on the host: the draft/eval job has not succeeded")
    return report


VERBS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "status": status,
    "launch": launch,
    "run": run,
    "rerun": rerun,
    "stop": stop,
    "logs": logs,
    "check": check,
    "assets": assets,
    "eval_report": eval_report,
    "plan": plan,
}


def main(argv: list[str]) -> int:
    verb, given = argv[0], argv[1] if len(argv) > 1 else "{}"
    args = json.loads(sys.stdin.read() if given == "-" else given)  # "-": too long for one argument, or secrets
    secrets.hold(args)  # into this process's environment, which every job it starts inherits
    if verb not in VERBS:
        emit({"error": f"unknown verb {verb!r}: expected one of {', '.join(VERBS)}"})
        return 2
    try:
        result = VERBS[verb](args)
    except HostError as exc:  # a refusal, or Slurm's own one-line error (remote.control_plane.slurm.SlurmError)
        if verb == "logs":  # its stdout is the log itself
            print(exc, file=sys.stderr)
        else:
            emit({"error": str(exc)})
        return 2
    if result is not None:
        emit(result)
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1:]))
