"""`inv status` end to end: the time left of a running job, and the host's GPUs, in the one remote command.

The GPU test puts a stand-in `nvidia-smi` (a shell script printing the CSV of
``--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total`` and
``--query-compute-apps=pid,gpu_uuid,used_memory`` with ``--format=csv,noheader,nounits``)
first on the PATH that the `local` backend's host command inherits: this
machine has no NVIDIA GPU. It names the running job's supervisor as the GPU's
compute process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from tests.helpers.busy_gpus import STAND_IN

pytestmark = [pytest.mark.e2e, pytest.mark.backends("ssh")]


def test_a_running_job_with_a_known_total_has_eta_s_in_json_and_an_eta_in_the_table(bench: Bench) -> None:
    bench.scripted({"A": "records=400 sleep=0.05 total=400"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    wait_for(lambda: bench.poll().get("A/prep", {}).get("eta_s") is not None, 60, "a time left for A/prep")
    job = bench.status()["A/prep"]
    assert job["total"] == 400 and 0 < job["done"] <= 400
    if job["state"] == "running":  # not finished in between
        assert 0 < job["eta_s"] < 400 * 0.05 * 20
    table = bench.inv("status").stdout
    assert "eta" in table.splitlines()[2] and "1 job: " in table
    bench.wait_state("A/prep", {"succeeded"}, timeout=60)


def test_gpus_appear_with_their_holder_when_the_host_has_nvidia_smi(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local", None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    bench.scripted({"A": "records=1 hold=30"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    bench.wait_state("A/prep", {"running"})
    state = json.loads((bench.root / "jobs" / "A" / "prep" / "state.json").read_text())
    (bin_dir / "pid").write_text(str(state["pid"]))
    try:
        listed = bench.status()
        assert listed["A/prep"]["gpus"] == [{"index": 0, "utilization": 97.0, "memory_used": 70000.0,
                                             "memory_total": 81559.0}]
        table = bench.inv("status").stdout
        assert "GPU 0: util 97%, mem 68/80 GiB, A/prep" in table
        assert "GPU 1: util 0%, mem 0/80 GiB, idle" in table
    finally:
        bench.inv("stop", "--all")


def test_an_inv_run_pipeline_has_a_time_left_for_the_whole_run(tmp_path: Path, free_port: int) -> None:
    from tests.helpers.pipelines import pipeline_inventory

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local", None)
    plans = tmp_path / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "native"})
    for dataset in ("A", "B"):
        (plans / f"{dataset}.prep").write_text("records=10 total=10")
        (plans / f"{dataset}.extract").write_text("records=10 sleep=0.4 total=10")  # extract reads prep's 10
    bench.inv("deploy")
    bench.inv("run")
    seen: dict = {}

    def one_extract_runs_and_the_other_waits() -> bool:
        seen.clear()
        seen.update(bench.poll())
        states = sorted(seen.get(f"{d}/extract", {}).get("state") or "" for d in "AB")
        running = [seen[f"{d}/extract"] for d in "AB" if seen.get(f"{d}/extract", {}).get("state") == "running"]
        return (states == ["running", "waiting"] and running[0].get("eta_s") is not None
                and seen["pipeline/run"].get("eta_s") is not None)

    wait_for(one_extract_runs_and_the_other_waits, 60, "one extract running with a time left, the other waiting")
    running = next(seen[f"{d}/extract"] for d in "AB" if seen[f"{d}/extract"]["state"] == "running")
    runner = seen["pipeline/run"]
    # The other extract (10 records at the running one's rate) waits for the GPU; the draft's training has no
    # estimate yet, so the whole run's figure is a floor.
    assert runner["eta_s"] > running["eta_s"] and runner["eta_complete"] is False
    bench.wait_state("pipeline/run", {"succeeded"}, timeout=90)
