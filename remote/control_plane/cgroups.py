"""A job's own cgroup (v2), where the host has a writable cgroup tree: every process its stage starts
stays in it, whether it leaves the job's process group (`setsid`) or not, so `inv stop` ends them all.
Elsewhere (no cgroup2 mounted, a read-only tree, a container without its own) a job is its process
group only (remote/control_plane/processes.py), as before; `inv check` says which this host gets.

The supervisor makes ``<base>/aerie-<dataset>.<stage>.<run>`` and moves itself there before it starts
the stage (`enter`); the path is recorded in the job's state (``cgroup``). `base` is the cgroup the
supervisor was started in, less any job cgroup of aerie's: a job the pipeline runner starts is the
runner's sibling, never its child, so that stopping the runner never ends its jobs. The run id in the
name makes the cgroup this run's alone: unlike a pid, it is never handed to another process, so its
members are the job's whatever their pids.

Standard library only and cheap to import: `status` reads the record through `processes`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any

PREFIX = "aerie-"
MOUNTINFO = Path("/proc/self/mountinfo")
OWN = Path("/proc/self/cgroup")


def mount_point() -> Path | None:
    """Where cgroup v2 is mounted (``/sys/fs/cgroup``, or ``.../unified`` on a hybrid host); None without one."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "-" in fields and fields[fields.index("-") + 1] == "cgroup2" and fields[3] == "/":
            return Path(fields[4])
    return None


def own_parts() -> list[str] | None:
    """The path of this process's cgroup under the v2 mount, as its parts; None where it cannot be read."""
    try:
        lines = OWN.read_text().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    return None if own is None else [part for part in own.strip("/").split("/") if part]


def base(mount: Path) -> Path | None:
    """The cgroup a job's cgroup is made in: this process's, less aerie's own job cgroups."""
    parts = own_parts()
    if parts is None:
        return None
    while parts and parts[-1].startswith(PREFIX):
        parts.pop()
    return mount.joinpath(*parts)


def where() -> tuple[Path | None, str]:
    """The cgroup jobs' cgroups go in, or None, and why, in words for `inv check`."""
    mount = mount_point()
    if mount is None:
        return None, "no cgroup v2 mounted"
    parent = base(mount)
    if parent is None or not (parent / "cgroup.procs").is_file():
        return None, f"cgroup v2 at {mount}, but this process's cgroup is not visible there"
    if not os.access(parent, os.W_OK) or not os.access(parent / "cgroup.procs", os.W_OK):
        return None, f"cgroup v2 at {mount}, but {parent} is not writable by this user"
    return parent, f"cgroup v2: each job in a cgroup of its own under {parent}"


def enter(name: str, pid: int = 0) -> str | None:
    """Make the job's cgroup and move process `pid` (0: this one) into it, and so all it starts after; its
    path, or None where that cannot be done (then the job is its process group only)."""
    parent, _ = where()
    if parent is None:
        return None
    mine = parent / (PREFIX + name)
    try:
        mine.mkdir()
        (mine / "cgroup.procs").write_text(str(pid))
    except OSError:
        try:
            mine.rmdir()
        except OSError:
            pass
        return None
    return str(mine)


def placed(path: str | None) -> str | None:
    """`path`, if it is the cgroup this process is in (where its launcher placed it), else None."""
    mount, parts = mount_point(), own_parts()
    return path if path and mount is not None and parts is not None and str(mount.joinpath(*parts)) == path else None


def probe() -> tuple[bool, str]:
    """Whether a job here gets a cgroup of its own, tried for real (a tree may be writable and still refuse a
    process, e.g. where controllers are enabled below it), and how, in words for `inv check`."""
    parent, how = where()
    if parent is None:
        return False, how
    tried = enter(f"check.{os.getpid()}")
    if tried is None:
        return False, f"cgroup v2 at {parent}, but a process cannot be moved into a cgroup made there"
    leave(tried)
    return True, how


def leave(path: str | None) -> None:
    """Move this process back out of the job's cgroup and remove it if nothing else is left there."""
    if not path:
        return
    try:
        (Path(path).parent / "cgroup.procs").write_text("0")
        Path(path).rmdir()
    except OSError:
        pass  # a process is left in it: `inv stop` or a rerun ends it, and removes it then


def recorded(record: dict[str, Any]) -> Path | None:
    """The job's cgroup as its state names it, if it is one of aerie's under the cgroup v2 mount."""
    path = record.get("cgroup")
    mount = mount_point() if isinstance(path, str) and path else None
    if mount is None:
        return None
    cgroup = Path(path)
    if not (cgroup.name.startswith(PREFIX) and cgroup.is_relative_to(mount) and ".." not in cgroup.parts):
        return None
    return cgroup


def members(record: dict[str, Any]) -> list[int]:
    """The processes left in the job's cgroup; [] without one."""
    cgroup = recorded(record)
    if cgroup is None:
        return []
    try:
        pids = [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if not _is_zombie(pid)]


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True  # gone


def signal_all(record: dict[str, Any], sig: signal.Signals) -> bool:
    """Send `sig` to every process in the job's cgroup; whether there was any."""
    pids = members(record)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return bool(pids)


def kill(record: dict[str, Any], wait: float = 5.0) -> None:
    """SIGKILL every process in the job's cgroup (the kernel's ``cgroup.kill`` where it has one), then remove it."""
    cgroup = recorded(record)
    if cgroup is None:
        return
    try:
        (cgroup / "cgroup.kill").write_text("1")
    except OSError:
        signal_all(record, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while members(record) and time.monotonic() < deadline:
        signal_all(record, signal.SIGKILL)  # one forked between the reading and the signal
        time.sleep(0.05)
    try:
        cgroup.rmdir()
    except OSError:
        pass
