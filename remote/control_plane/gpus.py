"""The host's GPUs for `inv status`: utilisation, memory, and which job holds each one.

Read with ``nvidia-smi`` in the same remote command as the jobs (no second
connection). A host without it, or where it fails, simply has no GPUs in the
answer. A GPU's holder is found from its compute processes: each job's
supervisor leads a session of its own (`remote.control_plane.jobs`), so a process whose
session id is a job's pid belongs to that job; the pipeline's inference server
has a session of its own too, recorded in ``jobs/pipeline/server.json``.
Both queries run at once, started before the jobs are read (`Query`).

Standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from remote.control_plane import processes
from remote.vocabulary import layout
from remote.control_plane.progress import read_json

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    import subprocess
    from typing import Any

TIMEOUT = 5.0  # seconds: a wedged driver must not hang `inv status`
GPU_QUERY = "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total"
APPS_QUERY = "--query-compute-apps=pid,gpu_uuid,used_memory"
CSV = "--format=csv,noheader,nounits"
SERVER = "inference server"


class Query:
    """Both nvidia-smi queries, started at once and read when wanted. On a GPU host each can take a
    few tenths of a second (a driver without persistence mode initialises every GPU), longer than
    reading every job: `status` starts them first, and reads them last."""

    def __init__(self) -> None:
        self.started = [_start(GPU_QUERY), _start(APPS_QUERY)] if _on_path("nvidia-smi") else []

    def read(self) -> list[dict[str, Any]]:
        """Each GPU: index, uuid, utilisation (%), memory used and total (MiB), and its compute pids."""
        if not self.started:
            return []
        deadline = time.monotonic() + TIMEOUT
        board, apps = (_rows(process, deadline) for process in self.started)
        gpus = {row[1]: {"index": int(row[0]), "uuid": row[1], "utilization": _number(row[2]),
                         "memory_used": _number(row[3]), "memory_total": _number(row[4]), "pids": []}
                for row in board if len(row) >= 5 and row[0].isdigit()}
        for row in apps:
            if len(row) >= 2 and row[1] in gpus and row[0].isdigit():
                gpus[row[1]]["pids"].append(int(row[0]))
        return sorted(gpus.values(), key=lambda gpu: gpu["index"])


def annotate(root: Path, status: dict[str, Any], query: Query | None = None) -> dict[str, Any]:
    """Add ``gpus`` to the status (only when the host has some), each with the jobs that hold it;
    `query`: the one started before the jobs were read."""
    gpus = (query or Query()).read()
    if not gpus:
        return status
    owners = {job["pid"]: layout.job_key(job["dataset"], job["stage"]) for job in status.get("jobs", [])
              if job.get("pid") and job.get("state") in ("running", "stalled")}
    try:
        record = read_json(layout.server_record(root), {})
    except (OSError, ValueError):
        record = {}
    # NOTE: named only while the record proves the pid is still the server aerie started: after a
    # reboot or a reuse of the pid, another process's GPU memory would be laid at the pipeline's door.
    if isinstance(record, dict) and isinstance(record.get("pid"), int) and processes.is_ours(record):
        owners[record["pid"]] = SERVER
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


def _on_path(name: str) -> bool:
    # NOTE: not shutil.which: a host without GPUs answers `status` without importing shutil or subprocess.
    return any(os.access(os.path.join(d, name), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def _start(query: str) -> subprocess.Popen[str] | None:
    import subprocess

    try:
        return subprocess.Popen(["nvidia-smi", query, CSV], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
    except OSError:
        return None


def _rows(process: subprocess.Popen[str] | None, deadline: float) -> list[list[str]]:
    """The query's CSV rows; none when it failed or outlived the deadline (killed: a wedged driver)."""
    import csv  # here, as subprocess: a host without GPUs answers `status` without loading them
    import subprocess

    if process is None:
        return []
    try:
        out, _ = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()  # and not waited for: a driver wedged in the kernel may not die at once
        return []
    if process.returncode != 0:
        return []
    return [[cell.strip() for cell in row] for row in csv.reader(out.splitlines()) if row]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]" on some boards
