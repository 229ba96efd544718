"""Processes on the host: who is alive, which process group is a job's, and ending it.

A job's supervisor leads a session and process group of its own (its pid is the
group id, recorded as ``pgid``), and everything the stage starts stays in that
group, unless it calls `setsid`: where the host allows, the job also has a cgroup
of its own (remote/control_plane/cgroups.py), which nothing it starts can leave.
Its stage dies with it (`die_with_parent`); whatever escapes that (a
stage that forked before the supervisor died) is ended by group when the job
is stopped or run again.

A process is aerie's only if it proves it: every pid aerie may signal (a job's
supervisor and group, a starter, the inference server) is recorded with its
start time and the host's boot id (`identity`), and checked just before each
signal (`is_ours`). After a reboot, or once a pid has been handed to another
process, the record does not match and nothing is signalled.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from remote.control_plane import cgroups

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Callable

PR_SET_PDEATHSIG = 1


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid`, so a reused pid is not taken for the job."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return _process_start_ps(pid)
    # The command name may hold spaces and parentheses; fields restart after the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _process_start_ps(pid: int) -> str | None:
    # NOTE: only where there is no /proc (a macOS workstation on the local backend).
    if not Path("/proc").is_dir():
        import subprocess

        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True)
        return out.stdout.strip() or None
    return None


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_boot: list[str | None] = []  # read once per process


def boot_id() -> str | None:
    """This boot of the host: a pid and its start time name one process only within one boot (after a
    reboot, pids start again from 1 and start times from 0). None where the kernel has no boot id."""
    if not _boot:
        try:
            _boot.append(BOOT_ID.read_text().strip() or None)
        except OSError:
            _boot.append(None)
    return _boot[0]


def identity(pid: int) -> dict[str, Any]:
    """What aerie records of a process it started, to prove later that a pid is still that process."""
    return {"pid": pid, "pid_start": process_start(pid), "boot_id": boot_id()}


def same_boot(record: dict[str, Any]) -> bool:
    # NOTE: a record without the key was written by an older release; its start time alone is checked.
    return "boot_id" not in record or record["boot_id"] == boot_id()


def is_alive(record: dict[str, Any]) -> bool:
    """Whether the recorded process still runs: the same pid, start time and boot. A record that
    cannot prove it (no start time) never matches."""
    pid, start = record.get("pid"), record.get("pid_start")
    if not (isinstance(pid, int) and pid > 0 and start and same_boot(record)):
        return False
    return process_start(pid) == start


def group_members(record: dict[str, Any]) -> list[int]:
    """Live processes of the recorded group once its leader (the supervisor) is gone.

    Safe against pid reuse within one boot: while any process is in group N the kernel
    does not hand out pid N again, so a group without its leader is still the job's; a
    live process with the leader's pid but another start time means the group ended
    long ago and the pid is someone else's. Across a reboot nothing of the group is left,
    so a record of another boot has no members.
    """
    pgid = record.get("pgid") or record.get("pid")
    if not pgid or not isinstance(pgid, int) or pgid <= 0 or not record.get("pid_start") or not same_boot(record):
        return []
    leader_start = process_start(pgid)
    if leader_start is not None and leader_start != record.get("pid_start"):
        return []
    return live_members(pgid)


def is_ours(record: dict[str, Any]) -> bool:
    """Whether the recorded process, or what is left of its group or of its cgroup, is still the one aerie
    started: the only processes aerie ever signals."""
    return is_alive(record) or bool(group_members(record)) or bool(cgroups.members(record))


def live_members(pgid: int) -> list[int]:
    """The processes of group `pgid` that are alive (zombies do not count), from /proc; without
    /proc, the group leader's pid while the group exists."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def end_group(record: dict[str, Any], grace: float = 10.0) -> bool:
    """End the recorded process group, and every process of the job's cgroup where it has one (those
    that left the group with `setsid` too): TERM, then KILL after `grace` seconds. Whether anything of
    ours was there; a pid that is not ours (`is_ours`) is never signalled.

    Works as well when the supervisor was killed and its stage lives on without it.
    """
    grouped = signal_group(record, signal.SIGTERM)
    if not (cgroups.signal_all(record, signal.SIGTERM) or grouped):
        cgroups.kill(record)  # nothing left in it (a supervisor killed with its stage): only removed
        return False
    deadline = time.monotonic() + grace
    while is_ours(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal_group(record, signal.SIGKILL)
    cgroups.kill(record)
    return True


def signal_group(record: dict[str, Any], sig: signal.Signals) -> bool:
    """Send `sig` to the recorded process group if it is still ours (checked just before); whether it was."""
    pgid = record.get("pgid") or record.get("pid")
    if not is_ours(record):
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn`: the kernel sends `sig` to the child when `parent` dies (Linux; elsewhere nothing).

    The setting survives exec, so `/bin/sh -c CMD` that execs CMD passes it on to the stage.
    """
    import ctypes  # here: only the supervisor needs it, and `status` starts faster without

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    except (OSError, AttributeError):
        return lambda: None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


class Starter:
    """One detached process that starts many jobs' supervisors, so that the command that launched
    them answers at once instead of waiting for each fork (40 jobs: 40 Python start-ups).

    Forked first, so that its pid can be recorded in each job's state (``starting``) before it
    runs; then `hand_over` gives it the jobs. It starts a job only if the job's state still names
    it under the job's lock, so a job stopped or relaunched meanwhile is left alone.
    """

    def __init__(self, start_one: Callable[[str], None]) -> None:
        read_end, self._write_end = os.pipe()
        launcher = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # the starter
            os.close(self._write_end)
            self._run(read_end, start_one, launcher)
        os.close(read_end)
        self.identity = identity(self.pid)

    def hand_over(self, directories: list[str]) -> None:
        with os.fdopen(self._write_end, "w") as pipe:
            pipe.write("\n".join(directories))

    @staticmethod
    def _run(read_end: int, start_one: Callable[[str], None], launcher: int) -> None:
        code = 0
        try:
            os.setsid()  # no SIGHUP when the SSH session that started it ends
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # nothing of the SSH channel stays open here
                os.dup2(null, fd)
            with os.fdopen(read_end) as pipe:
                directories = [line for line in pipe.read().split("\n") if line]
            _until_gone(launcher, LAUNCHER_GRACE_S)
            for directory in directories:
                try:
                    start_one(directory)
                except Exception:  # one job's failure (its state says died) must not stop the others
                    code = 1
        finally:
            os._exit(code)


#: How long the starter lets the command that launched the jobs answer and exit before it starts
#: their supervisors (40 Python start-ups), so that they never slow the answer on a busy host.
LAUNCHER_GRACE_S = 1.0


def _until_gone(pid: int, timeout: float) -> None:
    """Wait until `pid`, our parent, has exited (we are reparented), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while os.getppid() == pid and time.monotonic() < deadline:
        time.sleep(0.002)
