"""Whether a succeeded job is up to date, make's rule over the host's records: a job's output stands for
the spec it ran with and for what it read then. It is out of date when the spec the workstation now
builds differs in a setting (`spec_changes`, which also says which keys are bookkeeping), when a job
whose output it reads succeeded after it started, or when a file outside the root that it reads (a
dataset's file, a draft named by path) changed after it started. `inv launch`, `inv eval` and `inv run`
run an out-of-date job again and skip an up-to-date one unless forced; the old output stays until the
new run succeeds, as every stage writes under temporary names and renames into place.

Standard library only (the control plane's rule).
"""

from __future__ import annotations

import os
from pathlib import Path

from remote.vocabulary import layout, spec_changes
from remote.vocabulary.states import RUNNER, RUNNER_STAGE, JobState
from remote.control_plane.store import BrokenJob, JobStore

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Iterator

#: What a dataset's stage reads when its spec names no folder (`StageContext.inputs`): the same dataset's stage.
DEFAULT_READS = {"infer": "prep", "extract": "prep"}
#: A path longer than this is no path a spec names (a command line, a prompt).
PATH_LIMIT = 4096


def staleness(root: Path, spec: dict[str, Any], needs: list[str] | tuple[str, ...] = (),
              again: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Why the succeeded job of `spec` is out of date, `{}` when it is up to date; a job that has not
    succeeded is out of date as ``{"state": ...}``. Of the others, each reason present:

    ``changes``: ``[path, before, after]`` per setting (`spec_changes.changes`);
    ``rebuilt``: the jobs it reads (`needs`, and those whose output its spec names) that succeeded after
    it started, or that run again in this run (`again`, the ones before it in a plan);
    ``changed_files``: the files outside the root it names that changed after it started.
    """
    store = JobStore(root)
    directory = store.directory(spec["dataset"], spec["stage"])
    try:
        state = store.read(directory).state
        if state.get("state") != JobState.SUCCEEDED.value or not state.get("started_at"):
            return {"state": state.get("state") or "not started"}
        stored = store.spec(directory)
    except BrokenJob:
        return {"state": JobState.BROKEN.value}
    started = float(state["started_at"])
    reads = sorted((set(needs) | set(upstream_keys(root, spec))) - {layout.key_of(directory)})
    found = {
        "changes": spec_changes.changes(stored, spec),
        "rebuilt": [key for key in reads if key in again or _ended_after(store, key, started)],
        "changed_files": [path for path in outside_paths(root, spec) if _changed_after(Path(path), started)],
    }
    return {reason: value for reason, value in found.items() if value}


def prune(root: Path, plan: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
    """A pipeline's plan less its up-to-date jobs, the needs on them dropped (met: they succeeded), and
    the keys of those left out and why each job kept is out of date (succeeded jobs only). The plan's
    order puts a job after its needs, so a job after one that runs again runs again too."""
    kept, current, stale, again = [], [], {}, set()
    for node in plan:
        why = staleness(root, node["spec"], node["needs"], again)
        if not why:
            current.append(node["key"])
            continue
        again.add(node["key"])
        if "state" not in why:
            stale[node["key"]] = why
        kept.append({**node, "needs": [need for need in node["needs"] if need not in current]})
    return kept, current, stale


def annotate(root: Path, status: dict[str, Any]) -> dict[str, Any]:
    """`inv status`'s jobs, each succeeded one with its settings' `fingerprint` and the jobs and files it
    reads that are newer than its run (`newer_inputs`), and the runner's row with what its last run was
    built from (`built_from`): the workstation, which alone knows what the inventory builds now, marks
    the jobs out of date (local/tasks/out_of_date.py)."""
    ended = {layout.job_key(j["dataset"], j["stage"]): j.get("ended_at") or 0 for j in status["jobs"]
             if j["state"] == JobState.SUCCEEDED.value}
    for job in status["jobs"]:
        if job["state"] != JobState.SUCCEEDED.value and (job["dataset"], job["stage"]) != (RUNNER, RUNNER_STAGE):
            continue
        try:
            spec = JobStore(root).spec(layout.job_dir(root, job["dataset"], job["stage"]))
        except BrokenJob:
            continue
        if job["dataset"] == RUNNER:
            job["built_from"] = ((spec.get("config") or {}).get("stage") or {}).get("built_from")
            continue
        started = job.get("started_at") or 0
        newer = [key for key in upstream_keys(root, spec) if ended.get(key, 0) > started]
        newer += [path for path in outside_paths(root, spec) if _changed_after(Path(path), started)]
        job.update(fingerprint=spec_changes.fingerprint(spec), **({"newer_inputs": newer} if newer else {}))
    return status


def upstream_keys(root: Path, spec: dict[str, Any]) -> list[str]:
    """The jobs whose output the spec reads: named by a path under the data root (``<data>/<dataset>/<stage>/...``),
    or, where it names none, the stage it reads by default."""
    data = str(layout.data_root(root)).rstrip("/") + "/"
    settings = {key: value for key, value in spec.items() if key not in spec_changes.BOOKKEEPING}
    keys = {layout.job_key(*text[len(data):].split("/")[:2]) for text in _strings(settings)
            if text.startswith(data) and text[len(data):].count("/") >= 1}
    if not keys and spec["stage"] in DEFAULT_READS:
        keys.add(layout.job_key(spec["dataset"], DEFAULT_READS[spec["stage"]]))
    return sorted(keys)


def outside_paths(root: Path, spec: dict[str, Any]) -> list[str]:
    """The files the job reads, outside the root (where no job's record says when they were made)."""
    inside = str(root).rstrip("/") + "/"
    return sorted({text for text in _strings(read_paths(spec)) if len(text) < PATH_LIMIT and text.startswith("/")
                   and not text.startswith(inside) and "\n" not in text and os.path.exists(text)})


def read_paths(spec: dict[str, Any]) -> list[Any]:
    """The settings that name what a job reads: its dataset's source, eval's drafts and prompts.
    NOTE: not every path of the spec: a server's environment may name a cache or a log it writes."""
    stage = (spec.get("config") or {}).get("stage") or {}
    return [spec.get("source"), stage.get("drafts"), stage.get("prompts")]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def _ended_after(store: JobStore, key: str, started: float) -> bool:
    try:
        state = store.read(layout.key_dir(store.root, key)).state
    except BrokenJob:
        return True  # what it read cannot be vouched for
    return state.get("state") == JobState.SUCCEEDED.value and float(state.get("ended_at") or 0) > started


def _changed_after(path: Path, started: float) -> bool:
    """The path, or for a folder one of its entries (a draft's weights), was written after `started`."""
    try:
        times = [path.stat().st_mtime]
        if path.is_dir():
            with os.scandir(path) as entries:
                times += [entry.stat().st_mtime for _, entry in zip(range(1000), entries)]
    except OSError:
        return False
    return max(times) > started
