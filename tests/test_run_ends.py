"""A run that cannot finish ends, and says so: jobs behind a failure are `blocked` (for good in this
run, transitively), the runner ends when nothing can run any more, `inv run --follow` exits non-zero
naming them and the next step, and `inv rerun --failed` starts the failure and then them again. Without
a terminal, `--follow` prints a line per change of state while the run goes on.

Real parts: the real prep and infer stages (infer against a loopback server that is up but answers
every request with a 500: one that is down is refused before the run, tests/test_before_the_run.py), the runner and
the tasks, run as a user types them over the loopback sshd (what ends a run is the host's; the local
backend's transport is test_control_plane.py's); the other stages are benchmarks/harness/scripted_stage.py.
"""

from __future__ import annotations

import subprocess
import sys
import os
import threading
from pathlib import Path

import pytest

from benchmarks.harness.checkout import SAMPLES, SCRIPTED, Bench, wait_for
from tests.infer_fixtures import ScriptedServer
from tests.prep_fixtures import tiny_tokenizer_dir  # noqa: F401 (a session fixture, built once)

pytestmark = [pytest.mark.e2e, pytest.mark.backends("ssh")]


def follower(bench: Bench, *args: str) -> subprocess.Popen[str]:
    """`inv run --follow` with its output piped, as a log file or a CI step has it."""
    return subprocess.Popen([sys.executable, "-m", "invoke", "run", "--follow", "-i", "test", *args],
                            cwd=bench.checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})


def test_a_pipeline_whose_infer_fails_every_request_ends_blocked_and_follow_exits_non_zero(
        bench: Bench, tiny_tokenizer_dir: Path) -> None:  # noqa: F811
    plans = bench.root.parent / "plans"
    plans.mkdir()
    scripted = {"command": f"{{python}} {SCRIPTED} {plans}"}
    failing = ScriptedServer(lambda body, attempt: (500, {"error": "the server is out of memory"}))
    failing.routes["/health"] = {}  # up: `inv run` does not refuse it; every answer fails
    bench.inventory(
        {"B5": {"source": str(SAMPLES["prompts"]), "kind": "prompts"},
         "A1": {"source": str(SAMPLES["native"]), "kind": "native"}},
        {"prep": {"max_length": 1024},
         "infer": {"server_url": failing.url, "concurrency": 2, "retries": 0},
         "extract": {**scripted, "route": "offline"}, "train": scripted},
        target={"tokenizer": str(tiny_tokenizer_dir)})
    bench.inv("deploy")
    with failing:
        run = follower(bench)
        bench.wait_state("B5/infer", {"failed"}, timeout=120)
    # Within a minute of the failure, the run has ended and the follower with it.
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, out + err

    jobs = bench.poll()
    assert jobs["B5/infer"]["state"] == "failed" and "http 500" in jobs["B5/infer"]["message"]
    assert (jobs["B5/tokenize"]["state"], jobs["B5/tokenize"]["blocked_by"]) == ("blocked", ["B5/infer"])
    assert (jobs["B5/extract"]["state"], jobs["B5/extract"]["blocked_by"]) == ("blocked", ["B5/tokenize"])
    assert jobs["B5/tokenize"]["message"] == "blocked by B5/infer (failed)"
    # The failure at the root, however far up.
    assert jobs["B5/extract"]["message"] == "blocked by B5/tokenize, behind B5/infer (failed)"
    assert jobs["A1/extract"]["state"] == "succeeded"
    assert (jobs["draft/train"]["state"], jobs["draft/train"]["blocked_by"]) == ("blocked", ["B5/extract"])
    assert jobs["pipeline/run"]["state"] == "failed"
    assert "Traceback" not in err
    assert "B5/infer failed" in err and "3 blocked behind it: B5/tokenize, B5/extract, draft/train" in err
    assert "`inv rerun --failed`" in err

    status = bench.inv("status", check=False)
    assert status.returncode == 1 and "blocked" in status.stdout
    logs = bench.inv("logs", "B5", "--stage", "tokenize", check=False)
    assert logs.returncode == 2 and "waiting" not in logs.stderr
    assert "B5/tokenize has no log: it never started, blocked by B5/infer (failed); fix that" in logs.stderr


def test_rerun_failed_relaunches_the_failure_then_every_job_blocked_behind_it(bench: Bench, free_port: int) -> None:
    from tests.helpers.pipelines import pipeline_inventory, wait_pipeline

    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts"})
    fixed = plans / "fixed"
    (plans / "B.infer").write_text(f"records=2 exit=3 unless={fixed}")
    bench.inv("deploy")
    bench.inv("run")
    jobs = wait_pipeline(bench)
    assert [jobs[k]["state"] for k in ("B/infer", "B/tokenize", "B/extract", "draft/train")] == [
        "failed", "blocked", "blocked", "blocked"]
    first_a = jobs["A/extract"]["started_at"]

    fixed.write_text("")
    assert "relaunched pipeline/run" in bench.inv("rerun", "--failed").stdout
    jobs = wait_pipeline(bench)
    assert all(job["state"] == "succeeded" for job in jobs.values()), {k: j["state"] for k, j in jobs.items()}
    assert jobs["A/extract"]["started_at"] == first_a  # what succeeded is not run again
    assert jobs["B/infer"]["ended_at"] <= jobs["B/tokenize"]["started_at"]


def test_a_server_that_will_not_start_ends_the_run_in_one_line_and_rerun_failed_starts_the_fixed_one(
        bench: Bench, free_port: int) -> None:
    from tests.helpers.pipelines import pipeline_inventory, wait_pipeline

    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts"})
    inventory = bench.checkout / "inventories" / "test.yaml"
    fixed = inventory.read_text()
    inventory.write_text(fixed.replace("--bind", "--bnd"))  # the user's typo in stages.infer.server_command
    bench.inv("deploy")
    run = follower(bench)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, out + err

    jobs = bench.poll()
    said = jobs["pipeline/run"]["message"]
    assert "exited while starting: " in said and "unrecognized arguments: --bnd" in said, said
    assert "Traceback" not in err and "Error:" not in said.split("exited while starting")[0], (said, err)
    assert "waiting" not in {job["state"] for job in jobs.values()}, jobs  # no job left on a runner gone
    assert "the run did not succeed: pipeline/run failed; " in err, err  # the cause, then what is blocked behind it
    assert jobs["B/infer"]["state"] == "blocked" and "not started: inference server" in jobs["B/infer"]["message"]

    inventory.write_text(fixed)
    assert "relaunched pipeline/run" in bench.inv("rerun", "--failed").stdout
    jobs = wait_pipeline(bench)
    assert all(job["state"] == "succeeded" for job in jobs.values()), {k: j["state"] for k, j in jobs.items()}


def test_follow_piped_prints_a_line_per_change_while_the_run_goes_on_and_exits(bench: Bench, free_port: int) -> None:
    from tests.helpers.pipelines import pipeline_inventory

    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native"})
    (plans / "A.extract").write_text("records=10 sleep=0.5")  # a few seconds of run after A/prep ends
    bench.inv("deploy")
    run = follower(bench)
    arrived: list[tuple[str, bool]] = []  # each line, and whether A/extract was still running when it came

    def read() -> None:
        assert run.stdout is not None
        for line in run.stdout:
            arrived.append((line, not (plans / "trace" / "A.extract.json").exists()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: any(" A/prep succeeded" in line for line, _ in arrived), 60, "A/prep's line")
    assert run.poll() is None  # printed while the run goes on, not held back to its end
    assert [running for line, running in arrived if " A/prep succeeded: 1 records" in line] == [True]
    assert run.wait(timeout=60) == 0
    reader.join(timeout=10)
    lines = [line for line, _ in arrived]
    assert any(" A/extract running" in line for line in lines)
    assert any(" pipeline/run succeeded" in line for line in lines)
    assert any("4 jobs: 4 succeeded" in line for line in lines), "".join(lines)  # the summary, and the final table under it
    assert "Traceback" not in (run.stderr.read() if run.stderr else "")


def test_stop_refuses_a_dataset_the_inventory_does_not_name(bench: Bench) -> None:
    bench.scripted({"A1": "records=1"})
    unknown = f"aerie: unknown dataset A2 in {bench.checkout / 'inventories' / 'test.yaml'}: expected one of A1"
    for task in (["stop", "-d", "A2"], ["launch", "--stage", "prep", "-d", "A2"], ["logs", "A2"]):
        refused = bench.inv(*task, check=False)
        assert (refused.returncode, refused.stderr.strip().splitlines()) == (2, [unknown]), task
    bench.inv("deploy")
    assert "Nothing to stop" in bench.inv("stop", "-d", "pipeline").stdout  # the pipeline's own jobs are names


def test_watch_piped_prints_each_change_and_ends_when_every_job_has(bench: Bench) -> None:
    bench.scripted({"A": "records=40 sleep=0.3"})  # long enough to be watched from its start
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    watcher = subprocess.Popen([sys.executable, "-m", "invoke", "status", "--watch", "0.5", "-i", "test"],
                               cwd=bench.checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "COLUMNS": "200"})
    out, err = watcher.communicate(timeout=60)  # ends by itself: no Ctrl-C
    assert watcher.returncode == 0, out + err
    lines = out.splitlines()
    assert any(line.endswith(" A/prep succeeded: 40 records") for line in lines), out
    assert "1 job: 1 succeeded" in lines[-1]  # the table's summary, once, at the end
