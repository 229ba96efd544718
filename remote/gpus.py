"""The host's GPUs for `inv status`: utilisation, memory, and which job holds each one.

Read with ``nvidia-smi`` in the same remote command as the jobs (no second
connection). A host without it, or where it fails, simply has no GPUs in the
answer. A GPU's holder is found from its compute processes: each job's
supervisor leads a session of its own (`remote.jobs`), so a process whose
session id is a job's pid belongs to that job; the pipeline's inference server
has a session of its own too, recorded in ``jobs/pipeline/server.json``.

Standard library only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from remote.progress import read_json

TIMEOUT = 5.0  # seconds: a wedged driver must not hang `inv status`
GPU_QUERY = "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total"
APPS_QUERY = "--query-compute-apps=pid,gpu_uuid,used_memory"
CSV = "--format=csv,noheader,nounits"
SERVER = "inference server"


def read() -> list[dict[str, Any]]:
    """Each GPU: index, uuid, utilisation (%), memory used and total (MiB), and its compute pids."""
    if not shutil.which("nvidia-smi"):
        return []
    gpus = {row[1]: {"index": int(row[0]), "uuid": row[1], "utilization": _number(row[2]),
                     "memory_used": _number(row[3]), "memory_total": _number(row[4]), "pids": []}
            for row in _query(GPU_QUERY) if len(row) >= 5}
    for row in _query(APPS_QUERY):
        if len(row) >= 2 and row[1] in gpus and row[0].isdigit():
            gpus[row[1]]["pids"].append(int(row[0]))
    return sorted(gpus.values(), key=lambda gpu: gpu["index"])


def annotate(root: Path, status: dict[str, Any]) -> dict[str, Any]:
    """Add ``gpus`` to the status (only when the host has some), each with the jobs that hold it."""
    gpus = read()
    if not gpus:
        return status
    owners = {job["pid"]: f"{job['dataset']}/{job['stage']}" for job in status.get("jobs", [])
              if job.get("pid") and job.get("state") in ("running", "stalled")}
    try:
        record = read_json(root / "jobs" / "pipeline" / "server.json", {})
    except (OSError, ValueError):
        record = {}
    server = record.get("pid") if isinstance(record, dict) else None
    if server:
        owners[server] = SERVER
    for gpu in gpus:
        gpu["held_by"] = sorted({_owner(pid, owners) for pid in gpu.pop("pids")})
    status["gpus"] = gpus
    return status


def _owner(pid: int, owners: dict[int, str]) -> str:
    """The job (or the server) whose session `pid` runs in; else the pid itself."""
    try:
        session = os.getsid(pid)
    except OSError:
        session = None  # gone, or in another PID namespace (a container)
    return owners.get(session) or owners.get(pid) or f"pid {pid}"


def _query(query: str) -> list[list[str]]:
    import csv  # here: a host without GPUs answers `status` without loading them
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", query, CSV], capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [[cell.strip() for cell in row] for row in csv.reader(done.stdout.splitlines()) if row]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]" on some boards
