"""Regeneration through the real tasks: `inv run` on the local backend, prep and tokenize with Kimi-K2.5's
real tokenizer and chat template, infer against a loopback target that answers deterministically from
what it is asked and logs every request (`tests.infer_fixtures.echo_target`); extract and train scripted.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from benchmarks.harness.checkout import SCRIPTED, Bench, wait_for
from tests.infer_fixtures import ScriptedServer, echo_target, read_jsonl, stage_env
from tests.prep_fixtures import KIMI_DIR, kimi_tokenizer
from tests.regeneration_rows import WEATHER, write_rows

from remote.control_plane.progress import Progress
from remote.stages import StageContext, infer

pytestmark = pytest.mark.e2e

ENDED = {"succeeded", "empty", "failed", "died", "stopped", "blocked"}


@pytest.fixture(autouse=True)
def _kimi_tokenizer_here() -> None:
    kimi_tokenizer()  # skips where Kimi-K2.5's tokenizer is absent, before a checkout is copied


def inventory(bench: Bench, rows: Path, server: ScriptedServer, **infer_settings: Any) -> None:
    plans = bench.root.parent / "plans"
    plans.mkdir(exist_ok=True)
    scripted = {"command": f"{{python}} {SCRIPTED} {plans}"}
    server.routes["/health"] = {}
    bench.inventory({"B": {"source": str(rows), "kind": "prompts", "sample": str(rows)}},
                    {"prep": {"max_length": 2048}, "extract": scripted, "train": scripted,
                     "infer": {"server_url": server.url, "model": "kimi", "concurrency": 2, "retries": 0,
                               **infer_settings}},
                    target={"tokenizer": str(KIMI_DIR), "trust_remote_code": True})


def records(path: Path) -> dict[str, Any]:
    return {r["id"]: r for r in read_jsonl(path)}


def test_inv_run_answers_every_turn_keeps_the_calls_and_counts_what_it_did_not_regenerate(
        bench: Bench, tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "chats.jsonl")
    with ScriptedServer(echo_target) as server:
        inventory(bench, rows, server)
        bench.inv("deploy")
        bench.inv("run")
        assert bench.wait_state("B/tokenize", ENDED, timeout=300)["state"] == "succeeded"
        status = bench.inv("status").stdout

    data = bench.root / "data" / "B"
    found = records(data / "infer" / "conversations.jsonl")
    asked = [b["messages"] for b in server.bodies if b["messages"][:2][-1]["content"] == "question 1"]
    assert [[m["content"] for m in messages if m["role"] == "assistant"] for messages in asked] == [
        [f"answer {j} to question {j}" for j in range(1, k)] for k in range(1, 6)], "in order, the target's own"
    assert [t["content"] for t in found["chat5"]["conversations"] if t["role"] == "assistant"] == [
        f"answer {k} to question {k}" for k in range(1, 6)]
    assert all(b["tools"] == WEATHER for b in server.bodies if "call get_weather" in b["messages"][0]["content"])
    assert [t["role"] for t in found["matching"]["conversations"]] == [
        "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [t["role"] for t in found["diverging"]["conversations"]] == ["user", "assistant"]
    assert found["diverging"]["conversations"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert found["long"]["regenerated"]["finish_reasons"] == ["stop", "length"]

    turns = json.loads((data / "infer" / "manifest.json").read_text())["turns"]
    assert (turns["of_rows"], turns["answered"], turns["truncated"]) == (14, 11, 1)
    assert turns["not_regenerated"] == {"tool call diverged": 2, "truncated": 1}
    line = next(line for line in status.splitlines() if " infer " in line or "│ infer" in line)
    assert "truncated=1" in line and "tool_calls_diverged=1" in line and "turns_not_regenerated=3" in line, status

    tokenized = json.loads((data / "tokenize" / "manifest.json").read_text())
    assert tokenized["skip_reasons"] == {} and tokenized["kept"] == 4
    assert tokenized["assistant_turns"] == 11, "every regenerated turn learned once, the calls through Kimi's template"
    assert tokenized["tool_declarations"] == {"typescript": 2}


def test_inv_run_with_truncated_drop_leaves_the_cut_answer_out_and_says_so(bench: Bench, tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "chats.jsonl")
    with ScriptedServer(echo_target) as server:
        inventory(bench, rows, server, truncated="drop")
        bench.inv("deploy")
        bench.inv("run")
        assert bench.wait_state("B/tokenize", ENDED, timeout=300)["state"] == "succeeded"
        status = bench.inv("status").stdout

    data = bench.root / "data" / "B"
    found = records(data / "infer" / "conversations.jsonl")
    assert [t["content"] for t in found["long"]["conversations"] if t["role"] == "assistant"] == ["answer 1 to first"]
    turns = json.loads((data / "infer" / "manifest.json").read_text())["turns"]
    assert (turns["answered"], turns["truncated"], turns["truncated_dropped"]) == (10, 1, 1)
    line = next(line for line in status.splitlines() if " infer " in line or "│ infer" in line)
    assert "truncated=1" in line and "truncated_dropped=1" in line, status
    assert json.loads((data / "tokenize" / "manifest.json").read_text())["assistant_turns"] == 10


def test_a_kill_mid_run_and_rerun_failed_give_the_records_of_an_uninterrupted_run(bench: Bench, tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "chats.jsonl")
    held, release = threading.Event(), threading.Event()
    count = {"n": 0}

    def holds_the_eighth(body: dict[str, Any], attempt: int) -> tuple[int, Any]:
        count["n"] += 1
        if count["n"] >= 8 and not release.is_set():
            held.set()  # the run is in the middle of a conversation: kill it here
            release.wait(60)
        return echo_target(body)

    data = bench.root / "data" / "B"
    with ScriptedServer(holds_the_eighth) as server:
        inventory(bench, rows, server, concurrency=1)
        bench.inv("deploy")
        bench.inv("run")
        wait_for(held.is_set, 300, "infer to be half way")
        supervisor = psutil.Process(bench.poll()["B/infer"]["pid"])
        for child in supervisor.children(recursive=True):
            os.kill(child.pid, signal.SIGKILL)
        assert bench.wait_state("B/infer", ENDED, timeout=60)["state"] in ("failed", "died")
        half = read_jsonl(data / "infer" / infer.PART)
        release.set()
        assert "relaunched" in bench.inv("rerun", "--failed").stdout
        bench.wait_state("B/infer", {"succeeded"}, timeout=300)  # until then, the states are the killed run's
        bench.wait_state("B/tokenize", {"succeeded"}, timeout=300)

    assert 0 < len(half) < 4 and all(r["regenerated"]["finish_reasons"] for r in half)
    reference = tmp_path / "reference" / "B"
    (reference / "prep").mkdir(parents=True)
    for name in ("prompts.jsonl", "manifest.json"):
        (reference / "prep" / name).write_bytes((data / "prep" / name).read_bytes())
    with ScriptedServer(echo_target) as server:
        settings = {"server_url": server.url, "model": "kimi", "concurrency": 1}
        infer.run_stage(StageContext.from_env(stage_env(reference, settings)), Progress())
    assert records(data / "infer" / "conversations.jsonl") == records(reference / "infer" / "conversations.jsonl")
