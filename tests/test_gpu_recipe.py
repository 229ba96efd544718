"""inventories/gpu.yaml, the Kimi-K2.5 recipe the user edits first, as it is: `inv plan` and `inv check`
against the Kimi-K2.5-shaped target of the tests and a stand-in nvidia-smi of 8 x H200 refuse nothing.

The inventory's host is pointed at this machine (backend local, a test root); every other setting is the
file's own. Nothing here connects to the user's GPU host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.kimi_headers import build_kimi_k25_headers
from tests.pipeline_fixtures import REPO
from tests.helpers.eight_h200 import eight_h200

__all__ = ["eight_h200"]  # a fixture

pytestmark = pytest.mark.e2e  # the real tasks, and the 64 headers take seconds to write and read


@pytest.fixture
def recipe_bench(tmp_path: Path, eight_h200: Path):
    """A checkout whose `test` inventory is gpu.yaml with its host made this machine and its target the
    Kimi-K2.5-shaped headers."""
    from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout
    from remote.demo.tiny_tokenizer import build_tokenizer

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    kimi = build_kimi_k25_headers(tmp_path / "kimi-k25")
    build_tokenizer(tmp_path / "tokenizer")
    recipe = yaml.safe_load((REPO / "inventories" / "gpu.yaml").read_text())
    recipe["backend"] = "local"
    recipe["host"] = {"root": str(bench.root), "python": sys.executable}
    recipe["target"].update(model=str(kimi), tokenizer=str(tmp_path / "tokenizer"))
    for entry in recipe["datasets"].values():  # the samples shipped beside the inventory, found from the checkout
        entry["sample"] = str(REPO / "inventories" / entry["sample"]) if "sample" in entry else str(SAMPLES[entry["kind"]])
        entry.setdefault("rows", 1000)
    (bench.checkout / "inventories" / "test.yaml").write_text(yaml.safe_dump(recipe))
    return bench, recipe


def test_the_shipped_kimi_recipe_extracts_with_sglang_trains_on_every_gpu_and_evaluates_sglang_s_chain() -> None:
    stages = yaml.safe_load((REPO / "inventories" / "gpu.yaml").read_text())["stages"]
    assert stages["extract"]["engine"] == "sglang"
    assert "nproc" not in stages["train"] and "init_draft" not in stages["train"]  # every GPU; the warm start commented
    assert {"num_steps": 3, "topk": 1, "num_draft_tokens": 4} in stages["eval"]["grid"]
    text = (REPO / "inventories" / "gpu.yaml").read_text()
    assert "# init_draft: " in text and "# specforge_python: " in text


def test_inv_plan_and_inv_check_refuse_nothing_in_the_shipped_kimi_recipe_on_eight_h200(recipe_bench) -> None:
    bench, _ = recipe_bench
    bench.inv("deploy", timeout=300)

    plan = bench.inv("plan", check=False, timeout=300)
    figures = json.loads(bench.inv("plan", "--json", check=False, timeout=300).stdout)
    check = bench.inv("check", check=False, timeout=300)

    shown = " ".join(plan.stdout.split())
    assert plan.returncode == 0 and "cannot run" not in plan.stdout, plan.stdout + plan.stderr
    assert "stages.extract.engine: sglang" in shown, shown
    assert figures["train_gpus"] == 8  # training's hours are divided over every GPU
    assert check.returncode == 0, check.stdout + check.stderr
