"""A full disk told in one line: what could not be written, and how much room is left where.

A stage, the pipeline runner and the supervisors all end on a failed write the same way: the
path, the error and the space left on its file system, never a traceback. Standard library only.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from remote.vocabulary.sizes import binary

#: The errors that mean "no room": the disk, or the user's quota on it.
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def is_no_room(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_ROOM


def mount_of(path: Path) -> Path:
    """The mount point `path` is on (its nearest existing parent when it is gone)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def room(path: Path) -> str:
    """"12.0 KiB left of 4.0 MiB on /mnt": the space the file system of `path` has."""
    where = mount_of(path)
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return f"the space left on {where} is unknown"
    return f"{binary(usage.free)} left of {binary(usage.total)} on {where}"


def failed_write(who: str, exc: OSError, fallback: Path | None = None) -> str:
    """One line for a write that failed: "<who>: cannot write PATH: No space left on device (0 B left of ...)"."""
    path = Path(exc.filename) if exc.filename else fallback
    where = f" {path}" if path is not None else ""
    left = f" ({room(path)})" if path is not None else ""
    return f"{who}: cannot write{where}: {exc.strerror or exc}{left}"
