"""Slurm's client commands, from the login node: submit, query and cancel batch jobs.

Standard library only. Works without slurmdbd: slurmctld knows a job until
`MinJobAge` seconds after it ends (`squeue --states=all` shows it until then),
and the job completion log (`JobCompType=jobcomp/filetxt`) knows it after.
So one `query` costs one `squeue`, plus, only for ids squeue no longer knows,
at most one `scontrol show config` (to find the log, unless given) and one
read of that log. `sacct` is never used: without slurmdbd it has nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from remote.vocabulary.states import JobState
from remote.control_plane.store import HostError

TIMEOUT_S = 60.0

STATE_MAP: dict[str, JobState] = {
    # Not started yet, or put back in the queue.
    "PENDING": JobState.WAITING,
    "CONFIGURING": JobState.WAITING,  # resources allocated, nodes still booting
    "REQUEUED": JobState.WAITING,
    "REQUEUE_HOLD": JobState.WAITING,
    "REQUEUE_FED": JobState.WAITING,
    "RESV_DEL_HOLD": JobState.WAITING,
    "SPECIAL_EXIT": JobState.WAITING,  # requeued and held after a chosen exit code
    # Alive.
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # its processes are still being reaped
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    # Alive, holding its resources, making no progress.
    "SUSPENDED": JobState.STALLED,
    "STOPPED": JobState.STALLED,  # Slurm's STOPPED is SIGSTOP, not ended
    # Ended.
    "COMPLETED": JobState.SUCCEEDED,  # exit 0; the job's own record decides `empty`
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.DIED,
    "NODE_FAIL": JobState.DIED,
    "BOOT_FAIL": JobState.DIED,
    "PREEMPTED": JobState.DIED,
    "CANCELLED": JobState.STOPPED,
    "REVOKED": JobState.STOPPED,  # a federation sibling ran it instead
}
"""Slurm's job states onto aerie's. A state Slurm adds later reads as `stalled`: shown, never trusted."""

# squeue's -O fields, in this order; "|" ends each one (no padding, no truncation).
SQUEUE_FIELDS = ("JobID", "State", "Reason", "NodeList", "exit_code")
_QUEUE_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)
_UNKNOWN_JOB = "Invalid job id specified"
_ALREADY_DONE = "already completing or completed"
_JOBCOMP_FIELD = re.compile(r"(?:^| )(\w+)=")


class SlurmError(HostError):
    """A Slurm command refused or failed; the message is its own, on one line."""


@dataclass
class SlurmJob:
    """What Slurm says about one batch job."""

    job_id: str
    state: str
    """Slurm's own state, e.g. PENDING, RUNNING, COMPLETED, OUT_OF_MEMORY, CANCELLED."""
    reason: str | None = None
    """Why a job that has not ended waits (Priority, Resources, Dependency, DependencyNeverSatisfied...)."""
    node: str | None = None
    """Where it runs or ran (a hostlist, e.g. gpu[01-02]); None while pending."""
    exit_code: int | None = None
    """Its batch script's exit status, once ended; None before, when a signal ended it, or when it never ran."""
    signal: int | None = None
    """The signal that ended it, if one did."""
    source: str = "squeue"
    """Who knew: `squeue` (slurmctld's memory) or `jobcomp` (the job completion log)."""

    @property
    def job_state(self) -> JobState:
        """aerie's reading of `state` (see STATE_MAP)."""
        return job_state(self.state)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "job_state": self.job_state.value}


def job_state(slurm_state: str) -> JobState:
    """aerie's state for a Slurm state string, as squeue, scontrol or sacct print it ("CANCELLED by 0")."""
    # NOTE: stalled for the unknown: it stands out in `inv status` and is not mistaken for an end.
    return STATE_MAP.get(_base_state(slurm_state), JobState.STALLED)


def _check_submission(script_path: Path, job_name: str, dependency: Sequence[str]) -> None:
    """The arguments checked first, each refusal naming the bad value."""
    if not job_name or any(ch.isspace() for ch in job_name):
        raise SlurmError(f"Job name must be one word, not {job_name!r}")
    if not script_path.is_file():
        raise SlurmError(f"Batch script {script_path} does not exist")
    for job_id in dependency:
        if not _is_job_id(job_id):
            raise SlurmError(f"Dependency {job_id!r} is not a Slurm job id")


def submit(
    script_path: Path,
    *,
    job_name: str,
    output: Path,
    partition: str | None = None,
    gpus: int | str | None = None,
    cpus: int | None = None,
    mem: int | str | None = None,
    time: int | str | None = None,
    account: str | None = None,
    extra: Sequence[str] = (),
    dependency: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    workdir: Path | None = None,
) -> str:
    """`sbatch` the script and return the new job's id.

    `output`: the job's stdout and stderr together (Slurm expands %j); `mem`: MB or "32G";
    `time`: minutes or "D-HH:MM:SS"; `dependency`: job ids that must all end COMPLETED
    first (`afterok`); `env`: set for the job on top of this process's environment (sbatch
    exports everything it has, so values may hold commas); `extra`: more sbatch options,
    given last so that they win.
    """
    script_path = Path(script_path)
    _check_submission(script_path, job_name, dependency)
    argv = ["sbatch", "--parsable", f"--job-name={job_name}", f"--output={output}", "--export=ALL"]
    for flag, value in (
        ("--partition", partition), ("--gpus", gpus), ("--cpus-per-task", cpus), ("--mem", mem),
        ("--time", time), ("--account", account), ("--chdir", workdir),
    ):
        if value is not None:
            argv.append(f"{flag}={value}")
    if dependency:
        argv.append(f"--dependency=afterok:{':'.join(dependency)}")
    argv += [*extra, str(script_path)]
    environ = {**os.environ, **(env or {})}
    result = _run(argv, environ)
    if result.returncode:
        raise SlurmError(_one_line(result.stderr) or f"sbatch exited with {result.returncode}")
    # --parsable prints "id" or "id;cluster".
    job_id = result.stdout.strip().split(";")[0]
    if not _is_job_id(job_id):
        raise SlurmError(f"sbatch printed no job id: {_one_line(result.stdout)!r}")
    return job_id


def query(job_ids: Sequence[str], *, jobcomp: Path | None = None) -> dict[str, SlurmJob]:
    """What Slurm knows about each job; ids it knows nothing about are absent.

    `jobcomp`: the job completion log; looked up with `scontrol show config` when needed
    and not given. It must be readable here (it is written on the slurmctld host).
    """
    ids = list(dict.fromkeys(_checked_ids(job_ids)))
    if not ids:
        return {}
    found = _from_squeue(ids)
    missing = [job_id for job_id in ids if job_id not in found]
    if missing:
        log = jobcomp or jobcomp_path()
        if log is not None:
            found.update(_from_jobcomp(log, missing))
    return {job_id: found[job_id] for job_id in ids if job_id in found}


def cancel(job_ids: Sequence[str]) -> None:
    """`scancel` the jobs; one that has already ended, or that Slurm has forgotten, is not an error."""
    ids = _checked_ids(job_ids)
    if not ids:
        return
    result = _run(["scancel", *ids])
    problems = [
        line for line in result.stderr.splitlines()
        if line.strip() and _UNKNOWN_JOB not in line and _ALREADY_DONE not in line
    ]
    if problems:
        raise SlurmError("; ".join(problems))


def jobcomp_path() -> Path | None:
    """The job completion log, from `scontrol show config`; None unless JobCompType is jobcomp/filetxt."""
    result = _run(["scontrol", "show", "config"])
    if result.returncode:
        raise SlurmError(_one_line(result.stderr) or "scontrol show config failed")
    config = dict(
        (name.strip(), value.strip()) for name, _, value in
        (line.partition("=") for line in result.stdout.splitlines()) if value
    )
    if config.get("JobCompType") != "jobcomp/filetxt" or not config.get("JobCompLoc"):
        return None
    return Path(config["JobCompLoc"])


def _from_squeue(ids: list[str]) -> dict[str, SlurmJob]:
    # --states=all: finished jobs too, for as long as slurmctld remembers them (MinJobAge).
    result = _run(["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}", f"--Format={_QUEUE_FORMAT}"])
    if result.returncode:
        # squeue drops unknown ids from a list, but fails when it knows none of them.
        if _UNKNOWN_JOB in result.stderr:
            return {}
        raise SlurmError(_one_line(result.stderr) or f"squeue exited with {result.returncode}")
    jobs = {}
    for line in result.stdout.splitlines():
        values = line.split("|")
        if len(values) < len(SQUEUE_FIELDS):
            continue
        job_id, state, reason, node, status = (value.strip() for value in values[: len(SQUEUE_FIELDS)])
        if job_id not in ids:  # e.g. a job array's tasks
            continue
        ended, node = job_state(state).is_terminal(), _none(node)
        # squeue's exit_code is the raw wait status: 768 is "exit 3", 15 is "killed by SIGTERM".
        # A job cancelled before it started reads 0: it has no exit code.
        code, signum = _wait_status(int(status)) if ended and node and status.isdigit() else (None, None)
        jobs[job_id] = SlurmJob(
            job_id=job_id, state=_base_state(state), reason=None if ended else _none(reason), node=node,
            exit_code=code, signal=signum, source="squeue",
        )
    return jobs


def _from_jobcomp(log: Path, ids: list[str]) -> dict[str, SlurmJob]:
    """The last line for each id in the job completion log (a requeued job has several)."""
    wanted = {f"JobId={job_id} " for job_id in ids}
    jobs = {}
    try:
        with log.open(errors="replace") as lines:
            for line in lines:
                if line[: line.find(" ") + 1] in wanted:
                    job = _parse_jobcomp(line)
                    jobs[job.job_id] = job
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise SlurmError(f"cannot read the job completion log {log}: {error.strerror}") from None
    return jobs


def _parse_jobcomp(line: str) -> SlurmJob:
    # "JobId=5 UserId=root(0) ... Name=wrap JobState=FAILED ... NodeList=vm ... ExitCode=3:0"
    # NOTE: values may hold spaces (a job name), so split on " Key=", not on spaces.
    parts = _JOBCOMP_FIELD.split(line.rstrip("\n"))
    fields = dict(zip(parts[1::2], parts[2::2]))
    node = _none(fields.get("NodeList", ""))
    code, _, signum = fields.get("ExitCode", "").partition(":")  # "exit:signal"
    signal_number = int(signum) if signum.isdigit() and int(signum) else None
    exit_code = int(code) if code.isdigit() and node and not signal_number else None
    return SlurmJob(
        job_id=fields["JobId"], state=_base_state(fields.get("JobState", "")), node=node,
        exit_code=exit_code, signal=signal_number, source="jobcomp",
    )


def _wait_status(status: int) -> tuple[int | None, int | None]:
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _base_state(state: str) -> str:
    # "CANCELLED by 0" (sacct, scontrol), "COMPLETED+" (sacct): the state is the first word.
    return state.strip().split(" ")[0].rstrip("+")


def _none(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "None", "(null)", "n/a") else value


def _checked_ids(job_ids: Sequence[str]) -> list[str]:
    if isinstance(job_ids, str):
        raise SlurmError(f"Job ids must be a list, not the string {job_ids!r}")
    for job_id in job_ids:
        if not _is_job_id(job_id):
            raise SlurmError(f"{job_id!r} is not a Slurm job id")
    return list(job_ids)


def _is_job_id(job_id: str) -> bool:
    return isinstance(job_id, str) and job_id.isdigit()


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {TIMEOUT_S:g}s") from None
