"""The loop a user lives in (run, watch, fix, rerun), end to end through the real tasks: what is
finished is never destroyed unasked, and a rerun runs with the inventory as it is now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.checkout import REPO, Bench, copy_checkout, wait_for
from tests.prep_fixtures import tiny_tokenizer_dir  # noqa: F401 (a session fixture, built once)

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "inventories" / "samples" / "sharegpt.jsonl"
ENDED = {"succeeded", "empty", "failed", "died", "stopped"}


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    return Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")


def many_rows(path: Path, count: int) -> Path:
    """A native dataset of `count` chats: long enough for prep to be stopped halfway."""
    rows = (json.dumps({"id": f"r{i}", "conversations": [
        {"from": "human", "value": f"question {i}: what is {i} plus {i}?"},
        {"from": "gpt", "value": f"{i} plus {i} is {2 * i}."}]}) for i in range(count))
    path.write_text("\n".join(rows) + "\n")
    return path


def outputs(directory: Path) -> dict[str, bytes]:
    """The finished files of a stage's output (temporaries aside), by name."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if not p.name.startswith(".")}


def test_a_relaunch_of_a_succeeded_prep_is_refused_and_a_forced_one_stopped_keeps_the_output(
    bench: Bench, tmp_path: Path, tiny_tokenizer_dir: Path  # noqa: F811
) -> None:
    source = many_rows(tmp_path / "chats.jsonl", 20_000)
    bench.inventory({"A1": {"source": str(source), "kind": "native", "sample": str(SAMPLE)}},
                    {"prep": {"max_length": 256}}, target={"tokenizer": str(tiny_tokenizer_dir)})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep", "--dataset", "A1")
    assert bench.wait_state("A1/prep", ENDED, timeout=240)["state"] == "succeeded"
    output = bench.root / "data" / "A1" / "prep"
    finished = outputs(output)
    assert {"manifest.json", "conversations.jsonl"} <= set(finished)

    again = bench.inv("launch", "--stage", "prep", "--dataset", "A1")
    assert "skipped A1/prep: has succeeded" in again.stdout
    assert "`inv launch --stage prep --dataset A1 --force` runs it again" in again.stdout
    assert bench.poll()["A1/prep"]["state"] == "succeeded" and outputs(output) == finished

    forced = bench.inv("launch", "--stage", "prep", "--dataset", "A1", "--force")
    assert "launched A1/prep" in forced.stdout
    wait_for(lambda: bench.poll()["A1/prep"]["records"] > 0, 120, "the forced prep to write records")
    bench.inv("stop", "-d", "A1")
    assert bench.wait_state("A1/prep", ENDED)["state"] == "stopped"
    assert outputs(output) == finished, "the stopped relaunch took away what the finished run wrote"
