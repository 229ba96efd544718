"""The compact cached inventory reads like the validated one, and never outlives a change to the file or the schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from local.inventory import schema
from local.inventory import loader
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


def both(tmp_path: Path, text: str) -> tuple[schema.Inventory, schema.Inventory, Path]:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    cache = tmp_path / "cache"
    load(str(path), cache)  # validates and stores
    return schema.load(str(path)), load(str(path), cache), cache


@pytest.mark.parametrize("name", ["local", "gpu"])
def test_a_cached_inventory_reads_like_the_validated_one(tmp_path: Path, name: str) -> None:
    real = schema.load(name)
    load(name, tmp_path)
    cached = load(name, tmp_path)
    assert isinstance(cached, loader.CachedInventory) and cached._real is None  # read back, not validated
    assert cached.model_dump() == real.model_dump() and cached.path == real.path
    assert cached.host.model_dump_json() == cached.host.model_dump_json()
    assert cached.host.root == real.host.root and cached.host.env == real.host.env
    assert cached.target.model_dump() == real.target.model_dump()
    assert cached.stages.prep.model_dump(exclude={"command"}) == real.stages.prep.model_dump(exclude={"command"})
    assert {n: d.model_dump() for n, d in cached.datasets.items()} == {n: d.model_dump() for n, d in real.datasets.items()}
    assert list(cached.views()) == [""] and cached.views()[""] is cached and not cached.is_multi_host
    assert cached.stage("extract").model_dump() == real.stage("extract").model_dump()
    assert specs.all_specs(cached) == specs.all_specs(real) and cached.select(None) == real.select(None)
    assert cached._real is None  # all of the above without pydantic's models (`inv launch` needs no more)


def test_methods_the_cache_cannot_answer_come_from_the_real_model(tmp_path: Path) -> None:
    real, cached, _ = both(tmp_path, MULTI)
    assert cached.is_multi_host and cached.assignment() == real.assignment() == {"A": "gpu1", "B": "gpu2"}
    assert cached.select(["B"]) == ["B"]
    with pytest.raises(AerieError, match="unknown dataset C"):
        cached.select(["C"])
    assert cached.slurm.for_stage("extract") == real.slurm.for_stage("extract")
    views = cached.views()
    assert sorted(views) == ["gpu1", "gpu2"] and views["gpu1"].host.env == {"A": "1"}
    assert cached.stage("extract").layers == [0, 1]
    with pytest.raises(AerieError, match="unknown stage 'tokenise'"):
        cached.stage("tokenise")


def test_an_edited_file_is_validated_again(tmp_path: Path) -> None:
    _, cached, cache = both(tmp_path, MULTI)
    path = tmp_path / "inv.yaml"
    path.write_text(MULTI.replace("max_length: 64", "max_lenght: 64"))
    with pytest.raises(AerieError, match="stages.prep.max_lenght: unknown key"):
        load(str(path), cache)
    path.write_text(MULTI.replace("max_length: 64", "max_length: 128"))
    assert load(str(path), cache).stages.prep.max_length == 128


def test_a_corrupt_cache_entry_is_ignored_and_replaced(tmp_path: Path) -> None:
    _, _, cache = both(tmp_path, MULTI)
    (entry,) = cache.glob("*.json")
    entry.write_text('{"key": "' + entry.stem + '", "data": {"backend"')
    again = load(str(tmp_path / "inv.yaml"), cache)
    assert again.datasets["B"].limit == 5 and json.loads(entry.read_text())["data"]["datasets"]["B"]["limit"] == 5


def test_the_key_covers_the_schema_code() -> None:
    assert {p.name for p in loader.SCHEMA_CODE} == {"schema.py", "paths.py"}
    assert all(p.is_file() for p in loader.SCHEMA_CODE)


def test_a_deploy_path_import_leaves_pydantic_and_yaml_alone() -> None:
    # tasks.py and what `inv deploy` runs, with a cached inventory: no schema, no YAML parser of ours.
    code = ("import sys, tasks; from local.inventory import loader; from local.validation import samples; from local.host import releases, fleet; "
            "print(sorted(m for m in ('pydantic', 'local.inventory.schema', 'transformers', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_task_list_loads_no_ssh_library_schema_or_rich() -> None:
    # What every `inv` command pays before its task runs; each task imports what it needs.
    code = ("import sys, tasks; print(sorted(m for m in ('paramiko', 'fabric', 'pydantic', 'rich', 'local.host.releases', "
            "'local.validation.samples') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("ask", [lambda i: i.select(["A", "C"]), lambda i: i.stage("tokenise")])
def test_both_forms_refuse_an_unknown_name_alike_and_the_cache_without_pydantic(tmp_path: Path, ask) -> None:
    real, cached, _ = both(tmp_path, MULTI)
    refusals = []
    for form in (real, cached):
        with pytest.raises(AerieError) as refused:
            ask(form)
        refusals.append(str(refused.value))
    assert refusals[0] == refusals[1] and ("unknown dataset C in " in refusals[0] or "unknown stage" in refusals[0])
    assert cached._real is None and cached.executor == real.executor == "process"
