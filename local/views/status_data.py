"""What a status payload says, apart from how it is drawn: whether any job went bad, and the
`inv status --json` form. No rich here: `--json` and the tasks that only need `any_bad`
never import it (local/views/status_table.py draws the table).
"""

from __future__ import annotations

from typing import Any

from remote.vocabulary import hints, layout
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE, STAGE_ORDER, JobState

Job = dict[str, Any]
UNREACHABLE = "unreachable"


def any_bad(status: dict[str, Any]) -> bool:
    return bool(status.get("unreachable")) or any(JobState(job["state"]).is_bad() for job in status["jobs"])


JSON_KEYS = ("host", "dataset", "stage", "state", "records", "skipped", "skip_reasons", "exit_code", "release",
             "started_at", "ended_at", "message", "metrics", "waiting_for", "blocked_by", "signal", "slurm_job_id",
             "slurm_state", "node", "total", "done", "rate", "eta_s", "eta_complete", "gpus", "out_of_date")


#: Keys shown only where they apply: several hosts, the Slurm backend, a pipeline's estimate, GPUs held, a
#: succeeded job no longer up to date.
OPTIONAL_KEYS = {"host", "slurm_job_id", "slurm_state", "node", "eta_complete", "gpus", "out_of_date"}


def as_json(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One object per job (with the GPUs it holds, where the host has any), then one per unreachable host."""
    jobs = [{key: job.get(key) for key in JSON_KEYS if key in job or key not in OPTIONAL_KEYS}
            for job in _with_gpus(status)]
    return jobs + [{"host": h["host"], "state": UNREACHABLE, "message": h["message"]} for h in status.get("unreachable", [])]


def _with_gpus(status: dict[str, Any]) -> list[Job]:
    """Each job with the GPUs it holds; the inference server's GPUs go to the infer jobs it serves."""
    gpus = status.get("gpus") or []
    if not gpus:
        return status["jobs"]
    jobs = []
    for job in status["jobs"]:
        key = layout.job_key(job["dataset"], job["stage"])
        serving = job["stage"] == "infer" and job["state"] in ("running", "stalled")
        held = [{k: g.get(k) for k in ("index", "utilization", "memory_used", "memory_total")}
                for g in gpus if g.get("host") == job.get("host")
                and (key in g.get("held_by", []) or (serving and "inference server" in g.get("held_by", [])))]
        jobs.append({**job, "gpus": held} if held else job)
    return jobs


def in_pipeline_order(jobs: list[Job]) -> list[Job]:
    """The jobs with each dataset's stages in the order the pipeline runs them (prep, infer, tokenize,
    extract, train...); the datasets keep the order they came in, a stage aerie does not know goes last."""
    first: dict[tuple[str, str], int] = {}
    for job in jobs:
        first.setdefault((job.get("host", ""), job["dataset"]), len(first))
    rank = {stage: index for index, stage in enumerate(STAGE_ORDER)}
    return sorted(jobs, key=lambda job: (first[(job.get("host", ""), job["dataset"])],
                                         rank.get(job["stage"], len(rank)), job["stage"]))


def next_step(job: Job, runner: str | None = None) -> str:
    """What to do about a job that ended without succeeding and whose message may not say it ("" if nothing).
    `runner`: the state of the pipeline's runner, where the status shows one (a stopped job that only a
    runner starts is started again by resuming the runner's pipeline, once the runner has ended)."""
    state, dataset, stage = job["state"], (job.get("members") or [job["dataset"]])[0], job["stage"]
    if state == JobState.BLOCKED.value:
        return f"fix that, then {hints.inv('rerun', failed=True)}"
    if state == JobState.EMPTY.value:
        return f"{hints.inv('logs', dataset, stage=stage)} says why; fix it, then {hints.inv('rerun', failed=True)}"
    if state != JobState.STOPPED.value:
        return ""
    if stage == "eval":
        return f"{hints.inv('eval')} starts it again"
    if runner == JobState.STOPPED.value and (dataset in (DRAFT, RUNNER) or stage in hints.PIPELINE_ONLY):
        return f"{hints.inv('rerun', failed=True)} continues the stopped run"
    if dataset in (DRAFT, RUNNER) or (stage in hints.PIPELINE_ONLY and runner is None):
        return f"{hints.inv('run')} starts the pipeline again"
    if stage in hints.PIPELINE_ONLY:
        when = "" if runner and JobState(runner).is_terminal() else ", once its runner has ended"
        return f"{hints.inv('rerun', failed=True)} resumes its pipeline, which starts it again{when}"
    return f"{hints.inv('launch', stage=stage, dataset=dataset)} starts it again"


def runner_state(status: dict[str, Any]) -> str | None:
    """The state of the pipeline's runner, where the status has one (one host's; on several, None)."""
    runners = [j["state"] for j in status["jobs"] if (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE)]
    return runners[0] if len(runners) == 1 else None


def outcome(status: dict[str, Any]) -> str:
    """Why a run that has ended did not succeed, and what to do next ("" when nothing went bad)."""
    if not any_bad(status):
        return ""
    bad = [j for j in in_pipeline_order(status["jobs"]) if JobState(j["state"]).is_bad()]
    jobs = [j for j in bad if (j["dataset"], j["stage"]) != (RUNNER, RUNNER_STAGE)]
    if any(j["state"] != JobState.BLOCKED.value for j in jobs):
        bad = jobs  # the runner failed because they did: name them, not it (else it is the cause: its server, say)
    blocked = [job_name(j) for j in bad if j["state"] == JobState.BLOCKED.value]
    failed = [f"{job_name(j)} {j['state']}" for j in bad if j["state"] != JobState.BLOCKED.value]
    parts = [", ".join(failed)] if failed else []
    if blocked:
        parts.append(f"{len(blocked)} blocked behind {'them' if len(failed) > 1 else 'it'}: {', '.join(blocked)}"
                     if failed else f"{len(blocked)} blocked: {', '.join(blocked)}")
    if status.get("unreachable"):
        parts.append(", ".join(f"{h['host']} unreachable" for h in status["unreachable"]))
    return (f"the run did not succeed: {'; '.join(parts)}. Fix the cause ({hints.inv('logs', 'DATASET', stage='STAGE')} "
            f"shows a job's log), then {hints.inv('rerun', failed=True)} "
            f"({hints.chain('deploy', hints.words('rerun', failed=True))} after a change to the code)")


def accept_length(job: Job) -> str | None:
    """`draft/train: held-out accept length 3.768 of at most 4 ...`, from a train job's metrics; None where it
    has none, or has gone bad (never a figure of a failed run)."""
    metrics = job.get("metrics") or {}
    if job["stage"] != "train" or metrics.get("accept_length") is None or JobState(job["state"]).is_bad():
        return None
    steps = sum(1 for key in metrics if key.startswith("eval_acc_"))  # one accuracy per draft step measured
    most = f" of at most {steps + 1}" if steps else ""
    return (f"{job_name(job)}: held-out accept length {metrics['accept_length']:.3f}{most} (1.0: the draft is "
            f"useless), over {metrics.get('eval_positions', 0):,} positions of records it never trained on")


def job_name(job: Job) -> str:
    """A job as the user names it: `A1/prep`, or `gpu2:A1/prep` where several hosts run jobs."""
    return f"{job['host'] + ':' if job.get('host') else ''}{layout.job_key(job['dataset'], job['stage'])}"
