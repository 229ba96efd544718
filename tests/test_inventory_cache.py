"""The cached inventory is the validated one, read back without pydantic, and never outlives a change to
the file or the schema."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from local.inventory import schema
from local.inventory import loader
from local.inventory.fields import dump
from local.inventory.values import Inventory
from local.jobs import specs
from local.exceptions import AerieError
from local.inventory.loader import load
from benchmarks.harness.checkout import REPO

MULTI = """\
backend: ssh
hosts:
  gpu1: {address: 127.0.0.1, root: /r1, env: {A: "1"}}
  gpu2: {address: 127.0.0.2, root: /r2}
slurm: {partition: p, stages: {extract: {gpus: 8}}}
target: {tokenizer: "{root}/tok", trust_remote_code: true}
stages: {prep: {max_length: 64}, extract: {layers: [0, 1]}}
datasets:
  A: {source: a, kind: native, host: gpu1}
  B: {source: b, kind: prompts, limit: 5}
"""


def both(tmp_path: Path, text: str) -> tuple[Inventory, Inventory, Path]:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    cache = tmp_path / "cache"
    load(str(path), cache)  # validates and stores
    return schema.load(str(path)), load(str(path), cache), cache


#: Loads `name` from `cache` in a fresh interpreter: what comes back, and whether pydantic or YAML was imported.
READ_BACK = ("import pickle, sys; from local.inventory.loader import load; from pathlib import Path; "
             "inventory = load(sys.argv[1], Path(sys.argv[2])); "
             "sys.stdout.buffer.write(pickle.dumps((inventory, [m for m in ('pydantic', 'yaml') if m in sys.modules])))")


def read_back(name: str, cache: Path) -> tuple[Inventory, list[str]]:
    done = subprocess.run([sys.executable, "-c", READ_BACK, name, str(cache)], cwd=REPO, capture_output=True, check=True)
    return pickle.loads(done.stdout)


@pytest.mark.parametrize("name", ["local", "gpu"])
def test_a_cached_inventory_is_the_validated_one_read_back_without_pydantic(tmp_path: Path, name: str) -> None:
    real = schema.load(name)
    load(name, tmp_path)
    cached, imported = read_back(name, tmp_path)
    assert imported == []  # read back, not validated
    assert isinstance(cached, Inventory) and cached == real and cached.path == real.path
    assert dump(cached) == dump(real) and cached.host.root == real.host.root and cached.host.env == real.host.env
    assert list(cached.views()) == [""] and cached.views()[""] is cached and not cached.is_multi_host
    assert cached.stage("extract") == real.stage("extract")
    assert specs.all_specs(cached) == specs.all_specs(real) and cached.select(None) == real.select(None)


def test_what_tasks_ask_is_answered_alike_by_the_cached_inventory(tmp_path: Path) -> None:
    real, cached, cache = both(tmp_path, MULTI)
    assert cached is not real and cached == real  # the one read back, equal to the one just validated
    assert read_back(str(tmp_path / "inv.yaml"), cache) == (real, [])
    assert cached.is_multi_host and cached.assignment() == real.assignment() == {"A": "gpu1", "B": "gpu2"}
    assert cached.select(["B"]) == ["B"]
    with pytest.raises(AerieError, match="unknown dataset C"):
        cached.select(["C"])
    assert cached.slurm.for_stage("extract") == real.slurm.for_stage("extract") == {
        "partition": "p", "account": None, "gpus": 8, "cpus": None, "mem": None, "time": None, "extra": []}
    views = cached.views()
    assert sorted(views) == ["gpu1", "gpu2"] and views["gpu1"].host.env == {"A": "1"}
    assert list(views["gpu1"].datasets) == ["A"] and views["gpu2"].path == cached.path
    assert cached.stage("extract").layers == [0, 1]
    with pytest.raises(AerieError, match="unknown stage 'tokenise'"):
        cached.stage("tokenise")


def test_a_stage_s_slurm_resources_override_only_what_it_sets(tmp_path: Path) -> None:
    real, cached, _ = both(tmp_path, MULTI.replace("stages: {extract: {gpus: 8}}", "gpus: 1, stages: {extract: {partition: null}}"))
    for form in (real, cached):
        assert form.slurm.for_stage("extract")["partition"] is None and form.slurm.for_stage("extract")["gpus"] == 1
        assert form.slurm.for_stage("prep")["partition"] == "p"


def test_an_edited_file_is_validated_again(tmp_path: Path) -> None:
    _, cached, cache = both(tmp_path, MULTI)
    path = tmp_path / "inv.yaml"
    path.write_text(MULTI.replace("max_length: 64", "max_lenght: 64"))
    with pytest.raises(AerieError, match="stages.prep.max_lenght: unknown key"):
        load(str(path), cache)
    path.write_text(MULTI.replace("max_length: 64", "max_length: 128"))
    assert load(str(path), cache).stages.prep.max_length == 128


@pytest.mark.parametrize("damage", [b"", b"\x80\x05garbage", None], ids=["empty", "corrupt", "truncated"])
def test_a_corrupt_cache_entry_is_ignored_and_replaced(tmp_path: Path, damage: bytes | None) -> None:
    real, _, cache = both(tmp_path, MULTI)
    (entry,) = cache.glob("*.pickle")
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2] if damage is None else damage)
    again = load(str(tmp_path / "inv.yaml"), cache)
    assert again == real and again.datasets["B"].limit == 5 and entry.read_bytes() == whole


def test_an_entry_under_another_key_or_not_an_inventory_is_ignored(tmp_path: Path) -> None:
    real, _, cache = both(tmp_path, MULTI)
    (entry,) = cache.glob("*.pickle")
    for stored in (("another key", real), (entry.stem, {"backend": "local"})):
        entry.write_bytes(pickle.dumps(stored))
        assert load(str(tmp_path / "inv.yaml"), cache) == real
        assert pickle.loads(entry.read_bytes()) == (entry.stem, real)


def test_a_read_only_cache_validates_every_time(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(MULTI)
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache's folder would be")
    assert load(str(path), cache) == schema.load(str(path))


def test_the_key_covers_the_schema_code() -> None:
    names = {p.name for p in loader.SCHEMA_CODE}
    assert {"checks.py", "fields.py", "stages.py", "values.py", "schema.py", "paths.py"} <= names
    assert all(p.is_file() for p in loader.SCHEMA_CODE)


def test_a_deploy_path_import_leaves_pydantic_and_yaml_alone() -> None:
    # tasks.py and what `inv deploy` runs, with a cached inventory: no schema, no YAML parser of ours.
    code = ("import sys, tasks; from local.inventory import loader; from local.validation import samples; from local.host import releases, fleet; "
            "print(sorted(m for m in ('pydantic', 'local.inventory.schema', 'transformers', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_task_list_loads_no_ssh_library_schema_or_rich() -> None:
    # What every `inv` command pays before its task runs; each task imports what it needs (the inventory's
    # classes too: `inv --list` reads no inventory).
    code = ("import sys, tasks; print(sorted(m for m in ('paramiko', 'fabric', 'pydantic', 'rich', 'local.host.releases', "
            "'local.validation.samples', 'local.inventory.values') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("ask", [lambda i: i.select(["A", "C"]), lambda i: i.stage("tokenise")])
def test_both_loads_refuse_an_unknown_name_alike(tmp_path: Path, ask) -> None:
    real, cached, _ = both(tmp_path, MULTI)
    refusals = []
    for form in (real, cached):
        with pytest.raises(AerieError) as refused:
            ask(form)
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1] and ("unknown dataset C in " in refusals[0] or "unknown stage" in refusals[0])
    assert cached.executor == real.executor == "process"
