"""`inv launch`, `inv rerun`, `inv stop` and `inv logs`: the verbs on jobs, one remote command per host each."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from local.console import line
from local.jobs import pipeline, specs
from local.visible import VisibleStream, visible
from remote.vocabulary.layout import job_key
from remote.vocabulary.states import BAD, DRAFT, RUNNER

if TYPE_CHECKING:
    from rich.console import Console

    from local.host.verbs import RemoteHost
    from local.inventory.values import Inventory


def mine(host: RemoteHost, datasets: list[str] | None) -> list[str] | None:
    """Of the datasets named for the whole inventory, those this host runs (None: all of its own)."""
    return None if datasets is None else [d for d in datasets if d in host.inventory.datasets]


def launch(host: RemoteHost, console: Console, stage: str, datasets: list[str] | None,
           force: bool = False) -> list[dict[str, Any]]:
    """One job per dataset; a succeeded one only with `force` (its output stays until the new run succeeds)."""
    names = mine(host, datasets)
    if names == [] or not host.inventory.datasets:
        return []
    results = host.call("launch", specs=specs.specs(host.inventory, stage, names), force=force)
    report(console, [_with_force_hint(r) for r in results], "launched")
    for said in out_of_date_lines({job_key(r["dataset"], r["stage"]): r["out_of_date"] for r in results
                                   if r.get("out_of_date")}):
        console.print(line(f"  {said}"))
    return results


def _with_force_hint(result: dict[str, Any]) -> dict[str, Any]:
    """A job kept because it is up to date names the flag that runs it again."""
    if not result.get("succeeded"):
        return result
    return {**result, "reason": f"{result['reason']}; `inv launch --stage {result['stage']} "
                                f"--dataset {result['dataset']} --force` runs it again"}


def out_of_date_lines(stale: dict[str, dict[str, Any]]) -> list[str]:
    """Why each succeeded job runs again (`remote.control_plane.freshness`), a line each:
    `A1/extract is out of date: stages.extract.layers [2] -> [1]; it reads A1/prep, which is newer or runs again`."""
    said = []
    for key, why in stale.items():
        dataset, _, stage = key.partition("/")
        reasons = [f"{visible(specs.inventory_key(dataset, stage, path))} {change(before, after)}"
                   for path, before, after in why.get("changes", [])]
        reasons += [f"it reads {visible(need)}, which is newer or runs again" for need in why.get("rebuilt", [])]
        reasons += [f"{visible(path)} changed after it ran" for path in why.get("changed_files", [])]
        said.append(f"{visible(key)} is out of date: {'; '.join(reasons)}")
    return said


def rerun(host: RemoteHost, console: Console, datasets: list[str] | None, stages: list[str] | None) -> list[dict[str, Any]]:
    inventory = host.inventory
    names = mine(host, datasets)
    if names == []:
        return []
    request = {"specs": specs.all_specs(inventory), "states": sorted(s.value for s in BAD), "datasets": names,
               "stages": stages}
    results = host.call("rerun", **request, rebuild=True)
    if isinstance(results, dict):  # the host asks for the last `inv run`'s pipeline, rebuilt: then it reruns
        rebuilt = rebuilt_pipeline(host, console, results["rebuild"])
        if rebuilt:  # checked as `inv run` checks it: a fix that is itself wrong is told now, not by failed jobs
            from local.tasks import planning  # here: its tables import rich, which launch, stop and logs never need

            planning.require_ready(host, results["rebuild"]["datasets"])
        results = host.call("rerun", **request, **rebuilt)
    relaunched = [r for r in results if r["launched"]]
    report(console, relaunched, "relaunched")
    report_changes(console, relaunched)
    _note_unserved(host, console, relaunched)
    if not relaunched:
        console.print(f"Nothing to rerun: no job is {', '.join(sorted(s.value for s in BAD))}.")
    return relaunched


def rebuilt_pipeline(host: RemoteHost, console: Console, last: dict[str, Any]) -> dict[str, Any]:
    """The last `inv run`'s runner rebuilt from the inventory as it is now, from its datasets and route
    (`last`, as the host recorded them), so that a rerun of its jobs runs with what was fixed."""
    inventory = host.inventory
    gone = [name for name in last["datasets"] if name not in inventory.datasets]
    if gone:  # NOTE: not refused: the rerun may be of jobs outside that pipeline
        console.print(line((f"note: the last `inv run` on {host.name} had {', '.join(map(visible, gone))}, no longer "
                             f"in {inventory.path}: its jobs rerun with the specs of their last run; `inv run` starts "
                             f"afresh over the datasets the inventory has", "yellow")))
        return {}
    route = inventory.stages.extract.route
    if route not in ("auto", last["route"]):
        console.print(line((f"note: stages.extract.route is now {route}; this rerun keeps the last run's route, "
                             f"{visible(last['route'])} (`inv run` takes the new one)", "yellow")))
    return {"runner": pipeline.runner_spec(inventory, last["datasets"], last["route"])}


def report_changes(console: Console, relaunched: list[dict[str, Any]]) -> None:
    """What each rerun job runs with that its last run did not: `A1/extract: stages.extract.layers [2] -> [1]`."""
    for result in relaunched:
        if result.get("reruns"):
            console.print(line(f"  it runs again: {visible(', '.join(result['reruns']))}"))
    changes = [(key, change) for r in relaunched for key, found in (r.get("changes") or {}).items() for change in found]
    for key, (path, before, after) in changes:
        dataset, _, stage = key.partition("/")
        console.print(line(f"  {visible(key)}: {visible(specs.inventory_key(dataset, stage, path))} "
                            f"{change(before, after)}"))
    if relaunched and not changes:
        console.print("No setting changed since these jobs last ran.")


def _note_unserved(host: RemoteHost, console: Console, relaunched: list[dict[str, Any]]) -> None:
    """An infer job relaunched on its own (started by `inv launch`, not by `inv run`) gets no managed
    server: only the pipeline's runner starts `stages.infer.server_command` (on Slurm, the job itself)."""
    infer = host.inventory.stages.infer
    alone = [job_key(r["dataset"], "infer") for r in relaunched if r["stage"] == "infer"]
    if alone and infer.server_command and host.inventory.executor == "process":
        console.print(line((f"note: {visible(', '.join(alone))} run on their own, not under `inv run`'s runner, which "
                             f"alone starts stages.infer.server_command: start the server, or `inv run` to have it "
                             f"started", "yellow")))


#: The most of one side of a change a line shows.
SHOWN = 80


def change(before: Any, after: Any) -> str:
    """`before -> after`, each as JSON of at most `SHOWN` characters; two long ones from a little before where they
    first differ, so that what changed shows (a long server command edited near its end), not the same start twice."""
    texts = ["(unset)" if value is None else json.dumps(value, ensure_ascii=False) for value in (before, after)]
    same = next((i for i, (a, b) in enumerate(zip(*texts)) if a != b), min(map(len, texts)))
    start = max(0, same - SHOWN // 4) if max(map(len, texts)) > SHOWN else 0
    shown = [("…" if start else "") + text[start:] for text in texts]
    return " -> ".join(visible(text if len(text) <= SHOWN else text[:SHOWN - 1] + "…") for text in shown)


def report(console: Console, results: list[dict[str, Any]], verb: str) -> None:
    for result in results:
        job = visible(job_key(result["dataset"], result["stage"]))
        if result["launched"]:
            console.print(line(f"{verb} {job} ({visible(str(result['where']))})"))
        else:
            console.print(line((f"skipped {job}: {visible(str(result['reason']))}", "yellow")))


def logs(host: RemoteHost, dataset: str, stage: str | None, lines: int, follow: bool, raw: bool = False) -> None:
    """The log's end on stdout: its control characters shown (`␛[2J`), as `less` does, or as they are (`raw`)."""
    if dataset not in (DRAFT, RUNNER):  # the jobs of `inv run` that no dataset names
        host.inventory.select([dataset])
    out = sys.stdout.buffer if raw else VisibleStream(sys.stdout.buffer)
    try:
        host.stream("logs", out, dataset=dataset, stage=stage, lines=lines, follow=follow)  # type: ignore[arg-type]
    finally:
        if isinstance(out, VisibleStream):
            out.close()


def refuse_unknown(inventory: Inventory, names: list[str] | None) -> None:
    """A dataset the inventory does not name is refused, as launch and logs refuse it (the pipeline's
    own jobs, `pipeline` and `draft`, are names too)."""
    unknown = [n for n in names or [] if n not in (DRAFT, RUNNER)]
    if unknown:
        inventory.select(unknown)


def stop(host: RemoteHost, console: Console, datasets: list[str] | None, stages: list[str] | None) -> None:
    names = mine(host, datasets) if datasets and not set(datasets) & {DRAFT, RUNNER} else datasets
    results = host.call("stop", datasets=names, stages=stages) if names != [] else []
    stopped = [r for r in results if r["stopped"]]
    for result in results:
        job = visible(job_key(result["dataset"], result["stage"]))
        if result["stopped"]:
            console.print(line(f"stopped {job}"))
        elif result.get("reason"):  # a broken job: its processes cannot be known from its files
            console.print(line((f"not stopped {job}: {visible(str(result['reason']))}", "yellow")))
    if not stopped:
        console.print("Nothing to stop: no matching job is running.")
