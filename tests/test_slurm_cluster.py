"""remote.control_plane.slurm against a real single-node Slurm cluster (benchmarks/harness/slurm_cluster.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import remote.control_plane.slurm
from remote.control_plane.slurm import SlurmJob
from remote.vocabulary.states import JobState
from benchmarks.harness.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]  # a real cluster: not the unit tier

Submit = Callable[..., str]


@pytest.fixture
def submit(slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Submit]:
    """`submit("exit 3", dependency=[...])`: sbatch a shell script; the test's jobs are cancelled afterwards."""
    for name, value in slurm.environ().items():
        monkeypatch.setenv(name, value)
    submitted: list[str] = []

    def run(body: str, **options) -> str:
        script = tmp_path / f"job{len(submitted)}.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        options.setdefault("output", tmp_path / "%j.log")
        job_id = remote.control_plane.slurm.submit(script, job_name=f"aerie-test-{len(submitted)}", workdir=tmp_path, **options)
        submitted.append(job_id)
        return job_id

    yield run
    remote.control_plane.slurm.cancel(submitted)


def wait_for(job_id: str, done: Callable[[SlurmJob], bool], timeout: float = 20.0) -> SlurmJob:
    deadline = time.monotonic() + timeout
    while True:
        job = remote.control_plane.slurm.query([job_id]).get(job_id)
        if job is not None and done(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {job} after {timeout:g}s")
        time.sleep(0.1)


def test_submitted_job_is_queued_then_completed_with_its_environment(submit: Submit, slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit('sleep 0.5; echo "value=$AERIE_VALUE"', env={"AERIE_VALUE": "a,b c"})

    assert remote.control_plane.slurm.query([job_id])[job_id].state in ("PENDING", "RUNNING")
    job = wait_for(job_id, lambda job: job.job_state.is_terminal())

    assert (job.state, job.job_state, job.exit_code, job.node) == ("COMPLETED", JobState.SUCCEEDED, 0, slurm.node)
    assert (tmp_path / f"{job_id}.log").read_text() == "value=a,b c\n"


def test_job_exiting_3_is_failed_with_exit_code_3(submit: Submit) -> None:
    job = wait_for(submit("exit 3"), lambda job: job.job_state.is_terminal())

    assert (job.state, job.job_state, job.exit_code, job.signal) == ("FAILED", JobState.FAILED, 3, None)


def test_afterok_on_a_failed_job_stays_pending_with_dependency_never_satisfied(submit: Submit) -> None:
    failing = submit("exit 1")
    dependent = submit("echo never", dependency=[failing])

    # NOTE: Slurm 22.05 keeps such a job pending for ever, unless DependencyParameters=kill_invalid_depend.
    job = wait_for(dependent, lambda job: job.reason == "DependencyNeverSatisfied")
    assert (job.state, job.job_state, job.node) == ("PENDING", JobState.WAITING, None)


def test_cancel_ends_a_running_job_as_cancelled(submit: Submit, slurm: SlurmCluster) -> None:
    job_id = submit("sleep 60")
    running = wait_for(job_id, lambda job: job.state == "RUNNING")
    assert running.node == slurm.node

    remote.control_plane.slurm.cancel([job_id])

    job = wait_for(job_id, lambda job: job.job_state.is_terminal())
    # Its exit code is a race: the shell killed by SIGTERM (signal 15), or exiting 143 after its sleep was.
    assert (job.state, job.job_state) == ("CANCELLED", JobState.STOPPED)


def test_cancel_of_an_ended_or_unknown_job_is_not_an_error(submit: Submit) -> None:
    job_id = submit("true")
    ended = wait_for(job_id, lambda job: job.job_state.is_terminal())

    remote.control_plane.slurm.cancel([job_id, "999999"])  # raises SlurmError on any complaint but these two

    after = remote.control_plane.slurm.query([job_id, "999999"])
    assert set(after) == {job_id}, "an unknown id is never made a job"
    assert (after[job_id].state, after[job_id].exit_code) == (ended.state, ended.exit_code) == ("COMPLETED", 0)


def test_a_job_slurmctld_has_forgotten_is_read_from_the_job_completion_log(submit: Submit, slurm: SlurmCluster) -> None:
    job_id = submit("exit 4")
    wait_for(job_id, lambda job: job.job_state.is_terminal())

    # slurmctld purges jobs older than MinJobAge (2 s) every ~10 s.
    job = wait_for(job_id, lambda job: job.source == "jobcomp", timeout=30)

    assert (job.state, job.exit_code, job.node) == ("FAILED", 4, slurm.node)
    assert remote.control_plane.slurm.jobcomp_path() == slurm.jobcomp


def test_query_of_an_unknown_id_returns_nothing(submit: Submit) -> None:
    assert remote.control_plane.slurm.query(["999999"]) == {}


def test_query_of_40_jobs_is_one_squeue_call(submit: Submit, monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.perf_counter()
    ids = [submit("sleep 30") for _ in range(40)]
    submitted = time.perf_counter()
    calls: list[str] = []
    run = remote.control_plane.slurm._run
    monkeypatch.setattr(remote.control_plane.slurm, "_run", lambda argv, env=None: calls.append(argv[0]) or run(argv, env))

    jobs = remote.control_plane.slurm.query(ids)
    queried = time.perf_counter()

    assert list(jobs) == ids
    assert {job.state for job in jobs.values()} <= {"PENDING", "RUNNING"}
    assert calls == ["squeue"]
    print(f"\nsbatch: {(submitted - started) / 40 * 1000:.1f} ms a job; query of 40: {(queried - submitted) * 1000:.1f} ms")
