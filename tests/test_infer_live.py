"""The infer stage end to end against a real `transformers serve` of the tiny model on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.infer_fixtures import (  # noqa: F401 (fixtures)
    Server,
    live_server,
    make_prompts,
    read_jsonl,
    stage_env,
    subprocess_env,
    tiny_model,
    write_prep,
)

from remote.stages import infer

pytestmark = pytest.mark.e2e  # a real `transformers serve`: not the unit tier


def launch_infer(data: Path, settings: dict, progress: Path) -> subprocess.Popen:
    """The stage as the supervisor runs it: its own process, its contract's environment."""
    env = subprocess_env(stage_env(data, settings, progress))
    return subprocess.Popen(
        [sys.executable, "-m", "remote.stages.infer"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def settings_for(server: Server, **extra: object) -> dict:
    return {"server_url": server.url, "model": str(server.model_dir), "max_tokens": 8, "concurrency": 4, **extra}


def test_every_prompt_is_answered_once_by_a_real_server(live_server: Server, tmp_path: Path) -> None:
    data = tmp_path / "data" / "B5"
    prompts = make_prompts(12)
    write_prep(data, prompts)
    progress_file = tmp_path / "progress.json"

    job = launch_infer(data, settings_for(live_server, chat_template_kwargs={"thinking": False}), progress_file)
    _, stderr = job.communicate(timeout=120)

    assert job.returncode == 0, stderr
    records = read_jsonl(data / "infer" / "conversations.jsonl")
    assert sorted(r["id"] for r in records) == [p["id"] for p in prompts]
    by_id = {p["id"]: p for p in prompts}
    for record in records:
        *asked, answer = record["conversations"]
        assert asked == by_id[record["id"]]["conversations"]
        assert answer["role"] == "assistant" and answer["content"]
    progress = json.loads(progress_file.read_text())
    assert (progress["records"], progress["skip_reasons"]) == (12, {})
    assert progress["metrics"]["completion_tokens"] > 0
    manifest = json.loads((data / "infer" / "manifest.json").read_text())
    assert manifest["records"] == 12 and manifest["upstream"]["release"] == "r1"


def test_a_server_killed_mid_run_fails_the_job_and_the_rerun_resumes_without_duplicates(
    tiny_model: Path, live_server: Server, tmp_path: Path
) -> None:
    data = tmp_path / "data" / "B5"
    prompts = make_prompts(40)
    write_prep(data, prompts)
    part = data / "infer" / infer.PART
    server = Server(tiny_model, tmp_path / "server.log").start()
    settings = settings_for(server, max_tokens=16, concurrency=2, retries=1, backoff=0.05)

    job = launch_infer(data, settings, tmp_path / "progress.json")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not part.exists() or len(part.read_bytes().splitlines()) < 5):
            time.sleep(0.05)
    finally:
        server.stop()
    _, stderr = job.communicate(timeout=60)

    assert job.returncode == 1
    message = stderr.strip().splitlines()[-1]
    assert message.startswith("infer: ") and "prompts not answered" in message and "connection refused" in message
    first_ids = [r["id"] for r in read_jsonl(part)]
    assert 5 <= len(first_ids) < 40
    assert len(set(first_ids)) == len(first_ids)
    assert not (data / "infer" / "conversations.jsonl").exists()

    # The server comes back (here: the session's one, serving the same model).
    job = launch_infer(data, {**settings, "server_url": live_server.url}, tmp_path / "progress.json")
    _, stderr = job.communicate(timeout=120)

    assert job.returncode == 0, stderr
    ids = [r["id"] for r in read_jsonl(data / "infer" / "conversations.jsonl")]
    assert len(ids) == len(set(ids)) == 40
    assert set(ids) == {p["id"] for p in prompts}
    assert ids[: len(first_ids)] == first_ids, "the first run's answers are kept, not asked again"
    assert json.loads((tmp_path / "progress.json").read_text())["records"] == 40
