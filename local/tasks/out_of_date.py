"""`inv status`'s out-of-date marks: a succeeded job whose settings differ from those the inventory builds
now, or that reads something newer than its run, is marked ``out_of_date`` (why, in words), and so is
every job of the pipeline after it. The host says what each job ran with (a fingerprint of its spec,
`remote.vocabulary.spec_changes.fingerprint`) and what is newer (`remote.control_plane.freshness.annotate`);
only the workstation knows the inventory, so the comparison is made here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from local.exceptions import AerieError
from local.jobs import pipeline, specs
from remote.vocabulary import layout
from remote.vocabulary.spec_changes import fingerprint
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE, JobState

if TYPE_CHECKING:
    from local.host.fleet import Fleet
    from local.inventory.values import Inventory


def marked(hosts: Fleet) -> Callable[[], dict[str, Any]]:
    """`hosts.status`, its jobs marked out of date against each host's inventory."""

    def fetch() -> dict[str, Any]:
        state = hosts.status()
        for name, host in hosts.hosts.items():
            mark([j for j in state["jobs"] if j.get("host", "") == name], host.inventory)
        return state

    return fetch


def mark(jobs: list[dict[str, Any]], inventory: Inventory) -> None:
    """Add ``out_of_date`` (why) to each succeeded job of `jobs` (one host's) that is no longer up to date."""
    by_key = {layout.job_key(j["dataset"], j["stage"]): j for j in jobs}
    ran = {key: (job["dataset"], job["stage"]) for key, job in by_key.items()
           if job["state"] == JobState.SUCCEEDED.value and "fingerprint" in job}
    if not ran:  # only a job that succeeded can be out of date: no spec to build
        return
    runner = by_key.get(layout.job_key(RUNNER, RUNNER_STAGE), {})
    built, needs = expected(inventory, runner.get("built_from"), ran)
    for key, job in by_key.items():  # NOTE: in the host's order; the pipeline's order below
        reasons = _reasons(job, built.get(key))
        if reasons:
            job["out_of_date"] = "; ".join(reasons)
    for key, before in needs.items():  # the plan's order: a need comes before the jobs that need it
        job = by_key.get(key)
        stale = [need for need in before if by_key.get(need, {}).get("out_of_date")]
        if job and stale and job["state"] == JobState.SUCCEEDED.value and not job.get("out_of_date"):
            job["out_of_date"] = f"{', '.join(stale)} is out of date"


def _reasons(job: dict[str, Any], built: set[str] | None) -> list[str]:
    if job["state"] != JobState.SUCCEEDED.value or "fingerprint" not in job:
        return []
    reasons = ["settings changed"] if built and job["fingerprint"] not in built else []
    return reasons + [f"{name} is newer" for name in job.get("newer_inputs") or []]


def expected(inventory: Inventory, built_from: dict[str, Any] | None,
             ran: dict[str, tuple[str, str]]) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """The fingerprints of the specs the inventory builds now for the jobs `ran` (key: dataset, stage; a job
    launched alone and the same job in the pipeline may differ: either is up to date), and the pipeline's needs,
    in its order. The pipeline is the last run's datasets (those still in the inventory) and route. Only `ran`'s
    specs are built, alone and in the pipeline where it differs: every spec of a large inventory would cost
    `inv status` more than its round trip."""
    built: dict[str, set[str]] = {}
    stages = inventory.stage_names()
    for key, (name, stage) in ran.items():
        if name in inventory.datasets and stage in stages:  # the rest are the pipeline's own (tokenize, draft/...)
            built.setdefault(key, set()).add(fingerprint(specs.spec(inventory, name, stage)))
    last = [name for name in (built_from or {}).get("datasets", []) if name in inventory.datasets]
    route = (built_from or {}).get("route", "offline")
    plan = pipeline.steps(inventory, last or None, route) if inventory.datasets else []
    for step in plan:
        if step.key in ran and not (step.as_launched and step.key in built):
            built.setdefault(step.key, set()).add(fingerprint(step.build()))
    if layout.job_key(DRAFT, "eval") in ran:
        try:
            built[layout.job_key(DRAFT, "eval")] = {fingerprint(specs.eval_spec(inventory))}
        except AerieError:
            pass  # no target to evaluate: nothing to compare the last evaluation with
    return built, {step.key: step.needs for step in plan}
