"""Temporary files named for the run that writes them, and what to do when the disk is full.

The supervisor gives each run of a job its own id (``$AERIE_RUN``). A stage
writes its outputs under ``.tmp-<run>-<name>`` and renames them into place,
so two runs of one job (a rerun while a killed supervisor's stage lived on)
can never rename each other's files; and after a failed run the supervisor
removes exactly that run's temporary files, which on a full disk frees it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

RUN_ENV = "AERIE_RUN"
TMP_PREFIX = ".tmp-"
NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"
#: Below this much free space at the end of a failed run, the disk is taken to be why.
NEARLY_FULL = 1 << 20


def run_id() -> str:
    """This run's id: the supervisor's, or (outside a job: tests, `inv validate`) this process's."""
    return os.environ.get(RUN_ENV) or f"p{os.getpid()}"


def temporary_name(name: str, run: str | None = None) -> str:
    return f"{TMP_PREFIX}{run or run_id()}-{name}"


def remove_temporaries(directory: Path, run: str) -> list[str]:
    """Remove the run's temporary files (and directories) under `directory`, at any depth; their names."""
    prefix = temporary_name("", run)
    removed = []
    for path in sorted(Path(directory).rglob(f"{prefix}*"), key=lambda p: -len(p.parts)) if Path(directory).is_dir() else []:
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            removed.append(path.name)
        except OSError:
            pass
    return removed


def is_nearly_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free < NEARLY_FULL
    except OSError:
        return False
