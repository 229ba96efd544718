"""What a status payload says, apart from how it is drawn: whether any job went bad, and the
`inv status --json` form. No rich here: `--json` and the tasks that only need `any_bad`
never import it (local/status_view.py draws the table).
"""

from __future__ import annotations

from typing import Any

from remote.control_plane.states import JobState

Job = dict[str, Any]
UNREACHABLE = "unreachable"


def any_bad(status: dict[str, Any]) -> bool:
    return bool(status.get("unreachable")) or any(JobState(job["state"]).is_bad() for job in status["jobs"])


JSON_KEYS = ("host", "dataset", "stage", "state", "records", "skipped", "skip_reasons", "exit_code", "release",
             "started_at", "ended_at", "message", "metrics", "waiting_for", "blocked_by", "signal", "slurm_job_id",
             "slurm_state", "node", "total", "done", "rate", "eta_s", "eta_complete", "gpus")


#: Keys shown only where they apply: several hosts, the Slurm backend, a pipeline's estimate, GPUs held.
OPTIONAL_KEYS = {"host", "slurm_job_id", "slurm_state", "node", "eta_complete", "gpus"}


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
        key = f"{job['dataset']}/{job['stage']}"
        serving = job["stage"] == "infer" and job["state"] in ("running", "stalled")
        held = [{k: g.get(k) for k in ("index", "utilization", "memory_used", "memory_total")}
                for g in gpus if g.get("host") == job.get("host")
                and (key in g.get("held_by", []) or (serving and "inference server" in g.get("held_by", [])))]
        jobs.append({**job, "gpus": held} if held else job)
    return jobs
