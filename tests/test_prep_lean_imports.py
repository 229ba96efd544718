"""Processes that only tokenise (validate, the prep stage) import transformers with torch hidden, and the prep
stage pyarrow with pandas hidden; they count and write the same as a process with both, and a tokenizer's own
code still gets torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from remote.prep.validate import validate
from remote.stages import StageContext
from remote.stages.prep import run
from benchmarks.harness.stage_settings import complete
from tests.prep_fixtures import KIMI_DIR, REPO, tiny_tokenizer_dir  # noqa: F401
from remote.vocabulary.wire import decode

needs_kimi = pytest.mark.skipif(not KIMI_DIR.is_dir(), reason="../shared/kimi-k2.5-tokenizer is absent")
SAMPLE = REPO / "inventories" / "samples" / "agent_trajectory.jsonl"

# Runs a module as `python -m` does, then says on stderr's last line whether torch and pandas were imported.
WATCHED = ("import atexit, runpy, sys\n"
           "atexit.register(lambda: print('imported:', *sorted({'torch', 'pandas'} & set(sys.modules)) or ['neither'],"
           " file=sys.stderr))\n"
           "sys.argv = sys.argv[1:]\n"
           "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def _watched(module: str, *args: str, stdin: str = "", env: dict[str, str] | None = None,
             cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-c", WATCHED, module, *args], input=stdin, capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def _python(code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "PyTorch was not found" not in result.stderr
    return result.stdout.split()


@needs_kimi
def test_validate_renders_with_kimi_s_tokenizer_without_torch_and_counts_what_a_process_with_torch_counts():
    request = {"target": {"tokenizer": str(KIMI_DIR), "trust_remote_code": True}, "stage": complete("prep"),
               "datasets": {"A": {"kind": "native", "sample": str(SAMPLE)}}}

    result = _watched("remote.prep.validate", "-", stdin=json.dumps(request))

    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["imported: neither"]  # nor transformers' notice that torch is missing
    [entry] = decode(result.stdout)
    assert entry["error"] is None and entry["kept"] > 0
    assert entry == validate(request)[0]  # here, in a process where transformers sees torch


def test_the_prep_stage_tokenises_and_writes_without_torch_or_pandas_the_shards_a_process_with_both_writes(
        tmp_path, tiny_tokenizer_dir, monkeypatch):
    lean, here = tmp_path / "lean", tmp_path / "here"
    shutil.copy(SAMPLE, tmp_path / "input.jsonl")
    config = {"dataset": {"source": "input.jsonl"}, "stage": complete("prep", {"shard_size": 1}),
              "inventory": {"target": {"tokenizer": str(tiny_tokenizer_dir)}}}
    env = {"AERIE_ROOT": str(tmp_path), "AERIE_RELEASE": "r-test", "AERIE_DATASET": "A1", "AERIE_STAGE": "prep",
           "AERIE_SOURCE": "input.jsonl", "AERIE_KIND": "native", "AERIE_DATA": str(tmp_path),
           "AERIE_CONFIG": json.dumps(config)}
    lean.mkdir(), here.mkdir()

    result = _watched("remote.stages.prep", cwd=tmp_path,
                      env={**env, "AERIE_OUTPUT": str(lean), "AERIE_PROGRESS": str(lean / "progress.json")})
    for name, value in {**env, "AERIE_OUTPUT": str(here), "AERIE_PROGRESS": str(here / "progress.json")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert run(StageContext.from_env()) == 0  # here, where torch and pandas are imported

    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1] == "imported: neither"
    assert json.loads((lean / "manifest.json").read_text())["kept"] == 2
    assert _shards(lean) == _shards(here) and len(_shards(lean)) == 2


def _shards(output: Path) -> list[list[dict]]:
    return [pq.read_table(path).to_pylist() for path in sorted(output.glob("tokens-*.parquet"))]


@needs_kimi
def test_a_tokenizer_whose_own_code_imports_torch_still_gets_it(tmp_path):
    tokenizer = shutil.copytree(KIMI_DIR, tmp_path / "kimi")
    code = tokenizer / "tokenization_kimi.py"
    code.write_text("import torch\nTWO = int(torch.ones(2).sum())\n" + code.read_text())

    printed = _python(
        "import os\n"
        "from remote.prep.lean_imports import NO_ADVICE, import_transformers\n"
        "hidden = import_transformers()\n"
        "from transformers import AutoTokenizer\n"
        "from transformers.utils import is_torch_available\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(tokenizer)!r}, trust_remote_code=True)\n"
        "import sys\n"
        f"kimi = AutoTokenizer.from_pretrained({str(KIMI_DIR)!r}, trust_remote_code=True)\n"
        "print(hidden, is_torch_available(), NO_ADVICE in os.environ, sys.modules[type(tokenizer).__module__].TWO,"
        " tokenizer.encode('hi, Kimi') == kimi.encode('hi, Kimi'))\n")

    assert printed == ["True", "False", "False", "2", "True"]


def test_once_torch_is_imported_transformers_is_left_to_see_it():
    printed = _python(
        "import os, torch\n"
        "from remote.prep.lean_imports import NO_ADVICE, import_transformers\n"
        "hidden = import_transformers()\n"
        "from transformers.utils import is_torch_available\n"
        "print(hidden, is_torch_available(), NO_ADVICE in os.environ)\n")

    assert printed == ["False", "True", "False"]
