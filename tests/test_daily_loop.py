"""The loop a user lives in (run, watch, fix, rerun), end to end through the real tasks: what is
finished is never destroyed unasked, and a rerun runs with the inventory as it is now.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.checkout import REPO, SCRIPTED, Bench, wait_for
from tests.infer_fixtures import ScriptedServer, Server, live_server, tiny_model  # noqa: F401 (session fixtures, built once)
from tests.prep_fixtures import tiny_tokenizer_dir  # noqa: F401 (a session fixture, built once)

pytestmark = pytest.mark.e2e

SAMPLE = REPO / "inventories" / "samples" / "sharegpt.jsonl"
PROMPTS = REPO / "inventories" / "samples" / "prompts_alpaca.jsonl"
ENDED = {"succeeded", "empty", "failed", "died", "stopped"}


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
    assert "skipped A1/prep: is up to date: it has succeeded with these settings" in again.stdout
    assert "`inv launch --stage prep --dataset A1 --force` runs it again" in again.stdout
    assert bench.poll()["A1/prep"]["state"] == "succeeded" and outputs(output) == finished

    forced = bench.inv("launch", "--stage", "prep", "--dataset", "A1", "--force")
    assert "launched A1/prep" in forced.stdout
    wait_for(lambda: bench.poll()["A1/prep"]["records"] > 0, 120, "the forced prep to write records")
    bench.inv("stop", "-d", "A1")
    assert bench.wait_state("A1/prep", ENDED)["state"] == "stopped"
    assert outputs(output) == finished, "the stopped relaunch took away what the finished run wrote"


def test_an_inventory_edit_reaches_rerun_failed_through_the_pipelines_runner(
    bench: Bench, tiny_model: Path, live_server: Server
) -> None:
    """Real prep, infer (against `transformers serve`) and tokenize; extract and train scripted, extract
    refusing any layers but [1, 2, 3]. Each fix of the inventory reaches the rerun that follows it."""
    plans = bench.root.parent / "plans"
    plans.mkdir()
    (plans / "B.extract").write_text("records=1 need_layers=1,2,3")
    scripted = {"command": f"{{python}} {SCRIPTED} {plans}"}
    failing = ScriptedServer(lambda body, attempt: (503, {"error": "loading"}))
    failing.routes["/health"] = {}  # up, so `inv run` starts; it answers no request
    wrong = failing.url

    def inventory(server_url: str, layers: list[int]) -> None:
        bench.inventory({"B": {"source": str(PROMPTS), "kind": "prompts", "sample": str(PROMPTS)}},
                        {"prep": {"max_length": 256}, "extract": {**scripted, "layers": layers}, "train": scripted,
                         "infer": {"server_url": server_url, "model": str(tiny_model), "max_tokens": 8,
                                   "concurrency": 2, "retries": 0}},
                        target={"tokenizer": str(tiny_model), "model": str(tiny_model)})

    inventory(wrong, [0, 1, 2])
    bench.inv("deploy")
    with failing:
        bench.inv("run")
        failed = bench.wait_state("B/infer", ENDED, timeout=180)
    assert failed["state"] == "failed" and "http 503" in failed["message"], failed["message"]

    inventory(live_server.url, [0, 1, 2])  # the server's address fixed
    rerun = bench.inv("rerun", "--failed")
    assert "relaunched pipeline/run" in rerun.stdout and "it runs again: B/infer, B/tokenize, B/extract" in rerun.stdout
    assert f'B/infer: stages.infer.server_url "{wrong}" -> "{live_server.url}"' in rerun.stdout
    assert bench.wait_state("B/extract", ENDED, timeout=240)["state"] == "failed"
    jobs = bench.poll()
    assert (jobs["B/infer"]["state"], jobs["B/tokenize"]["state"]) == ("succeeded", "succeeded")

    inventory(live_server.url, [1, 2, 3])  # the layers fixed
    rerun = bench.inv("rerun", "--failed")
    assert "B/extract: stages.extract.layers [0, 1, 2] -> [1, 2, 3]" in rerun.stdout
    assert "B/infer:" not in rerun.stdout, "a job that succeeded is neither run again nor said to change"
    assert bench.wait_state("pipeline/run", ENDED, timeout=120)["state"] == "succeeded"
    assert {key: job["state"] for key, job in bench.poll().items()} == {
        "B/prep": "succeeded", "B/infer": "succeeded", "B/tokenize": "succeeded", "B/extract": "succeeded",
        "draft/train": "succeeded", "pipeline/run": "succeeded"}


def test_a_model_the_server_refuses_fails_infer_with_the_servers_words_and_rerun_after_the_fix_succeeds(
    bench: Bench, tiny_model: Path, live_server: Server
) -> None:
    def inventory(model: str) -> None:
        bench.inventory({"B": {"source": str(PROMPTS), "kind": "prompts", "sample": str(PROMPTS)}},
                        {"prep": {"max_length": 256},
                         "infer": {"server_url": live_server.url, "model": model, "max_tokens": 8, "concurrency": 2}},
                        target={"tokenizer": str(tiny_model), "model": str(tiny_model)})

    inventory("kimi-k2.5")  # the served model is the tiny one, by its path: `transformers serve` refuses others
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    assert bench.wait_state("B/prep", ENDED, timeout=180)["state"] == "succeeded"
    bench.inv("launch", "--stage", "infer")
    failed = bench.wait_state("B/infer", ENDED, timeout=120)
    said = f"Server is pinned to '{tiny_model}'; requested 'kimi-k2.5'."
    assert failed["state"] == "failed", failed
    assert "refused every request and answered none: http 400: " + said in failed["message"]
    assert failed["skip_reasons"] and set(failed["skip_reasons"]) == {f"http 400: {said}"}
    log = bench.inv("logs", "B", "--stage", "infer").stdout
    assert "the server refused prompt" in log and said in log

    inventory(str(tiny_model))
    rerun = bench.inv("rerun", "--failed")
    assert f'B/infer: stages.infer.model "kimi-k2.5" -> "{tiny_model}"' in rerun.stdout
    done = bench.wait_state("B/infer", ENDED, timeout=120)
    assert done["state"] == "succeeded" and done["skipped"] == 0
    prompts = sum(1 for line in PROMPTS.read_text().splitlines() if line.strip())
    answered = (bench.root / "data" / "B" / "infer" / "conversations.jsonl").read_text().splitlines()
    assert len(answered) == done["records"] == prompts, "every refused prompt was asked again"


def test_a_rerun_whose_fix_is_itself_wrong_is_refused_in_one_line_before_anything_is_relaunched(
        bench: Bench, tmp_path: Path) -> None:
    """`inv rerun --failed` makes the checks `inv run` makes of the inventory as it is now: a layer id the target
    does not have is one line, and the failed run stays as it was until the fix is right."""
    from tests.helpers.targets import target_files

    target = target_files(tmp_path / "target", num_layers=4)  # layer ids 0..2
    plans, fixed = tmp_path / "plans", tmp_path / "fixed"
    plans.mkdir()
    (plans / "A.prep").write_text(f"records=1 exit=2 unless={fixed}")
    scripted = {"command": f"{{python}} {SCRIPTED} {plans}"}

    def inventory(layers: list[int]) -> None:
        bench.inventory({"A": {"source": "A.data", "kind": "native"}}, {"prep": scripted, "train": scripted,
                                                                         "extract": {"layers": layers}},
                        target={"model": str(target), "tokenizer": str(target)})

    inventory([0, 1, 2])
    bench.inv("deploy")
    bench.inv("run")
    assert bench.wait_state("pipeline/run", ENDED, timeout=120)["state"] == "failed"
    failed_at = bench.poll()["A/prep"]["ended_at"]

    fixed.write_text("")
    inventory([0, 1, 3])  # the prep fixed, and a layer the target does not have
    refused = bench.inv("rerun", "--failed", check=False)
    [said] = [x for x in refused.stderr.splitlines() if x.strip()]
    assert refused.returncode == 2 and "nothing was started" in said and "[3] out of range" in said, refused.stderr
    jobs = bench.poll()
    assert (jobs["pipeline/run"]["state"], jobs["A/prep"]["state"], jobs["A/prep"]["ended_at"]) == ("failed", "failed", failed_at)

    inventory([0, 1, 2])
    assert "relaunched pipeline/run" in bench.inv("rerun", "--failed").stdout
    assert bench.wait_state("A/prep", ENDED, timeout=120)["state"] == "succeeded"
    bench.inv("stop", "--all")
