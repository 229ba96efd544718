"""What `inv rerun` says changed since a job's last run: the host's diff of two specs, and the inventory's
name for each path of it, for every spec the workstation builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from local.jobs import pipeline
from local.jobs import specs
from local.inventory.schema import load
from remote.vocabulary import spec_changes


def inventory(tmp_path: Path, layers: list[int], url: str = "http://127.0.0.1:1/v1") -> object:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "inv.yaml"
    path.write_text(
        "backend: local\nhost: {root: /srv/aerie}\n"
        f"stages: {{extract: {{layers: {layers}}}, infer: {{server_url: '{url}'}}}}\n"
        "datasets:\n  A1: {source: a.jsonl, kind: native}\n  B5: {source: b.jsonl, kind: prompts}\n")
    return load(str(path))


def named(before: object, after: object, route: str = "offline") -> dict[str, list[str]]:
    """Every job's changes between two inventories' pipelines, as a rerun prints them (path names only)."""
    old = spec_changes_by_key(pipeline.runner_spec(before, None, route))
    new = spec_changes_by_key(pipeline.runner_spec(after, None, route))
    found = {}
    for key, spec in new.items():
        dataset, _, stage = key.partition("/")
        changes = spec_changes.changes(old[key], spec)
        if changes:
            found[key] = [f"{specs.inventory_key(dataset, stage, path)} {a} -> {b}" for path, a, b in changes]
    return found


def spec_changes_by_key(runner: dict) -> dict[str, dict]:
    return {node["key"]: node["spec"] for node in runner["config"]["stage"]["plan"]}


def test_an_edited_setting_is_named_as_the_inventory_names_it_on_every_job_that_reads_it(tmp_path: Path) -> None:
    before = inventory(tmp_path / "a", [2, 30, 58])
    after = inventory(tmp_path / "b", [1, 2, 3], url="http://127.0.0.1:2/v1")
    assert named(before, after) == {
        "A1/extract": ["stages.extract.layers [2, 30, 58] -> [1, 2, 3]"],
        "B5/extract": ["stages.extract.layers [2, 30, 58] -> [1, 2, 3]"],
        "B5/infer": ["stages.infer.server_url http://127.0.0.1:1/v1 -> http://127.0.0.1:2/v1"],
    }


def test_the_chunked_routes_job_names_both_stages_settings(tmp_path: Path) -> None:
    before, after = inventory(tmp_path / "a", [2, 30, 58]), inventory(tmp_path / "b", [1, 2, 3])
    assert named(before, after, "chunked")["draft/chunked"] == ["stages.extract.layers [2, 30, 58] -> [1, 2, 3]"]


def test_the_same_inventory_changes_nothing_and_bookkeeping_is_not_a_setting(tmp_path: Path) -> None:
    same = inventory(tmp_path, [2, 30, 58])
    assert named(same, same) == {}
    spec = specs.spec(same, "A1", "prep")
    assert spec_changes.changes(spec | {"after": ["x"], "order": 3, "built_from": {}}, spec) == []


@pytest.mark.parametrize(("path", "name"), [
    (["config", "inventory", "target", "model"], "target.model"),
    (["config", "dataset", "limit"], "datasets.A1.limit"),
    (["stall_after"], "stages.prep.stall_after"),
    (["slurm", "partition"], "slurm.partition"),
])
def test_every_part_of_a_spec_has_an_inventory_name(path: list[str], name: str) -> None:
    assert specs.inventory_key("A1", "tokenize", path) == name  # tokenize runs with prep's settings


def test_a_key_one_spec_lacks_is_a_change_from_or_to_nothing() -> None:
    assert spec_changes.changes({"config": {"stage": {}}}, {"config": {"stage": {"limit": 5}}}) == [
        [["config", "stage", "limit"], None, 5]]


class Named:
    name = "gpu"

    def __init__(self, inventory: object) -> None:
        self.inventory = inventory


def test_a_long_setting_edited_near_its_end_is_shown_from_where_it_changed_on_both_sides() -> None:
    from local.tasks.job_verbs import SHOWN, change

    command = ("{python} -m transformers.cli.transformers serve /work/x/.aerie/local/assets/tiny-target "
               "--host 127.0.0.1 --port 30017 --device cpu --dtype float32 --log-level warning")
    before, after = change(command.replace("--dtype", "--dtyp"), command).split(" -> ")
    assert "--dtyp float32" in before and "--dtype float32" in after, (before, after)
    assert before.startswith("…") and after.startswith("…") and max(len(before), len(after)) <= SHOWN
    assert change([2, 30, 58], [1, 2, 3]) == "[2, 30, 58] -> [1, 2, 3]"  # short: whole, from the start
    assert change(None, "x" * 100) == "(unset) -> " + '"' + "x" * (SHOWN - 2) + "…"


def test_a_rerun_rebuilds_the_last_runs_pipeline_and_not_one_whose_dataset_is_gone(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from local.tasks import job_verbs

    now = inventory(tmp_path, [1, 2, 3])
    console = Console(file=io.StringIO())
    rebuilt = job_verbs.rebuilt_pipeline(Named(now), console, {"datasets": ["B5"], "route": "offline"})
    plan = rebuilt["runner"]["config"]["stage"]["plan"]
    assert [n["key"] for n in plan] == ["B5/prep", "B5/infer", "B5/tokenize", "B5/extract", "draft/train"]
    assert plan[3]["spec"]["config"]["stage"]["layers"] == [1, 2, 3]
    assert job_verbs.rebuilt_pipeline(Named(now), console, {"datasets": ["B5", "C9"], "route": "offline"}) == {}
    said = " ".join(console.file.getvalue().split())
    assert "the last `inv run` on gpu had C9, no longer in" in said and "rerun with the specs of their last run" in said
