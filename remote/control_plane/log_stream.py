"""`inv logs`: a job's log written raw to stdout, its last lines, then (with follow) what it adds
until the job ends (the reading itself is `remote.control_plane.logfile`'s)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from remote.control_plane import jobs, logfile
from remote.vocabulary import layout
from remote.vocabulary.states import JobState
from remote.control_plane.store import HostError


def stream(root: Path, dataset: str, stage: str | None, lines: int = 50, follow: bool = False) -> None:
    """Print the last `lines` of the job's log, then (with `follow`) what it adds until the job ends.
    Raw bytes, no payload; a line longer than logfile.LINE_LIMIT shows its end after an
    `[aerie: line cut, ...]` marker."""
    directory = _log_dir(root, dataset, stage)
    path = directory / layout.LOG
    _wait_for_log(directory, path, follow)
    # NOTE: read from the end, a block at a time: a log may be far larger than the host's memory, and a
    # line longer than logfile.LINE_LIMIT (a progress bar without newlines) keeps only its end.
    with open(path, "rb") as handle:
        end = logfile.write_last_lines(handle, lines, _write)
        if follow:
            logfile.follow(path, handle, end, lambda: jobs.state_now(directory).is_terminal(), _write)


def _wait_for_log(directory: Path, path: Path, follow: bool) -> None:
    """Return once the log exists; a Slurm job writes its log only once it leaves the queue, so
    `follow` waits for it to appear."""
    while True:
        job = jobs.describe(directory, time.time())
        if job["state"] == JobState.BLOCKED.value:  # any log there is an earlier run's: say why none is new
            said = str(job["message"] or "")
            if not said.startswith("blocked by"):  # Slurm's word for it: the needs are the record's
                said = f"blocked by {', '.join(job.get('blocked_by') or [])}" + (f" ({said})" if said else "")
            raise HostError(f"{layout.key_of(directory)} has no log: it never started, {said}; "
                            "fix that, then `inv rerun --failed`")
        if path.exists():
            return
        if not follow or JobState(job["state"]).is_terminal():
            raise HostError(f"{layout.key_of(directory)} has no log yet (it is {job['state']})")
        time.sleep(0.25)


def _write(text: bytes) -> None:
    sys.stdout.buffer.write(text)
    sys.stdout.flush()


def _log_dir(root: Path, dataset: str, stage: str | None) -> Path:
    candidates = [d for d in jobs.all_job_dirs(root) if d.parent.name == dataset and stage in (None, d.name)]
    if not candidates:
        raise HostError(f"no job for dataset {dataset}{' stage ' + stage if stage else ''} under {root}")
    # Without a stage, the most recently started job of the dataset.
    return max(candidates, key=lambda d: jobs.describe(d, time.time()).get("started_at") or 0)
