"""`inv run` in phases, needs met only in this run, and a stopped run that ends and resumes (issue 37),
end to end through the real tasks on the local backend.

The GPU's phases and the stop are about order, so most stages are benchmarks/harness/scripted_stage.py
(the managed "server" is Python's http.server, as in tests/test_pipeline.py); the one load of the target
for every extract job is measured with the real prep, infer, tokenize and extract stages on the demo's
tiny target, its stored states compared byte for byte with those of today's per-dataset extraction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.checkout import SCRIPTED, Bench, wait_for
from tests.pipeline_fixtures import demo_target  # noqa: F401 — a fixture
from tests.helpers.pipelines import pipeline_inventory, traces, wait_pipeline

pytestmark = pytest.mark.e2e

TERMINAL = {"succeeded", "failed", "died", "stopped", "blocked", "empty"}


def pipeline_log(bench: Bench) -> str:
    return (bench.root / "jobs" / "pipeline" / "run" / "log").read_text()


def needs_of(bench: Bench) -> dict[str, list[str]]:
    spec = json.loads((bench.root / "jobs" / "pipeline" / "run" / "spec.json").read_text())
    return {node["key"]: node["needs"] for node in spec["config"]["stage"]["plan"]}


def started_after_needs(jobs: dict[str, dict]) -> list[str]:
    """Every job that started before one of its needs had ended (from state.json's times): none, if ordered."""
    return [f"{key} at {jobs[key]['started_at']} before {need} ended at {jobs[need]['ended_at']}"
            for key, needs in jobs["_needs"].items() for need in needs
            if jobs[key]["started_at"] is None or jobs[need]["ended_at"] is None
            or jobs[key]["started_at"] < jobs[need]["ended_at"]]


def follower(bench: Bench) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "invoke", "run", "--follow", "-i", "test"], cwd=bench.checkout,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})


def test_every_infer_job_runs_under_one_server_start_even_one_whose_prep_ends_late(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts", "C": "prompts"})
    url = f"http://127.0.0.1:{free_port}/health"
    (plans / "C.prep").write_text("records=4 sleep=1")  # ends well after B/infer
    for name in ("B", "C"):
        (plans / f"{name}.infer").write_text(f"records=1 sleep=0.5 need_url={url}")
    for job in ("A.extract", "B.extract", "C.extract", "draft.train"):
        (plans / job).write_text(f"records=1 sleep=0.3 shun_url={url}")
    bench.inv("deploy")
    bench.inv("run")
    # Its needs met, A/extract waits for the infer phase, C/infer (its prep still running) among it.
    wait_for(lambda: "GPU" in (bench.poll()["A/extract"]["message"] or ""), 60, "A/extract to wait for the GPU")
    waiting = bench.poll()["A/extract"]
    assert waiting["state"] == "waiting" and "C/infer" in waiting["waiting_for"], waiting
    assert "A/prep" not in waiting["waiting_for"]  # a need that has succeeded is not named
    jobs = wait_pipeline(bench)
    assert all(job["state"] == "succeeded" for job in jobs.values()), jobs
    log = pipeline_log(bench)
    assert log.count("server: started") == 1 and log.count("server: stopped") == 1, log
    seen = traces(plans)
    assert max(seen[k]["end"] for k in ("B.infer", "C.infer")) <= min(seen[k]["start"] for k in ("A.extract", "B.extract", "C.extract"))
    assert "healthy" not in jobs["pipeline/run"]["message"]


def test_a_new_run_shows_its_own_jobs_queued_and_starts_each_only_after_its_needs_succeeded_in_it(
        bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts", "C": "prompts"})
    for name in ("A", "B", "C"):
        (plans / f"{name}.prep").write_text("records=2 sleep=0.5")
    (plans / "B.infer").write_text("records=3 sleep=1")
    bench.inv("deploy")
    bench.inv("run")
    assert all(job["state"] == "succeeded" for job in wait_pipeline(bench).values())

    bench.inv("run", "--force")  # every job again, over a root where every job has succeeded (up to date)
    first = bench.poll()
    states = {k: j["state"] for k, j in first.items() if k != "pipeline/run"}
    assert set(states.values()) <= {"waiting", "running"}, states  # this run's jobs, never the last run's
    bench.wait_state("B/infer", {"running"}, timeout=60)
    bench.inv("stop", "--all")
    stopped = wait_pipeline(bench)
    assert "waiting" not in {j["state"] for j in stopped.values()}, stopped

    bench.inv("run")
    jobs = wait_pipeline(bench)
    assert all(job["state"] == "succeeded" for job in jobs.values()), jobs
    assert started_after_needs({**jobs, "_needs": needs_of(bench)}) == []


def test_a_stopped_run_ends_stopped_follow_exits_1_and_rerun_failed_finishes_it_without_redoing_what_succeeded(
        bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts", "C": "prompts"})
    (plans / "B.infer").write_text("records=20 sleep=0.5")  # long enough to be stopped mid-infer
    bench.inv("deploy")
    run = follower(bench)
    bench.wait_state("B/infer", {"running"}, timeout=60)
    bench.inv("stop", "--all")
    out, err = run.communicate(timeout=90)
    assert run.returncode == 1, out + err
    assert "the run was stopped: B/infer stopped" in err and "`inv rerun --failed` continues it" in err, err
    assert "Traceback" not in err
    jobs = bench.poll()
    assert jobs["pipeline/run"]["state"] == "stopped"
    assert {j["state"] for j in jobs.values()} <= TERMINAL and "waiting" not in {j["state"] for j in jobs.values()}
    assert jobs["B/tokenize"]["state"] == jobs["draft/train"]["state"] == "stopped"
    done = {k: j for k, j in jobs.items() if j["state"] == "succeeded"}
    assert {"A/prep", "B/prep", "C/prep"} <= set(done)
    kept = {k: os.stat(bench.job_dir(*k.split("/")) / "state.json").st_mtime_ns for k in done}
    outputs = {k: (bench.root / "data" / k).stat().st_mtime_ns for k in done if (bench.root / "data" / k).exists()}

    (plans / "B.infer").write_text("records=2")
    rerun = bench.inv("rerun", "--failed")
    assert "relaunched pipeline/run" in rerun.stdout, rerun.stdout
    jobs = wait_pipeline(bench)
    assert all(job["state"] == "succeeded" for job in jobs.values()), {k: j["state"] for k, j in jobs.items()}
    assert {k: os.stat(bench.job_dir(*k.split("/")) / "state.json").st_mtime_ns for k in done} == kept
    assert {k: (bench.root / "data" / k).stat().st_mtime_ns for k in outputs} == outputs
    assert jobs["B/infer"]["ended_at"] <= jobs["B/tokenize"]["started_at"]
    assert started_after_needs({**jobs, "_needs": {k: v for k, v in needs_of(bench).items() if k not in done}}) == []


def test_a_stop_of_one_job_of_the_run_stops_the_run_and_lets_what_runs_end(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts"})
    (plans / "A.prep").write_text("records=20 sleep=1")  # still running when B/infer is stopped
    (plans / "B.infer").write_text("records=20 sleep=0.5")
    bench.inv("deploy")
    bench.inv("run")
    bench.wait_state("B/infer", {"running"}, timeout=60)
    bench.inv("stop", "-d", "B", "--stage", "infer")
    jobs = wait_pipeline(bench)
    states = {k: j["state"] for k, j in jobs.items()}
    assert states["pipeline/run"] == "stopped" and states["B/infer"] == "stopped", states
    assert states["A/prep"] == "succeeded"  # running when the run stopped: it ended on its own
    assert states["A/extract"] == states["B/tokenize"] == states["draft/train"] == "stopped", states
    assert "not started: B/infer stopped by inv stop" in jobs["B/tokenize"]["message"]


def test_a_rerun_while_the_runner_still_ends_its_run_shows_the_jobs_it_runs_again_queued_and_finishes(
        bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts"})
    fixed = plans / "fixed"
    (plans / "A.prep").write_text("records=30 sleep=0.5")  # keeps the runner going after B/infer fails
    (plans / "B.infer").write_text(f"records=1 exit=3 unless={fixed}")
    bench.inv("deploy")
    bench.inv("run")
    assert bench.wait_state("B/infer", TERMINAL, timeout=60)["state"] == "failed"
    wait_for(lambda: bench.poll()["B/tokenize"]["state"] == "blocked", 30, "the runner to block B/tokenize")
    assert bench.poll()["pipeline/run"]["state"] == "running"  # A/prep runs on: the run has not ended

    fixed.write_text("")
    rerun = bench.inv("rerun", "--failed")
    assert "relaunched pipeline/run" in rerun.stdout, rerun.stdout
    jobs = bench.poll()  # at once: nothing of the last run's end may read as this run's
    last_runs = {k: jobs[k]["state"] for k in ("B/infer", "B/tokenize", "B/extract", "draft/train")
                 if jobs[k]["state"] in ("failed", "blocked", "stopped", "died")}
    assert last_runs == {}, last_runs
    jobs = wait_pipeline(bench)
    assert all(job["state"] == "succeeded" for job in jobs.values()), {k: j["state"] for k, j in jobs.items()}
    assert len([line for line in (bench.job_dir("A", "prep") / "log").read_text().splitlines()
                if "] prep A on release" in line]) == 1, "A/prep ran once, adopted"


NATIVE = ("sharegpt", "openthoughts", "ultrachat", "openai_tools")
PROMPTS = ("prompts_alpaca", "prompts_problem", "prompts_prompt", "prompts_question")


def stored_files(directory: Path) -> dict[str, bytes]:
    """An extract output's files but its manifest (which says how many seconds it took)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def extract_alone(names: list[str], tokens: dict[str, Path], settings: dict, target: Path, into: Path) -> dict[str, Path]:
    """Today's per-dataset extraction: the extract stage run on its own for each dataset, loading the target itself
    (in one Python, in turn: the stage's imports paid once)."""
    import shutil

    from tests.pipeline_fixtures import run_stage_each, stage_env

    for name in names:
        shutil.copytree(tokens[name], into / "data" / name / "prep")
    envs = [stage_env(into, "extract", settings, {"target": {"model": str(target)}}, dataset=name) for name in names]
    assert run_stage_each("extract", envs) == [0] * len(names)
    return {name: into / "data" / name / "extract" for name in names}


@pytest.mark.timeout(900)  # the real stages of eight datasets, then each extracted again alone, on two busy cores
def test_four_prompts_and_four_native_datasets_make_one_server_start_and_one_target_load_storing_the_same_states(
        bench: Bench, demo_target: Path, free_port: int) -> None:  # noqa: F811
    from tests.helpers.demo import SAMPLES, demo_inventory

    plans = bench.root.parent / "plans"
    plans.mkdir()
    demo_inventory(bench, demo_target, free_port)
    inventory = bench.checkout / "inventories" / "test.yaml"
    import yaml

    settings = yaml.safe_load(inventory.read_text())
    settings["datasets"] = {name: {"source": str(SAMPLES / f"{name}.jsonl"), "kind": "prompts" if name in PROMPTS else "native",
                                   "sample": str(SAMPLES / f"{name}.jsonl")} for name in (*NATIVE, *PROMPTS)}
    settings["stages"]["infer"]["max_tokens"] = 8
    settings["stages"]["train"] = {"command": f"{{python}} {SCRIPTED} {plans}"}  # the extract phase is the point
    inventory.write_text(yaml.safe_dump(settings))
    bench.inv("deploy")
    followed = bench.inv("run", "--follow", check=False, timeout=600)
    jobs = bench.status()
    log = pipeline_log(bench)
    assert followed.returncode == 0 and all(j["state"] == "succeeded" for j in jobs.values()), (jobs, log)
    assert log.count("server: started") == 1, log
    assert log.count("target: loaded") == 1, log
    served = [line for line in log.splitlines() if line.startswith("target: one load served")]
    assert len(served) == 1 and all(name in served[0] for name in (*NATIVE, *PROMPTS)), log
    assert "8 dataset(s)" in served[0]

    alone = bench.root.parent / "alone"
    extract = settings["stages"]["extract"]
    tokens = {name: bench.root / "data" / name / ("tokenize" if name in PROMPTS else "prep") for name in (*NATIVE, *PROMPTS)}
    by_itself = extract_alone([*NATIVE, *PROMPTS], tokens, extract, demo_target, alone)
    for name in (*NATIVE, *PROMPTS):
        together = bench.root / "data" / name / "extract"
        assert stored_files(together) == stored_files(by_itself[name]), name
        kept = json.loads((together / "manifest.json").read_text())
        assert kept["records"] == jobs[f"{name}/extract"]["records"] > 0
