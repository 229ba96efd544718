"""Processes on the host: who is alive, which process group is a job's, and ending it.

A job's supervisor leads a session and process group of its own (its pid is the
group id, recorded as ``pgid``), and everything the stage starts stays in that
group. Its stage dies with it (`die_with_parent`); whatever escapes that (a
stage that forked before the supervisor died) is ended by group when the job
is stopped or run again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

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


def is_alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    return bool(pid) and process_start(pid) == state.get("pid_start")


def group_members(state: dict[str, Any]) -> list[int]:
    """Live processes of the job's group once its leader (the supervisor) is gone.

    Safe against pid reuse: while any process is in group N the kernel does not
    hand out pid N again, so a group without its leader is still the job's; a
    live process with the leader's pid but another start time means the group
    ended long ago and the pid is someone else's.
    """
    pgid = state.get("pgid") or state.get("pid")
    if not pgid or not isinstance(pgid, int):
        return []
    leader_start = process_start(pgid)
    if leader_start is not None and leader_start != state.get("pid_start"):
        return []
    return live_members(pgid)


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


def end_group(state: dict[str, Any], grace: float = 10.0) -> bool:
    """End the job's whole process group: TERM, then KILL after `grace` seconds. Whether anything was there.

    Works as well when the supervisor was killed and its stage lives on without it.
    """
    pgid = state.get("pgid") or state.get("pid")
    if not (is_alive(state) or group_members(state)):
        return False
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (is_alive(state) or group_members(state)) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


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
        self.pid_start = process_start(self.pid)

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
