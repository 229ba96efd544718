"""remote.control_plane.slurm without a cluster: the state map, the parsers and the sbatch command line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from remote.control_plane import slurm
from remote.control_plane.slurm import STATE_MAP, SlurmError, SlurmJob, job_state
from remote.vocabulary.states import JobState

JOBCOMP = """\
JobId=7 UserId=root(0) GroupId=root(0) Name=prep JobState=RUNNING Partition=debug TimeLimit=UNLIMITED StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:00:01 NodeList=gpu01 NodeCnt=1 ProcCnt=1 WorkDir=/s ReservationName= Tres=cpu=1 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-01-01T00:00:00 EligibleTime=2026-01-01T00:00:00 DerivedExitCode=0:0 ExitCode=0:0
JobId=5 UserId=root(0) GroupId=root(0) Name=my job JobState=FAILED Partition=debug TimeLimit=UNLIMITED StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:00:01 NodeList=gpu[01-02] NodeCnt=2 ProcCnt=2 WorkDir=/s ReservationName= Tres=cpu=2 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-01-01T00:00:00 EligibleTime=2026-01-01T00:00:00 DerivedExitCode=0:0 ExitCode=3:0
JobId=6 UserId=root(0) GroupId=root(0) Name=b JobState=CANCELLED Partition=debug TimeLimit=UNLIMITED StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T00:00:00 NodeList=(null) NodeCnt=0 ProcCnt=0 WorkDir=/s ReservationName= Tres= Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-01-01T00:00:00 EligibleTime=2026-01-01T00:00:00 DerivedExitCode=0:0 ExitCode=0:0
JobId=7 UserId=root(0) GroupId=root(0) Name=prep JobState=OUT_OF_MEMORY Partition=debug TimeLimit=UNLIMITED StartTime=2026-01-01T00:01:00 EndTime=2026-01-01T00:02:00 NodeList=gpu02 NodeCnt=1 ProcCnt=1 WorkDir=/s ReservationName= Tres=cpu=1 Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-01-01T00:00:00 EligibleTime=2026-01-01T00:00:00 DerivedExitCode=0:0 ExitCode=0:9
"""


@pytest.mark.parametrize(("slurm_state", "expected"), [
    ("PENDING", JobState.WAITING), ("RUNNING", JobState.RUNNING), ("COMPLETING", JobState.RUNNING),
    ("COMPLETED", JobState.SUCCEEDED), ("FAILED", JobState.FAILED), ("TIMEOUT", JobState.FAILED),
    ("DEADLINE", JobState.FAILED), ("OUT_OF_MEMORY", JobState.DIED), ("NODE_FAIL", JobState.DIED),
    ("PREEMPTED", JobState.DIED), ("BOOT_FAIL", JobState.DIED), ("CANCELLED", JobState.STOPPED),
    ("CANCELLED by 0", JobState.STOPPED), ("SUSPENDED", JobState.STALLED), ("REQUEUED", JobState.WAITING),
])
def test_slurm_states_map_onto_aerie_states(slurm_state: str, expected: JobState) -> None:
    assert job_state(slurm_state) == expected


def test_a_state_slurm_adds_later_reads_as_stalled() -> None:
    assert job_state("TELEPORTED") == JobState.STALLED


def test_only_the_ends_slurm_gives_an_exit_code_for_are_terminal() -> None:
    alive = {name for name, state in STATE_MAP.items() if not state.is_terminal()}
    assert alive == {
        "PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
        "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED", "STOPPED",
    }


def test_query_reads_ids_squeue_forgot_from_the_last_line_of_the_job_completion_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "jobcomp.log"
    log.write_text(JOBCOMP)
    squeue = "8|PENDING|Priority||0|\n9|FAILED|NonZeroExitCode|gpu01|512|\n10|CANCELLED|None|gpu01|15|\n"
    calls = fake_run(monkeypatch, stdout=squeue)

    jobs = slurm.query(["5", "6", "7", "8", "9", "10", "11"], jobcomp=log)

    assert len(calls) == 1 and calls[0][0][:3] == ["squeue", "--noheader", "--states=all"]
    assert jobs == {
        "5": SlurmJob("5", "FAILED", node="gpu[01-02]", exit_code=3, source="jobcomp"),
        "6": SlurmJob("6", "CANCELLED", source="jobcomp"),
        "7": SlurmJob("7", "OUT_OF_MEMORY", node="gpu02", signal=9, source="jobcomp"),
        "8": SlurmJob("8", "PENDING", reason="Priority"),
        "9": SlurmJob("9", "FAILED", node="gpu01", exit_code=2),
        "10": SlurmJob("10", "CANCELLED", node="gpu01", signal=15),
    }
    assert jobs["7"].to_dict()["job_state"] == "died"


def test_query_of_ids_squeue_knows_none_of_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_run(monkeypatch, returncode=1, stderr="slurm_load_jobs error: Invalid job id specified\n")

    assert slurm.query(["12"], jobcomp=tmp_path / "absent.log") == {}


def test_query_reports_squeue_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_run(monkeypatch, returncode=1, stderr="squeue: error: Unable to contact slurm controller (connect failure)\n")

    with pytest.raises(SlurmError, match="^squeue: error: Unable to contact slurm controller"):
        slurm.query(["12"])


def test_query_refuses_what_is_not_a_job_id() -> None:
    with pytest.raises(SlurmError, match="^'12; rm' is not a Slurm job id$"):
        slurm.query(["12; rm"])


def test_submit_builds_one_sbatch_line_with_its_options_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    calls = fake_run(monkeypatch, stdout="42;cluster\n")

    job_id = slurm.submit(
        script, job_name="prep-a", output=tmp_path / "%j.log", partition="gpu", gpus=1, cpus=8, mem="32G",
        time="1-00:00:00", account="lab", extra=["--qos=high"], dependency=["40", "41"], env={"AERIE_ROOT": "/s"},
    )

    assert job_id == "42"
    (argv, env), = calls
    assert argv == [
        "sbatch", "--parsable", "--job-name=prep-a", f"--output={tmp_path}/%j.log", "--export=ALL",
        "--partition=gpu", "--gpus=1", "--cpus-per-task=8", "--mem=32G", "--time=1-00:00:00", "--account=lab",
        "--dependency=afterok:40:41", "--qos=high", str(script),
    ]
    assert env["AERIE_ROOT"] == "/s"


@pytest.mark.parametrize(("options", "message"), [
    ({"job_name": "two words"}, "^Job name must be one word, not 'two words'$"),
    ({"dependency": ["afterok:1"]}, "^Dependency 'afterok:1' is not a Slurm job id$"),
])
def test_submit_refuses_bad_arguments_before_running_sbatch(tmp_path: Path, options: dict, message: str) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(SlurmError, match=message):
        slurm.submit(script, **{"job_name": "a", "output": tmp_path / "log", **options})


def test_submit_refuses_a_missing_script(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="does not exist$"):
        slurm.submit(tmp_path / "absent.sh", job_name="a", output=tmp_path / "log")


def test_submit_reports_sbatch_refusing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    fake_run(monkeypatch, returncode=1, stderr="sbatch: error: invalid partition specified: gpu\n")

    with pytest.raises(SlurmError, match="^sbatch: error: invalid partition specified: gpu$"):
        slurm.submit(script, job_name="a", output=tmp_path / "log", partition="gpu")


def fake_run(monkeypatch: pytest.MonkeyPatch, stdout: str = "", stderr: str = "", returncode: int = 0) -> list[tuple[list[str], dict]]:
    """Stand in for the Slurm commands; returns the (argv, env) of each call."""
    calls: list[tuple[list[str], dict]] = []

    def run(argv: list[str], env=None) -> subprocess.CompletedProcess:
        calls.append((argv, dict(env or {})))
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)

    monkeypatch.setattr(slurm, "_run", run)
    return calls
