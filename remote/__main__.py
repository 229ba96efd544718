"""The host's command line: ``python -m remote VERB 'JSON'``, one tagged JSON answer.

Run from the current release by the workstation (over SSH or locally). Every
verb takes one JSON object and prints one payload (`remote.wire`); a refusal is
``{"error": "..."}`` with exit code 2.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from remote import jobs
from remote.jobs import HostError
from remote.slurm import SlurmError
from remote.progress import read_json
from remote import slurm_jobs
from remote.slurm_jobs import NEVER
from remote.states import BAD, JobState
from remote.wire import emit


def status(args: dict[str, Any]) -> Any:
    return jobs.status(Path(args["root"]))


def each(work: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """`work` over the jobs in parallel: it overlaps the file system's rename latency, the forks
    and stop's waits. Each job has its own lock, so jobs never race with each other."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(work, items))


def launch(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    if any("after" in spec for spec in args["specs"]):
        return submit_in_order(root, args["specs"])
    return each(lambda spec: jobs.launch(root, spec), args["specs"])


def submit_in_order(root: Path, specs: list[dict[str, Any]], only: set[JobState] | None = None,
                    unstick: bool = False) -> list[dict[str, Any]]:
    """A pipeline on Slurm: each job submitted after the jobs it needs (`afterok`), in plan order.

    A needed job that is queued or running already is waited for by its Slurm id; one
    that has succeeded is not waited for at all.
    """
    ids: dict[str, str] = {}
    results = []
    for spec in specs:
        after = [ids.get(key) or _queued_id(root, key) for key in spec.get("after", [])]
        result = jobs.launch(root, spec, only=only, after=[a for a in after if a], unstick=unstick)
        if result.get("slurm_job_id"):
            ids[f"{spec['dataset']}/{spec['stage']}"] = result["slurm_job_id"]
        results.append(result)
    return results


def _queued_id(root: Path, key: str) -> str | None:
    state = read_json(root / "jobs" / key / "state.json", {})
    if state.get("slurm_job_id") and jobs.is_active(state, JobState(jobs.describe(root / "jobs" / key, time.time())["state"])):
        return state["slurm_job_id"]
    return None


def rerun(args: dict[str, Any]) -> Any:
    """Relaunch the jobs in a bad state, each with the workstation's fresh spec if it sent one.

    Jobs of an `inv run` pipeline are not relaunched one by one: the pipeline runner is,
    resumed, so that dependencies and the GPU's exclusivity still hold.
    """
    root = Path(args["root"])
    only = {JobState(s) for s in args.get("states", [s.value for s in BAD])}
    fresh = args.get("specs", {})
    selected = [d for d in jobs.all_job_dirs(root) if _selected(args, d.parent.name, d.name)]
    if any(read_json(d / "state.json", {}).get("slurm_job_id") for d in selected):
        return rerun_on_slurm(root, selected, only, fresh)
    planned = pipeline_keys(root)
    bad_planned = [d for d in selected if _key(d) in planned and _is_bad(d, only)]
    results = []
    if bad_planned or (RUNNER in map(_key, selected) and _is_bad(jobs.job_dir(root, *RUNNER.split("/")), only)):
        results.append(resume_pipeline(root))

    def relaunch(directory: Path) -> dict[str, Any]:
        spec = fresh.get(_key(directory)) or json.loads((directory / "spec.json").read_text())
        return jobs.launch(root, spec, only=only)

    return results + each(relaunch, [d for d in selected if _key(d) not in planned and _key(d) != RUNNER])


def rerun_on_slurm(root: Path, selected: list[Path], only: set[JobState], fresh: dict[str, Any]) -> list[dict[str, Any]]:
    """Resubmit the bad jobs and, after them, their dependents that Slurm holds for ever
    (an `afterok` on a failed job is never satisfied): all in their first submission's order."""
    now = time.time()
    view = slurm_jobs.view([read_json(d / "state.json", {}) for d in selected])  # one squeue for all
    described = {_key(d): jobs.describe(d, now, view) for d in selected}
    stuck = {k for k, job in described.items() if job["state"] == "waiting" and NEVER in (job["message"] or "")}
    again = [d for d in selected if _key(d) in stuck or JobState(described[_key(d)]["state"]) in only]
    specs = [fresh.get(_key(d)) or read_json(d / "spec.json") for d in again]
    for spec, directory in zip(specs, again):
        stored = read_json(directory / "spec.json", {})
        spec.setdefault("after", stored.get("after", []))
        spec.setdefault("order", stored.get("order", 0))
    specs.sort(key=lambda spec: spec.get("order", 0))
    return submit_in_order(root, specs, only, unstick=True)


RUNNER = "pipeline/run"


def _key(directory: Path) -> str:
    return f"{directory.parent.name}/{directory.name}"


def _is_bad(directory: Path, only: set[JobState]) -> bool:
    return JobState(jobs.describe(directory, time.time())["state"]) in only


def pipeline_keys(root: Path) -> set[str]:
    spec = read_json(jobs.job_dir(root, "pipeline", "run") / "spec.json", {})
    return {node["key"] for node in spec.get("config", {}).get("stage", {}).get("plan", [])}


def resume_pipeline(root: Path) -> dict[str, Any]:
    """Restart the runner (not its jobs, which live in sessions of their own) to carry on."""
    directory = jobs.job_dir(root, "pipeline", "run")
    spec = read_json(directory / "spec.json")
    spec["config"]["stage"]["fresh"] = False
    with jobs.locked(directory / "launch.lock"):
        jobs.terminate(read_json(directory / "state.json", {}))
    return jobs.launch(root, spec)


def stop(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    selected = [d for d in jobs.all_job_dirs(root) if _selected(args, d.parent.name, d.name)]
    return each(lambda d: jobs.stop(root, d.parent.name, d.name), selected)


def _selected(args: dict[str, Any], dataset: str, stage: str) -> bool:
    return (not args.get("datasets") or dataset in args["datasets"]) and (
        not args.get("stages") or stage in args["stages"]
    )


def logs(args: dict[str, Any]) -> None:
    """Print the job's log tail, then (with follow) new lines until the job ends. Raw text, no payload."""
    directory = _log_dir(Path(args["root"]), args["dataset"], args.get("stage"))
    path = directory / "log"
    with open(path, "rb") as handle:
        lines = handle.read().splitlines(keepends=True)
        sys.stdout.buffer.write(b"".join(lines[-args.get("lines", 50):]))
        sys.stdout.flush()
        while args.get("follow"):
            chunk = handle.read()
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            elif JobState(jobs.describe(directory, time.time())["state"]).is_terminal():
                return
            else:
                time.sleep(0.25)


def _log_dir(root: Path, dataset: str, stage: str | None) -> Path:
    candidates = [d for d in jobs.all_job_dirs(root) if d.parent.name == dataset and stage in (None, d.name)]
    if not candidates:
        raise HostError(f"no job for dataset {dataset}{' stage ' + stage if stage else ''} under {root}")
    # Without a stage, the most recently started job of the dataset.
    return max(candidates, key=lambda d: json.loads((d / "state.json").read_text()).get("started_at", 0))


def check(args: dict[str, Any]) -> Any:
    from remote import check as checks

    return checks.run(args)


def assets(args: dict[str, Any]) -> Any:
    """Build the demo's tiny target (tokenizer and random Llama) offline, unless it is there."""
    out = Path(args["root"]) / "assets" / "tiny-target"
    if (out / "config.json").exists():
        return {"path": str(out), "built": False}
    from remote import tiny_model, tiny_tokenizer

    building = out.with_name(out.name + ".tmp")
    shutil.rmtree(building, ignore_errors=True)  # left by an interrupted build
    tiny_tokenizer.build_tokenizer(building)
    tiny_model.main([str(building), "--tokenizer", str(building)])
    os.replace(building, out)
    return {"path": str(out), "built": True}


VERBS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "status": status,
    "launch": launch,
    "rerun": rerun,
    "stop": stop,
    "logs": logs,
    "check": check,
    "assets": assets,
}


def main(argv: list[str]) -> int:
    verb, args = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    if verb not in VERBS:
        emit({"error": f"unknown verb {verb!r}: expected one of {', '.join(VERBS)}"})
        return 2
    try:
        result = VERBS[verb](args)
    except (HostError, SlurmError) as exc:  # a refusal, or Slurm's own one-line error
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
