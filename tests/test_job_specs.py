"""Every spec the workstation sends is a `JobSpec` from one builder: the same keys everywhere, keyed as the
host names jobs, and a stage's config without the settings the spec carries itself."""

from __future__ import annotations

from typing import Any

import pytest

from local.inventory.schema import load
from local.jobs import pipeline, specs
from remote.vocabulary import layout

ALL_KEYS = set(specs.JobSpec.__required_keys__ | specs.JobSpec.__optional_keys__)
#: The runner runs as a process of its own, uncapped; eval names no executor (the host's default).
RUNNER_KEYS = ALL_KEYS - {"log_limit", "slurm"}
EVAL_KEYS = ALL_KEYS - {"executor", "slurm"}


def plan_specs(route: str) -> dict[str, dict[str, Any]]:
    """The jobs `inv run` sends for `route`, by their plan's key (each checked to be the spec's job key)."""
    runner = pipeline.runner_spec(load("local"), None, route)
    assert set(runner) == RUNNER_KEYS and runner["executor"] == "process" and "command" not in runner["config"]
    jobs = {}
    for node in runner["config"]["stage"]["plan"]:
        assert node["key"] == layout.job_key(node["spec"]["dataset"], node["spec"]["stage"])
        jobs[node["key"]] = node["spec"]
    return jobs


@pytest.mark.parametrize("route", ["offline", "chunked", "online"])
def test_every_job_of_a_run_has_the_spec_s_keys_and_a_config_without_spec_only_settings(route: str) -> None:
    jobs = plan_specs(route)
    draft = {"offline": "draft/train", "chunked": "draft/chunked", "online": "draft/train"}[route]
    assert draft in jobs and ("sharegpt/extract" in jobs) == (route == "offline")
    for key, job in jobs.items():
        assert set(job) == ALL_KEYS, key
        assert not specs.SPEC_ONLY & set(job["config"]["stage"]), key
    if route == "chunked":
        nested = jobs[draft]["config"]["stage"]
        # it runs its extract and train itself: it must see their commands, never their stall limits
        assert all("command" in nested[s] and "stall_after" not in nested[s] for s in ("extract", "train"))


def test_launch_eval_and_rerun_send_the_same_record() -> None:
    inventory = load("local")
    for stage in inventory.stage_names() + ["tokenize"]:
        for job in specs.specs(inventory, stage, None):
            assert set(job) == ALL_KEYS and not specs.SPEC_ONLY & set(job["config"]["stage"]), stage
    every = specs.all_specs(inventory)
    assert list(every) == [layout.job_key(j["dataset"], j["stage"]) for j in every.values()]
    assert len(every) == len(inventory.datasets) * len(inventory.stage_names())
    job = specs.eval_spec(inventory)
    assert set(job) == EVAL_KEYS and layout.job_key(job["dataset"], job["stage"]) == "draft/eval"
    assert not specs.SPEC_ONLY & set(job["config"]["stage"]) and job["config"]["stage"]["model"]
