"""The edit → deploy → rerun loop: validation reused while its inputs are unchanged, one connection per invocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from local.validation.cache import ValidationCache, keys, prep_code
from benchmarks.harness.checkout import REPO, SAMPLES, Bench, copy_checkout
from tests.prep_fixtures import tiny_tokenizer_dir  # noqa: F401 (a fixture)
from benchmarks.harness.sshd import start_server

# NOTE: a package of this name first on PYTHONPATH notes every import of it (in `inv` and in
# any Python it starts, such as the validation), then hands over to the real package.
TRIPWIRE = '''\
import importlib, os, sys
with open(os.environ["AERIE_TRIPWIRE_LOG"], "a") as log:
    log.write(__name__ + "\\n")
_here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)
'''


def request(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    sample = tmp_path / "sample.jsonl"
    if not sample.exists():
        sample.write_bytes(SAMPLES["native"].read_bytes())
    base = {"target": {"tokenizer": None, "model": None, "trust_remote_code": False},
            "stage": {"max_length": 1024}, "datasets": {"A": {"kind": "native", "sample": str(sample), "limit": 200}}}
    return {**base, **changes}


# -- the key -------------------------------------------------------------------------


def test_the_key_changes_with_each_input_and_nothing_else(tmp_path: Path) -> None:
    repo = copy_checkout(tmp_path / "checkout")
    first = keys(request(tmp_path), repo)["A"]
    assert first and keys(request(tmp_path), repo)["A"] == first

    (repo / "remote" / "control_plane" / "supervisor.py").write_text("# not prep's code\n")
    assert keys(request(tmp_path), repo)["A"] == first

    changed = {
        "settings": keys(request(tmp_path, stage={"max_length": 2048}), repo),
        "target": keys(request(tmp_path, target={"tokenizer": None, "model": None, "trust_remote_code": True}), repo),
        "entry": keys(request(tmp_path, datasets={"A": {"kind": "prompts", "sample": str(tmp_path / "sample.jsonl")}}), repo),
    }
    for what, key in changed.items():
        assert key["A"] != first, what

    (tmp_path / "sample.jsonl").write_text((tmp_path / "sample.jsonl").read_text() + "{}\n")
    assert keys(request(tmp_path), repo)["A"] not in (first, None)


@pytest.mark.parametrize("edited", ["remote/prep/normalise.py", "remote/prep/new_module.py", "remote/vocabulary/wire.py"])
def test_the_key_changes_with_prep_code_and_what_validate_imports(tmp_path: Path, edited: str) -> None:
    repo = copy_checkout(tmp_path / "checkout")
    before = keys(request(tmp_path), repo)["A"]
    path = repo / edited
    path.write_text((path.read_text() if path.exists() else "") + "# edited\n")
    assert keys(request(tmp_path), repo)["A"] != before


def test_the_key_follows_the_tokenizer_files(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer_config.json").write_text("{}")
    target = {"tokenizer": str(tokenizer), "model": None, "trust_remote_code": False}
    before = keys(request(tmp_path, target=target))["A"]
    (tokenizer / "chat_template.jinja").write_text("{{ messages }}")
    assert keys(request(tmp_path, target=target))["A"] != before


def test_the_key_follows_the_model_folder_when_it_is_the_tokenizer(tmp_path: Path) -> None:
    repo = copy_checkout(tmp_path / "checkout")
    (repo / "assets").mkdir()
    (repo / "assets" / "tokenizer_config.json").write_text("{}")
    target = {"tokenizer": None, "model": "assets", "trust_remote_code": False}  # relative: to the checkout
    before = keys(request(tmp_path, target=target), repo)["A"]
    (repo / "assets" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
    assert keys(request(tmp_path, target=target), repo)["A"] != before


def test_a_sample_that_is_not_a_file_is_never_cached(tmp_path: Path) -> None:
    asked = request(tmp_path, datasets={"A": {"kind": "native", "sample": "org/hub-dataset"}})
    assert keys(asked) == {"A": None}


def test_every_remote_module_validate_loads_is_hashed() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import json, sys, remote.prep.validate; "
         "print(json.dumps([getattr(m, '__file__', None) for n, m in list(sys.modules.items()) if n.split('.')[0] == 'remote']))"],
        cwd=REPO, capture_output=True, text=True, check=True)
    files = {Path(f).resolve() for f in json.loads(loaded.stdout) if f}
    assert files and files <= prep_code(REPO)


def test_a_corrupt_or_failing_entry_is_not_reused(tmp_path: Path) -> None:
    cache = ValidationCache(tmp_path)
    good = {"dataset": "A", "kind": "native", "formats": {"sharegpt": 3}, "rows": 3, "kept": 3, "skipped": 0,
            "skip_reasons": {}, "mean_tokens": None, "error": None}
    cache.put("k1", good)
    assert cache.get("k1", "A") == good
    assert cache.get("k1", "B") is None  # a key is one dataset's
    (tmp_path / "k1.json").write_text('{"key": "k1", "entry": {"datas')
    assert cache.get("k1", "A") is None
    cache.put("k2", {**good, "kept": 0})
    assert cache.get("k2", "A") is None and not (tmp_path / "k2.json").exists()
    assert not list(tmp_path.glob(".*.tmp"))


# -- inv deploy, as typed -------------------------------------------------------------


@pytest.mark.e2e
def test_deploy_validates_only_what_changed_and_imports_neither_transformers_nor_rich_when_cached(
        tmp_path: Path, tiny_tokenizer_dir: Path) -> None:  # noqa: F811
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    sample = tmp_path / "sharegpt.jsonl"
    sample.write_bytes(SAMPLES["native"].read_bytes())
    bench.inventory({"A": {"source": "records=1", "kind": "native", "sample": str(sample)},
                     "B": {"source": "records=1", "kind": "native"}},
                    target={"tokenizer": str(tiny_tokenizer_dir)})
    tripwire, log = tmp_path / "tripwire", tmp_path / "imports.log"
    for package in ("transformers", "torch", "rich"):
        (tripwire / package).mkdir(parents=True)
        (tripwire / package / "__init__.py").write_text(TRIPWIRE)
    env = {"AERIE_TRIPWIRE_LOG": str(log), "PYTHONPATH": f"{tripwire}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def deploy(*flags: str) -> tuple[str, set[str]]:
        log.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-m", "invoke", "deploy", "-i", "test", *flags], cwd=bench.checkout,
                              capture_output=True, text=True, timeout=120, env={**os.environ, **env, "COLUMNS": "200"})
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout, set(log.read_text().split()) if log.exists() else set()

    first, imported = deploy()
    assert "prep over local samples" in first and "validated (cached)" not in first
    assert "transformers" in imported  # the tripwire sees a validation that runs

    again, imported = deploy()
    assert "validated (cached): A, B" in again and "prep over local samples" not in again
    assert imported == set()  # neither `inv` nor anything it started imported transformers, torch or rich

    sample.write_text(sample.read_text() + sample.read_text().splitlines()[0] + "\n")
    only_a, _ = deploy()
    assert "validated (cached): B " in only_a and "│ A " in only_a and "│ B " not in only_a

    for path in (bench.checkout / ".aerie" / "cache" / "validate").glob("*.json"):
        if json.loads(path.read_text())["entry"]["dataset"] == "B":
            path.write_text('{"key": "cut short')
    corrupt, _ = deploy()
    assert "validated (cached): A " in corrupt and "│ B " in corrupt

    forced, imported = deploy("--revalidate")
    assert "prep over local samples" in forced and "validated (cached)" not in forced and "transformers" in imported


# -- one connection per invocation --------------------------------------------------------


@pytest.mark.e2e
def test_deploy_then_rerun_in_one_invocation_connects_once(tmp_path: Path, hermetic_environment: dict[str, str]) -> None:
    server = start_server(tmp_path / "sshd", environment=hermetic_environment, log_level="INFO")
    try:
        # No connection kept between commands (local/transport/openssh.py): this counts what one process opens.
        bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "ssh", server,
                      host_settings={"control_persist": 0})
        fixed = tmp_path / "fixed"
        bench.scripted({"bad": f"records=1 exit=3 unless={fixed}"})
        bench.inv("deploy")
        bench.inv("launch", "--stage", "prep")
        bench.wait_state("bad/prep", {"failed"})
        fixed.write_text("")

        def accepted() -> int:
            return server.log.read_text().count("Accepted publickey")

        before = accepted()
        env = {**os.environ, "INVOKE_INVENTORY": "test", "COLUMNS": "200"}
        done = subprocess.run([sys.executable, "-m", "invoke", "deploy", "rerun", "--failed"], cwd=bench.checkout,
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Nothing to deploy" in done.stdout and "relaunched bad/prep" in done.stdout
        assert accepted() - before == 1

        before = accepted()  # the same two tasks as two commands: two connections (the count is real)
        for task in (["deploy"], ["rerun", "--failed"]):
            subprocess.run([sys.executable, "-m", "invoke", *task], cwd=bench.checkout, capture_output=True,
                           timeout=120, env=env, check=True)
        assert accepted() - before == 2
    finally:
        server.stop()


def test_the_plans_estimates_read_a_pass_deploy_cached_and_validate_only_what_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from local.inventory.schema import validate as schema
    from local.tasks import planning
    from local.validation import samples

    sample = tmp_path / "sample.jsonl"
    sample.write_bytes(SAMPLES["native"].read_bytes())
    inventory = schema({"backend": "local", "host": {"root": str(tmp_path / "root")},
                        "datasets": {"A": {"source": "a", "kind": "native", "sample": str(sample)}}})
    cache = ValidationCache(tmp_path / "cache")
    monkeypatch.setattr(samples, "ValidationCache", lambda: cache)
    passed = {"dataset": "A", "kind": "native", "formats": {"sharegpt": 3}, "rows": 3, "kept": 3, "skipped": 0,
              "skip_reasons": {}, "mean_tokens": 41.5, "error": None}
    cache.put(keys(samples.request(inventory))["A"], passed)
    asked: list[list[str] | None] = []

    def validated(inventory: Any, names: list[str] | None = None) -> list[dict[str, Any]]:
        asked.append(names)
        return [{**passed, "mean_tokens": 99.0}]

    monkeypatch.setattr(samples, "validate", validated)
    assert planning.estimates(inventory) == {"A": {"rows": 3, "kept": 3, "mean_tokens": 41.5}} and asked == []
    sample.write_text(sample.read_text() + sample.read_text().splitlines()[0] + "\n")
    assert planning.estimates(inventory)["A"]["mean_tokens"] == 99.0 and asked == [["A"]]
