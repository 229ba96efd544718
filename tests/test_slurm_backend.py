"""The Slurm backend end to end: the real tasks, a real single-node Slurm cluster (no slurmdbd).

The login node is this machine (`host` without an address); jobs are `sbatch`ed and
run the same supervisor and stage contract inside their allocations.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.checkout import SAMPLES, SCRIPTED, Bench, wait_for
from benchmarks.harness.slurm_cluster import SlurmCluster
from benchmarks.harness.sshd import SshServer

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.backends("slurm")]
ENDED = {"succeeded", "failed", "empty", "died", "stopped"}


def slurm_inventory(bench: Bench, slurm: SlurmCluster, datasets: dict[str, str], plans: Path | None = None,
                    kinds: dict[str, str] | None = None, login: SshServer | None = None,
                    layers: list[int] | None = None) -> None:
    """`datasets` maps a name to the scripted stage's plan (or, with `plans`, to nothing);
    `login`: reach the login node over SSH instead of running its commands here; `layers`: stages.extract's."""
    command = f"{{python}} {SCRIPTED}" + (f" {plans}" if plans else "")
    host = {"root": str(bench.root), "python": bench.python, "env": slurm.env}
    if login is not None:
        host |= {"address": login.address, "port": login.port, "user": login.user, "identity": str(login.identity),
                 "known_hosts": str(login.known_hosts), "ssh_config": str(login.ssh_config)}
    document = {
        "backend": "slurm",
        "host": host,
        "slurm": {"partition": slurm.partition, "time": "5"},
        "stages": {stage: {"command": command} | ({"layers": layers} if layers and stage == "extract" else {})
                   for stage in ("prep", "infer", "extract", "train")},
        "datasets": {name: {"source": plan, "kind": (kinds or {}).get(name, "native"),
                            "sample": str(SAMPLES[(kinds or {}).get(name, "native")])}
                     for name, plan in datasets.items()},
    }
    import yaml

    (bench.checkout / "inventories" / "test.yaml").write_text(yaml.safe_dump(document))


def settle(bench: Bench, keys: set[str], timeout: float = 60) -> dict[str, dict[str, Any]]:
    wait_for(lambda: all(bench.poll().get(k, {}).get("state") in ENDED for k in keys), timeout, f"{keys} to end")
    return bench.poll()


@pytest.mark.parametrize("login", ["here", "ssh"])
def test_launch_status_and_logs_on_slurm(bench: Bench, slurm: SlurmCluster, login: str,
                                         request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("sshd") if login == "ssh" else None
    slurm_inventory(bench, slurm, {"A": "records=3", "B": "records=0 skip=2 reason=bad-schema"}, login=server)
    bench.inv("deploy")
    launched = bench.inv("launch", "--stage", "prep")
    assert "launched A/prep (Slurm job " in launched.stdout
    jobs = settle(bench, {"A/prep", "B/prep"})
    assert jobs["A/prep"]["state"] == "succeeded" and jobs["A/prep"]["records"] == 3
    assert jobs["B/prep"]["state"] == "empty" and jobs["B/prep"]["skip_reasons"] == {"bad-schema": 2}
    assert jobs["A/prep"]["slurm_state"] == "COMPLETED" and jobs["A/prep"]["node"] == slurm.node
    listed = {f"{j['dataset']}/{j['stage']}": j for j in json.loads(bench.inv("status", "--json", check=False).stdout)}
    assert listed["A/prep"]["slurm_state"] == "COMPLETED"
    assert bench.inv("status", check=False).returncode == 1
    assert "record 3" in bench.inv("logs", "A").stdout


def test_rerun_failed_resubmits_only_the_failed_job(bench: Bench, slurm: SlurmCluster) -> None:
    fixed = bench.root.parent / "fixed"
    slurm_inventory(bench, slurm, {"good": "records=1", "bad": f"records=1 exit=3 unless={fixed}"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    jobs = settle(bench, {"good/prep", "bad/prep"})
    assert jobs["bad/prep"]["state"] == "failed" and jobs["bad/prep"]["slurm_state"] == "FAILED"
    first_good = jobs["good/prep"]["slurm_job_id"]
    fixed.write_text("")
    rerun = bench.inv("rerun", "--failed")
    assert "relaunched bad/prep (Slurm job" in rerun.stdout and "good" not in rerun.stdout
    jobs = settle(bench, {"bad/prep"})
    assert jobs["bad/prep"]["state"] == "succeeded"
    assert jobs["good/prep"]["slurm_job_id"] == first_good


def test_stop_cancels_running_and_pending_jobs(bench: Bench, slurm: SlurmCluster, tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "A.prep").write_text("records=200 sleep=0.2")
    slurm_inventory(bench, slurm, {"A": ""}, plans=plans)
    bench.inv("deploy")
    bench.inv("run")  # A/extract waits on A/prep with afterok
    bench.wait_state("A/prep", {"running"}, timeout=60)
    assert "pending in Slurm (Dependency)" in bench.poll()["A/extract"]["message"]
    queued = bench.inv("logs", "A", "--stage", "extract", check=False)  # a queued job has written no log yet
    assert queued.returncode != 0 and "A/extract has no log yet (it is waiting)" in queued.stderr
    assert "Traceback" not in queued.stderr
    assert bench.inv("launch", "--stage", "prep").stdout.count("already running (Slurm job") == 1
    stopped = bench.inv("stop", "--all")
    assert "stopped A/prep" in stopped.stdout and "stopped A/extract" in stopped.stdout
    jobs = settle(bench, {"A/prep", "A/extract", "draft/train"})
    assert jobs["A/prep"]["state"] == "stopped" and jobs["A/prep"]["slurm_state"].startswith("CANCELLED")
    assert jobs["A/extract"]["state"] == "stopped"
    # --follow waits for a queued job's log, but not for one that ended in the queue.
    never_ran = bench.inv("logs", "A", "--stage", "extract", "--follow", check=False, timeout=30)
    assert "A/extract has no log yet (it is stopped)" in never_ran.stderr


def test_a_killed_supervisor_shows_slurms_end_state(bench: Bench, slurm: SlurmCluster) -> None:
    slurm_inventory(bench, slurm, {"A": "records=200 sleep=0.2"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    wait_for(lambda: bench.poll()["A/prep"].get("pid") is not None, 60, "the supervisor to start in its allocation")
    os.kill(bench.poll()["A/prep"]["pid"], signal.SIGKILL)
    jobs = settle(bench, {"A/prep"})
    assert jobs["A/prep"]["state"] in ("failed", "died")
    assert jobs["A/prep"]["slurm_state"] in ("FAILED", "CANCELLED") and "Slurm" in jobs["A/prep"]["message"]
    assert bench.inv("status", check=False).returncode == 1


def test_a_pipeline_on_slurm_runs_by_dependencies_and_resumes_after_a_failure(bench: Bench, slurm: SlurmCluster,
                                                                              tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "A.extract").write_text("records=1 need_layers=1,2,3")  # B's extract takes any layers
    slurm_inventory(bench, slurm, {"A": "", "B": ""}, plans=plans, kinds={"B": "prompts"}, layers=[0, 1, 2])
    bench.inv("deploy")
    submitted = bench.inv("run", "--follow", check=False, timeout=180)  # ends when all ended or stuck
    assert submitted.returncode == 1  # A/extract failed
    assert submitted.stdout.count("submitted") == 7  # A: prep, extract; B: prep, infer, tokenize, extract; train
    keys = {"A/prep", "A/extract", "B/prep", "B/infer", "B/tokenize", "B/extract"}
    jobs = settle(bench, keys, timeout=120)
    assert jobs["A/extract"]["state"] == "failed" and jobs["B/extract"]["state"] == "succeeded"
    wait_for(lambda: "DependencyNeverSatisfied" in (bench.poll()["draft/train"]["message"] or ""), 30, "a stuck train")
    train = bench.poll()["draft/train"]
    assert train["state"] == "blocked" and "A/extract" in train["blocked_by"], train  # as the runner's are
    seen = {p.stem: json.loads(p.read_text()) for p in (plans / "trace").glob("*.json")}
    assert seen["B.infer"]["end"] <= seen["B.tokenize"]["start"] <= seen["B.tokenize"]["end"] <= seen["B.extract"]["start"]

    slurm_inventory(bench, slurm, {"A": "", "B": ""}, plans=plans, kinds={"B": "prompts"}, layers=[1, 2, 3])
    rerun = bench.inv("rerun", "--failed")  # the inventory's fix reaches the resubmitted jobs
    assert "relaunched A/extract" in rerun.stdout and "relaunched draft/train" in rerun.stdout
    assert "A/extract: stages.extract.layers [0, 1, 2] -> [1, 2, 3]" in rerun.stdout

    jobs = settle(bench, keys | {"draft/train"}, timeout=120)
    assert all(job["state"] == "succeeded" for job in jobs.values()), {k: j["state"] for k, j in jobs.items()}
    assert json.loads((plans / "trace" / "draft.train.json").read_text())["start"] >= \
        json.loads((plans / "trace" / "A.extract.json").read_text())["end"]
