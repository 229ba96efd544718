"""The job store on the host: the jobs under ``<root>/jobs``, each read on its own.

One directory per (dataset, stage), plus the pseudo jobs of ``inv run``
(``pipeline/run``, ``draft/train``)::

    spec.json      what to run (written by launch)
    state.json     the record: executor, pid/pgid or Slurm id, release, times, exit code
    progress.json  the stage's counters (remote.control_plane.progress)
    log            the stage's output, capped at the spec's `log_limit`; the previous run's is kept as log.1
    stop.json      `inv stop`'s request, written before it signals: only then does the job end `stopped`
    launch.lock    taken while a launch, rerun or stop decides about the job

The names, and where the directories lie, are `remote.vocabulary.layout`'s.

Every file is checked as it is read: a job whose files are torn, of the wrong
type or hold bytes that are not JSON raises `BrokenJob` with the reason, which
the status lists as that job's state (`broken`) instead of failing as a whole.
"""

from __future__ import annotations

import fcntl
import json
import re
import time
from contextlib import contextmanager
from pathlib import Path

from remote.vocabulary import hints, layout
from remote.vocabulary.layout import LOCK, LOG, PROGRESS, SPEC, STATE, STOP
from remote.control_plane.progress import read_mapping, write_json_atomic
from remote.vocabulary.states import JobState

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Iterator

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Fields of state.json and progress.json that must be numbers when present.
TIMES = ("started_at", "ended_at", "heartbeat_at", "submitted_at", "stall_after", "updated_at")


class HostError(Exception):
    """A refusal the workstation shows as one line."""


class BrokenJob(Exception):
    """A job whose files cannot be read; the message says which and why."""


class Job:
    """One job's files, read and checked."""

    __slots__ = ("directory", "state", "progress")  # a plain class, as `executors.Reading` is

    def __init__(self, directory: Path, state: dict[str, Any], progress: dict[str, Any]) -> None:
        self.directory, self.state, self.progress = directory, state, progress

    @property
    def key(self) -> str:
        return layout.key_of(self.directory)


class JobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def directory(self, dataset: str, stage: str) -> Path:
        for name in (dataset, stage):  # the workstation checks names first; a job never leaves its root
            if not SAFE_NAME.fullmatch(str(name)):
                raise HostError(f"{name!r} is not a job name: letters, digits, '_', '.' and '-', starting with a letter or digit")
        return layout.job_dir(self.root, dataset, stage)

    def directories(self) -> list[Path]:
        """Every job that has a record, a broken one included (a directory where state.json was)."""
        return sorted(p.parent for p in layout.jobs_dir(self.root).glob(f"*/*/{STATE}"))

    def current_release(self) -> Path:
        link = self.root / "current"
        if not link.exists():
            raise HostError(f"nothing deployed under {self.root}: run {hints.inv('deploy')} first")
        return link.resolve()

    @contextmanager
    def locked(self, directory: Path) -> Iterator[None]:
        """An exclusive flock: two terminals launching the same job take turns."""
        with open(directory / LOCK, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def read(self, directory: Path) -> Job:
        """The job's record and counters; `BrokenJob` when either cannot be trusted."""
        return Job(directory, checked_state(read_object(directory / STATE)),
                   checked_progress(read_object(directory / PROGRESS)))

    def spec(self, directory: Path) -> dict[str, Any]:
        spec = read_object(directory / SPEC)
        if not spec:
            raise BrokenJob(f"{SPEC} is missing: launch the job again from the workstation")
        return spec

    def write_state(self, directory: Path, state: dict[str, Any]) -> None:
        write_json_atomic(directory / STATE, state)

    def request_stop(self, directory: Path) -> None:
        """Record that `inv stop` ends this run (before it signals): the supervisor then ends `stopped`;
        a signal from anyone else ends it `died`. The next launch clears it (`prepare`)."""
        write_json_atomic(directory / STOP, {"requested_at": time.time()})

    def prepare(self, directory: Path, spec: dict[str, Any]) -> None:
        """A fresh start: the new spec, no old counters, the previous log kept as log.1, a broken record cleared."""
        for name in (STATE, PROGRESS, SPEC):
            if (directory / name).is_dir():  # a directory where a file belongs: what made the job broken
                import shutil  # here: reading jobs never removes one

                shutil.rmtree(directory / name)
        # NOTE: a relaunch of the same spec leaves the file as it is: replacing a file is a journal
        # write, a large share of recording a job's launch (docs/benchmarks.md).
        if read_mapping(directory / SPEC) != spec:  # absent, torn or foreign: {}, never a spec
            write_json_atomic(directory / SPEC, spec)
        (directory / PROGRESS).unlink(missing_ok=True)
        (directory / STOP).unlink(missing_ok=True)
        if (directory / LOG).exists():
            (directory / LOG).replace(directory / f"{LOG}.1")


def read_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; {} when absent; `BrokenJob` when it is anything else."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise BrokenJob(f"{path.name} is a directory, not a file") from None
    except OSError as exc:
        raise BrokenJob(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BrokenJob(f"{path.name} holds bytes that are not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise BrokenJob(f"{path.name} is not valid JSON (torn or half-written?): {exc.msg} at byte {exc.pos}") from None
    if not isinstance(value, dict):
        raise BrokenJob(f"{path.name} holds a JSON {type(value).__name__}, not an object")
    return value


def checked_state(state: dict[str, Any]) -> dict[str, Any]:
    if not state:
        return state
    if state.get("state") not in {s.value for s in JobState} - {JobState.BROKEN.value}:
        raise BrokenJob(f"{STATE} has an unknown state {state.get('state')!r}")
    for key in ("pid", "pgid"):
        if not _is_int_or_none(state.get(key)):
            raise BrokenJob(f"{STATE}: {key} {state[key]!r} is not a process id")
    if not isinstance(state.get("pid_start"), (str, type(None))):
        raise BrokenJob(f"{STATE}: pid_start {state['pid_start']!r} is not a process start time")
    if not isinstance(state.get("boot_id"), (str, type(None))):
        raise BrokenJob(f"{STATE}: boot_id {state['boot_id']!r} is not a boot id")
    _check_times(STATE, state)
    starting = state.get("starting")
    if starting is not None and not (isinstance(starting, dict) and _is_int_or_none(starting.get("pid"))):
        raise BrokenJob(f"{STATE}: starting {starting!r} is not a starter's pid")
    for key in ("waiting_for", "blocked_by"):
        if not isinstance(state.get(key), (list, type(None))):
            raise BrokenJob(f"{STATE}: {key} is not a list")
    return state


def checked_progress(progress: dict[str, Any]) -> dict[str, Any]:
    if not _is_int_or_none(progress.get("records")):
        raise BrokenJob(f"{PROGRESS}: records {progress['records']!r} is not a whole number")
    reasons = progress.get("skip_reasons", {})
    if not isinstance(reasons, dict) or not all(isinstance(n, int) and not isinstance(n, bool) for n in reasons.values()):
        raise BrokenJob(f"{PROGRESS}: skip_reasons is not a mapping of reason to count")
    if not isinstance(progress.get("metrics", {}), dict):
        raise BrokenJob(f"{PROGRESS}: metrics is not a mapping")
    if not isinstance(progress.get("message", ""), str):
        raise BrokenJob(f"{PROGRESS}: message is not text")
    _check_times(PROGRESS, progress)
    return progress


def _check_times(name: str, record: dict[str, Any]) -> None:
    for key in TIMES:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise BrokenJob(f"{name}: {key} {value!r} is not a number")


def _is_int_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))
