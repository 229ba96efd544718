"""`inv eval` end to end: the real task, host job and supervisor, against a stand-in SGLang.

Real SGLang needs a GPU and the target's weights, so the server here is
tests/stages/sglang_standin.py: it takes SGLang's launch flags, answers
``/health``, ``/server_info`` and the native ``/generate`` with ``meta_info``,
and follows a known model of speculation, so the accept lengths, speed-ups and
the best setting that `inv eval` reports can be checked against it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.eval import reports
from benchmarks.harness.stage_settings import complete
from remote.eval.eval_settings import EvalSettings, Setting
from remote.eval.sglang import Measurement, launch_command
from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from tests.stages import sglang_standin

STANDIN = Path(sglang_standin.__file__)
TOKENS = 40
TOKEN_SECONDS = 0.01
DRAFT_COST = 0.2
GRID = [{"num_steps": 1, "topk": 1, "num_draft_tokens": 2}, {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        {"num_steps": 3, "topk": 4, "num_draft_tokens": 12}]
PROMPTS = ["Give three tips for staying healthy.", "Translate: the cat sleeps.", "Name a prime.", "Why is the sky blue?"]


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    return Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")


def eval_inventory(bench: Bench, tmp_path: Path, port: int, accept: float, grid: list[dict] = GRID,
                   token_seconds: float = TOKEN_SECONDS) -> dict:
    draft = tmp_path / "root" / "data" / "draft" / "train" / "draft"
    draft.mkdir(parents=True)
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    settings = {
        "launcher": f"{{python}} {STANDIN}", "model": "/models/target", "port": port,
        "server_args": ["--tp-size", "2"], "server_start_timeout": 30, "grid": grid, "prompts": str(prompts),
        "num_prompts": len(PROMPTS), "max_new_tokens": TOKENS,
        "server_env": {"STANDIN_ACCEPT": str(accept), "STANDIN_TOKEN_SECONDS": str(token_seconds),
                       "STANDIN_DRAFT_COST": str(DRAFT_COST), "STANDIN_JOURNAL": str(tmp_path / "journal.jsonl")},
    }
    bench.inventory({"chat": {"source": "inventories/samples/sharegpt.jsonl", "kind": "native"}}, {"eval": settings})
    bench.inv("deploy")
    return {"draft": draft, "journal": tmp_path / "journal.jsonl"}


def expected(accept: float, point: dict) -> tuple[float, float]:
    """(accept length, speed-up) of a setting under the stand-in's model."""
    verify = sglang_standin.verifications(TOKENS, accept, "EAGLE3", point["num_steps"], point["topk"])
    spec = sglang_standin.seconds(TOKENS, verify, point["num_draft_tokens"], TOKEN_SECONDS, DRAFT_COST)
    return TOKENS / verify, sglang_standin.seconds(TOKENS, None, 0, TOKEN_SECONDS, DRAFT_COST) / spec


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.e2e
def test_eval_reports_the_accept_length_and_speed_up_the_server_saw_and_names_the_fastest_setting(
        bench: Bench, tmp_path: Path, free_port: int) -> None:
    setup = eval_inventory(bench, tmp_path, free_port, accept=0.8)

    done = bench.inv("eval", "--json", timeout=120)

    report = json.loads(done.stdout)
    for point, config in zip(GRID, report["configs"]):
        accept_length, speedup = expected(0.8, point)
        assert {k: config[k] for k in point} == point
        assert config["accept_length"] == round(accept_length, 3)  # Σ completion_tokens / Σ spec_verify_ct
        assert config["speedup"] == pytest.approx(speedup, rel=0.2), config
    assert [round(expected(0.8, p)[1], 2) for p in GRID] == [1.24, 1.59, 1.07]  # the model: (3, 1, 4) is fastest
    assert {k: report["best"][k] for k in ("num_steps", "topk", "num_draft_tokens")} == GRID[1]
    assert report["best"]["flags"] == ["--tp-size", "2", "--max-running-requests", "48", "--speculative-algorithm", "EAGLE3",
                                       "--speculative-draft-model-path", str(setup["draft"]),
                                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                       "--speculative-num-draft-tokens", "4"]
    assert report["baseline"]["tokens_per_s"] == pytest.approx(1 / TOKEN_SECONDS, rel=0.2)
    assert report["warnings"] == []
    assert json.loads((setup["draft"].parent / "eval.json").read_text()) == report  # next to the draft

    asked = [json.loads(line) for line in setup["journal"].read_text().splitlines()]
    runs = [[a["prompt"] for a in asked if a["num_steps"] == p and a["max_new_tokens"] == TOKENS]
            for p in (None, 1, 3)]
    assert sorted(runs[0]) == sorted(PROMPTS) and sorted(runs[1]) == sorted(PROMPTS)  # the same prompts each time
    assert {a["temperature"] for a in asked} == {0} and {a["algorithm"] for a in asked} == {None, "EAGLE3"}
    job = bench.status()["draft/eval"]
    assert job["state"] == "succeeded" and job["records"] == 4  # the baseline and three settings
    assert job["metrics"]["best_speedup"] == report["best"]["speedup"]
    assert not is_listening(free_port), "a server outlived the evaluation"


@pytest.mark.e2e
def test_eval_warns_loudly_when_the_draft_is_never_accepted_and_serving_gets_slower(
        bench: Bench, tmp_path: Path, free_port: int) -> None:
    eval_inventory(bench, tmp_path, free_port, accept=0.0, grid=GRID[1:2])

    done = bench.inv("eval", timeout=120)

    assert "WARNING" in done.stdout and "about 1.0" in done.stdout and "SLOWER" in done.stdout, done.stdout
    assert "--speculative-algorithm EAGLE3" in done.stdout and "1.00" in done.stdout
    assert not is_listening(free_port)


@pytest.mark.e2e
def test_inv_stop_ends_the_evaluation_and_its_server(bench: Bench, tmp_path: Path, free_port: int) -> None:
    eval_inventory(bench, tmp_path, free_port, accept=0.5, token_seconds=5.0)
    following = subprocess.Popen([sys.executable, "-m", "invoke", "eval", "-i", "test"], cwd=bench.checkout,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: setup_is_serving(bench, free_port), 30, "the baseline server to answer")

        bench.inv("stop", "-d", "draft")

        assert not is_listening(free_port), "the server outlived inv stop"
        assert bench.wait_state("draft/eval", {"stopped"}, timeout=20)["state"] == "stopped"
        output, _ = following.communicate(timeout=30)
        assert following.returncode != 0 and "stopped" in output, output
    finally:
        following.kill()


def setup_is_serving(bench: Bench, port: int) -> bool:
    return is_listening(port) and bench.poll().get("draft/eval", {}).get("state") == "running"


def test_the_launch_command_is_sglang_s_with_the_inventory_s_flags_and_the_setting_s() -> None:
    settings = EvalSettings.from_config(complete("eval", {
        "launcher": "{python} -m sglang.launch_server", "model": "/m/Kimi K2.5", "port": 30100,
        "server_args": ["--tp-size", "8", "--trust-remote-code"], "draft": "/r/data/draft/train/draft"}))

    baseline = launch_command(settings, None)
    speculative = launch_command(settings, Setting(3, 1, 4))

    assert baseline.endswith("-m sglang.launch_server --model-path '/m/Kimi K2.5' --host 127.0.0.1 --port 30100 "
                             "--tp-size 8 --trust-remote-code --max-running-requests 48")  # SGLang's speculative cap, on both
    assert speculative == baseline + (" --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                                      "/r/data/draft/train/draft --speculative-num-steps 3 "
                                      "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    sglang_standin.parse(speculative.split(" ", 3)[-1].replace("'/m/Kimi K2.5'", "/m/Kimi").split())  # flags SGLang takes


def test_the_report_names_the_fastest_setting_and_warns_on_slower_serving_and_unused_drafts() -> None:
    baseline = Measurement(completion_tokens=900, verify_ct=0, seconds=10.0, requests=3)
    good, unused = Setting(3, 1, 4), Setting(5, 1, 6)

    report = reports.build(baseline, [(good, Measurement(900, 421, 10.9, 3)), (unused, Measurement(900, 880, 12.0, 3))],
                           "/d", [])

    assert report["baseline"]["tokens_per_s"] == 90.0
    assert [c["accept_length"] for c in report["configs"]] == [2.138, 1.023]
    assert report["best"]["num_steps"] == 3 and report["best"]["speedup"] == pytest.approx(0.917, abs=0.001)
    assert any("about 1.0" in w and "num_steps 5" in w for w in report["warnings"])
    assert any("SLOWER" in w and "82.6 tok/s against 90.0" in w for w in report["warnings"])
    no_spec = reports.build(baseline, [(good, Measurement(900, 0, 9.0, 3))], "/d", [])
    assert any("no spec_verify_ct" in w for w in no_spec["warnings"])


def test_eval_refuses_to_share_the_gpu_with_a_running_pipeline_or_gpu_job() -> None:
    from local.evaluation import gpu_holders

    def job(key: str, state: str) -> dict:
        dataset, stage = key.split("/")
        return {"dataset": dataset, "stage": stage, "state": state}

    busy = {"jobs": [job("A1/prep", "running"), job("draft/train", "running"), job("pipeline/run", "stalled"),
                     job("B5/extract", "waiting"), job("B5/infer", "failed")]}

    assert gpu_holders(busy) == ["draft/train", "pipeline/run"]
    assert gpu_holders({"jobs": [job("A1/prep", "running"), job("B5/extract", "waiting")]}) == []
