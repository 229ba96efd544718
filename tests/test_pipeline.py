"""`inv run`'s scheduling, end to end through the real tasks over the loopback sshd
(the scheduling is the host's; the local backend's transport is test_control_plane.py's).

Every stage is benchmarks/harness/scripted_stage.py (plans per dataset and stage in a
directory), so these tests are about order, the GPU's exclusivity, the managed
server, failures and resuming, not about what the stages compute (the stages'
own tests and test_demo.py cover that with the tiny model).
"""

from __future__ import annotations

import sys
import time

import pytest

from benchmarks.harness.checkout import Bench, wait_for
from tests.helpers.pipelines import pipeline_inventory, traces, wait_pipeline

pytestmark = [pytest.mark.e2e, pytest.mark.backends("ssh")]


def test_run_follows_the_dag_and_never_shares_the_gpu(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts"})
    url = f"http://127.0.0.1:{free_port}/health"
    (plans / "B.infer").write_text(f"records=2 need_url={url}")
    for job in ("A.extract", "B.extract", "draft.train"):
        (plans / job).write_text(f"records=1 sleep=0.3 shun_url={url}")
    bench.inv("deploy")
    started = bench.inv("run")
    assert "pipeline started" in started.stdout and "8 jobs: 7 and the runner" in started.stdout
    jobs = wait_pipeline(bench)
    assert {k: j["state"] for k, j in jobs.items()} == {
        "A/prep": "succeeded", "A/extract": "succeeded", "B/prep": "succeeded", "B/infer": "succeeded",
        "B/tokenize": "succeeded", "B/extract": "succeeded", "draft/train": "succeeded", "pipeline/run": "succeeded"}
    seen = traces(plans)
    for before, after in [("A.prep", "A.extract"), ("B.prep", "B.infer"), ("B.infer", "B.tokenize"),
                          ("B.tokenize", "B.extract"), ("A.extract", "draft.train"), ("B.extract", "draft.train")]:
        assert seen[before]["end"] <= seen[after]["start"], (before, after)
    gpu = sorted((seen[k]["start"], seen[k]["end"]) for k in ("B.infer", "A.extract", "B.extract", "draft.train"))
    assert all(a[1] <= b[0] for a, b in zip(gpu, gpu[1:])), "two GPU jobs overlapped"
    with pytest.raises(OSError):  # the server was stopped at the end
        __import__("urllib.request").request.urlopen(url, timeout=2)


def test_a_failure_blocks_its_dependents_and_rerun_resumes_from_it(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "C": "native"})
    fixed = plans / "fixed"
    (plans / "A.extract").write_text(f"records=1 exit=2 unless={fixed}")
    bench.inv("deploy")
    bench.inv("run")
    jobs = wait_pipeline(bench)
    assert jobs["A/extract"]["state"] == "failed" and jobs["C/extract"]["state"] == "succeeded"
    assert jobs["draft/train"]["state"] == "blocked" and "draft.train" not in traces(plans)
    assert jobs["draft/train"]["blocked_by"] == ["A/extract"]
    assert jobs["pipeline/run"]["state"] == "failed"
    status = bench.inv("status", check=False)
    assert status.returncode == 1 and "blocked" in status.stdout
    first_c = jobs["C/extract"]["started_at"]

    fixed.write_text("")
    rerun = bench.inv("rerun", "--failed")
    assert "relaunched pipeline/run" in rerun.stdout
    jobs = wait_pipeline(bench)
    assert jobs["A/extract"]["state"] == "succeeded" and jobs["draft/train"]["state"] == "succeeded"
    assert jobs["C/extract"]["started_at"] == first_c  # succeeded jobs are not run again


def test_run_refuses_a_second_pipeline_while_one_runs(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native"})
    (plans / "A.prep").write_text("records=100 sleep=0.2")
    bench.inv("deploy")
    bench.inv("run")
    bench.wait_state("A/extract", {"waiting"})
    assert "waits for A/prep" in bench.inv("status").stdout
    again = bench.inv("run", check=False)
    assert again.returncode == 2 and "already running" in again.stderr
    bench.inv("stop", "--all")


def test_the_pipeline_finishes_after_the_laptop_disconnects(bench: Bench, free_port: int) -> None:
    if bench.backend != "ssh":
        pytest.skip("only SSH has a connection to drop")
    assert bench.sshd is not None
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "native"})
    (plans / "A.prep").write_text("records=10 sleep=0.2")
    bench.inv("deploy")
    import subprocess

    follower = subprocess.Popen([sys.executable, "-m", "invoke", "run", "--follow", "-i", "test"], cwd=bench.checkout,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (bench.root / "jobs" / "A" / "prep" / "state.json").exists(), 30, "the pipeline to start")
    time.sleep(0.5)
    assert bench.sshd.kill_connections() >= 1  # the laptop's link drops mid-run
    _, err = follower.communicate(timeout=60)
    # Dropped during a refresh, the follower says so in one line; dropped between two, it connects
    # again (local/transport/openssh.py) and follows to the end. Never a traceback.
    assert "Traceback" not in err
    assert follower.returncode == 0 or "connection was lost" in err, err
    jobs = wait_pipeline(bench)
    assert all(j["state"] == "succeeded" for j in jobs.values()), jobs
