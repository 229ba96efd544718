"""What `inv status` learns in the same round trip besides the jobs: time left, and the GPUs.

The GPU tests put a stand-in `nvidia-smi` (a shell script) first on PATH: this
machine has no NVIDIA GPU, and the script prints exactly the CSV that
``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` and
``--query-compute-apps=...`` print on a GPU host, with the pid of a real process
started in a session of its own, as a job's supervisor is.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.control_plane import eta, gpus, processes
from remote.prep.count import estimate_rows
from remote.prep.load import Source
from remote.control_plane.progress import Progress
from benchmarks.harness.checkout import wait_for
from tests.helpers.busy_gpus import STAND_IN


@pytest.fixture
def stand_in_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_gpus_show_utilisation_memory_and_the_job_whose_session_holds_them(stand_in_nvidia_smi: Path,
                                                                            tmp_path: Path) -> None:
    supervisor = subprocess.Popen(["sleep", "30"], start_new_session=True)  # leads its session, as a job does
    try:
        (stand_in_nvidia_smi / "pid").write_text(str(supervisor.pid))
        status = {"jobs": [{"dataset": "A1", "stage": "extract", "state": "running", "pid": supervisor.pid},
                           {"dataset": "B5", "stage": "prep", "state": "succeeded", "pid": 1}]}
        gpus.annotate(tmp_path, status)
    finally:
        supervisor.kill()
        supervisor.wait()
    assert status["gpus"] == [
        {"index": 0, "uuid": "GPU-aaa", "utilization": 97.0, "memory_used": 70000.0, "memory_total": 81559.0,
         "held_by": ["A1/extract"]},
        {"index": 1, "uuid": "GPU-bbb", "utilization": 0.0, "memory_used": 1.0, "memory_total": 81559.0,
         "held_by": []},
    ]


def test_the_pipelines_inference_server_is_named_as_the_holder(stand_in_nvidia_smi: Path, tmp_path: Path) -> None:
    server = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (stand_in_nvidia_smi / "pid").write_text(str(server.pid))
        (tmp_path / "jobs" / "pipeline").mkdir(parents=True)
        record = tmp_path / "jobs" / "pipeline" / "server.json"
        record.write_text(json.dumps(processes.identity(server.pid)))
        status = gpus.annotate(tmp_path, {"jobs": []})
        # A record that cannot prove the pid is still that server (written before a reboot, the pid since
        # given to another process, or only a pid) names no server.
        for unproven in ({**processes.identity(server.pid), "pid_start": 1}, {"pid": server.pid}):
            record.write_text(json.dumps(unproven))
            assert gpus.annotate(tmp_path, {"jobs": []})["gpus"][0]["held_by"] == [f"pid {server.pid}"]
    finally:
        server.kill()
        server.wait()
    assert status["gpus"][0]["held_by"] == [gpus.SERVER]


SLOW_STAND_IN = """#!/bin/sh
# A slow driver: each query notes when it starts and ends, around a sleep.
echo "start $1" >> "$(dirname "$0")/calls"
sleep "$(cat "$(dirname "$0")/delay")"
echo "end $1" >> "$(dirname "$0")/calls"
printf '0, GPU-aaa, 5, 10, 81559\\n'
"""


def slow_nvidia_smi(bin_dir: Path, delay: float) -> Path:
    (bin_dir / "nvidia-smi").write_text(SLOW_STAND_IN)
    (bin_dir / "delay").write_text(str(delay))
    return bin_dir / "calls"


def test_both_queries_run_at_once_started_before_the_jobs_are_read(stand_in_nvidia_smi: Path,
                                                                   tmp_path: Path) -> None:
    calls = slow_nvidia_smi(stand_in_nvidia_smi, 0.5)
    query = gpus.Query()
    # What `status` does meanwhile: the queries are under way before the jobs are read.
    wait_for(lambda: calls.exists() and len(calls.read_text().splitlines()) >= 2, 10, "two queries to start")
    assert [line.split()[0] for line in calls.read_text().splitlines()[:2]] == ["start", "start"]
    status = gpus.annotate(tmp_path, {"jobs": []}, query)
    assert status["gpus"][0]["uuid"] == "GPU-aaa"
    assert sorted(calls.read_text().split()[::2]) == ["end", "end", "start", "start"]


def test_a_wedged_driver_gives_no_gpus_and_its_queries_are_killed(stand_in_nvidia_smi: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls = slow_nvidia_smi(stand_in_nvidia_smi, 5)
    monkeypatch.setattr(gpus, "TIMEOUT", 0.5)
    query = gpus.Query()
    assert gpus.annotate(tmp_path, {"jobs": []}, query) == {"jobs": []}
    assert all(process.wait(timeout=2) == -signal.SIGKILL for process in query.started)
    assert "end" not in calls.read_text()


def test_without_nvidia_smi_there_is_no_gpu_key_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.annotate(tmp_path, {"jobs": []}) == {"jobs": []}


def write_progress(root: Path, key: str, **progress: object) -> None:
    directory = root / "jobs" / key
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "progress.json").write_text(json.dumps(progress))


def job(key: str, state: str, records: int = 0, **fields: object) -> dict:
    dataset, stage = key.split("/")
    return {"dataset": dataset, "stage": stage, "state": state, "records": records, "skipped": 0, **fields}


def test_a_running_job_with_a_total_gets_its_time_left(tmp_path: Path) -> None:
    write_progress(tmp_path, "B5/infer", records=900, total=1000, done=1000 - 100, rate=2.0)
    write_progress(tmp_path, "A1/prep", records=5)  # no total: no ETA
    status = eta.annotate(tmp_path, {"jobs": [job("B5/infer", "running"), job("A1/prep", "running")]})
    assert status["jobs"][0]["eta_s"] == 50.0
    assert status["jobs"][0]["total"] == 1000
    assert status["jobs"][1]["eta_s"] is None


def test_the_pipeline_estimate_replays_the_runner_one_gpu_job_at_a_time() -> None:
    def node(key: str, needs: list[str], gpu: bool) -> dict:
        return {"key": key, "needs": needs, "gpu": gpu, "spec": {"stage": key.split("/")[1]}}

    plan = [node("A/prep", [], False), node("B/prep", [], False),
            node("A/extract", ["A/prep"], True), node("B/extract", ["B/prep"], True)]
    jobs = [
        job("A/prep", "succeeded", records=100),
        job("B/prep", "running", total=300, eta_s=20.0),
        # A's extract runs at 2 records/s with 100 s left; B's (300 records) waits for the GPU and its prep.
        job("A/extract", "running", rate=2.0, eta_s=100.0),
        job("B/extract", "waiting"),
    ]
    seconds, complete = eta.pipeline_eta(plan, jobs)
    assert (seconds, complete) == (100.0 + 300 / 2.0, True)


def test_a_job_nothing_is_known_about_makes_the_estimate_a_lower_bound() -> None:
    plan = [{"key": "A/prep", "needs": [], "gpu": False, "spec": {"stage": "prep"}}]
    assert eta.pipeline_eta(plan, [job("A/prep", "waiting")]) == (0.0, False)


def test_progress_rate_counts_only_this_runs_work_after_a_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    progress = Progress(interval=0)
    progress.expect(1000)
    progress.written(500)  # answers from an earlier run
    progress.resumed()
    progress.flush()
    clock[0] += 10
    progress.written(20)
    snapshot = progress.snapshot()
    assert (snapshot["total"], snapshot["done"], snapshot["rate"]) == (1000, 520, 2.0)


def test_train_counts_towards_its_total_in_steps() -> None:
    progress = Progress()
    progress.expect(40, by="step")
    progress.written(8)
    progress.metrics(step=10)
    assert progress.done == 10


def test_rows_are_counted_cheaply_and_capped_by_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(1000)))
    assert estimate_rows(Source(str(data))) == 1000
    assert estimate_rows(Source(str(data), limit=10)) == 10

    from remote.prep import count

    monkeypatch.setattr(count, "EXACT_BYTES", 100)
    monkeypatch.setattr(count, "SAMPLE_BYTES", 2000)  # a big file: estimated from its first bytes
    assert abs(estimate_rows(Source(str(data))) - 1000) < 50


def fake_datasets(monkeypatch: pytest.MonkeyPatch, builder: object) -> list:
    """A stand-in `datasets` module (the real one is slow to import, and offline here)."""
    import types

    asked: list = []

    def load_dataset_builder(name: str, config: str | None) -> object:
        asked.append((name, config))
        if isinstance(builder, Exception):
            raise builder
        return builder

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset_builder=load_dataset_builder))
    return asked


def test_a_hub_datasets_rows_come_from_its_split_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    builder = types.SimpleNamespace(info=types.SimpleNamespace(splits={"train": types.SimpleNamespace(num_examples=83288)}))
    asked = fake_datasets(monkeypatch, builder)
    assert estimate_rows(Source("open-thoughts/OpenThoughts-114k", split="train")) == 83288
    assert estimate_rows(Source("open-thoughts/OpenThoughts-114k", split="test")) is None  # no such split
    assert asked[0] == ("open-thoughts/OpenThoughts-114k", None)
    fake_datasets(monkeypatch, ConnectionError("offline"))
    assert estimate_rows(Source("org/hub-dataset", limit=7)) == 7
    assert estimate_rows(Source("org/hub-dataset")) is None
