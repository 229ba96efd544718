"""The inference server a stage needs: started detached in its own session, waited on until
healthy, stopped by process group, each signal only to the group that was started.

The launch command is a string from the inventory (SGLang's
``python -m sglang.launch_server ...`` on the GPU host, ``transformers serve``
for the demo). The server runs in its own session, so `stop` ends its whole
process group: SGLang forks scheduler and detokenizer processes that a plain
kill of the parent would leave holding the GPUs. `ManagedServer` is one for
the pipeline runner and for an infer job that brings its own (on Slurm).

Standard library only: the host's Python may have nothing else installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from remote.control_plane import processes
from remote.vocabulary import secrets
from remote.control_plane.logfile import tail
from remote.control_plane.progress import write_json_atomic


class ServerError(Exception):
    """The server did not start, did not answer, or could not be asked."""


def start(command: str, log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start `command` detached in its own session, output appended to `log_path`; return its pid.

    `env` is laid over the current environment, its ``${NAME}`` secrets filled in from it
    (remote/vocabulary/secrets.py). The pid is also the process group id, which is what `stop` signals.
    """
    if not command.strip():
        raise ServerError("inference server launch command is empty: set it in the inventory")
    try:
        env = secrets.expand_env(env or {})
    except secrets.MissingSecret as exc:
        raise ServerError(f"inference server not started: {exc}") from None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
    return process.pid


def base_url(url: str) -> str:
    """The server's root: ``http://h:p/v1`` and ``http://h:p/`` both give ``http://h:p``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def is_healthy(url: str, timeout: float = 5.0) -> bool:
    """True when ``/health`` answers 200, or, on servers without it, ``/v1/models`` does."""
    import urllib.error  # here: every job's supervisor imports this module, and few manage a server
    import urllib.request

    root = base_url(url)
    for path in ("/health", "/v1/models"):
        try:
            with urllib.request.urlopen(root + path, timeout=timeout) as response:
                if response.status == 200:
                    return True
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                return False
        except OSError:
            return False
    return False


def wait_healthy(url: str, timeout: float, pid: int | None = None, log_path: Path | None = None,
                 beat: Callable[[], None] = lambda: None, since: int = 0) -> None:
    """Block until the server at `url` is healthy; raise `ServerError` after `timeout` seconds.

    With `pid`, a server that exits while starting fails at once, with what its log says
    went wrong (`reason`: of what it wrote from byte `since` on) in the message, instead of
    after the whole timeout. `beat` is called while waiting, so that a long model load is
    not taken for a stall.
    """
    deadline = time.monotonic() + timeout
    where = f" (log: {log_path})" if log_path is not None else ""
    while True:
        if is_healthy(url, timeout=min(5.0, timeout)):
            return
        if pid is not None and not is_running(pid):
            raise ServerError(f"inference server (pid {pid}) exited while starting: {reason(log_path, since)}{where}")
        if time.monotonic() >= deadline:
            raise ServerError(f"inference server at {url} not healthy after {timeout:.0f}s: {reason(log_path, since)}{where}")
        beat()
        time.sleep(0.25)


def is_running(pid: int) -> bool:
    """True while any process of the server's group is alive; zombies do not count."""
    _reap(pid)
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # NOTE: killpg also succeeds on a group of zombies (a leader whose parent
    # has not reaped it), so look at the members' states.
    return bool(processes.live_members(pid))


def stop(record: dict[str, Any], grace: float = 15.0) -> None:
    """End the server's whole process group: SIGTERM, then SIGKILL after `grace` seconds.

    `record` is the server's `processes.identity`: each signal goes only to a group that is still the
    one started (`processes.is_ours`), never to a process that has since been given its pid.
    """
    pid = record["pid"]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        _reap(pid)
        if not processes.signal_group(record, sig):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not processes.is_ours(record):
                return
            time.sleep(0.1)
    raise ServerError(f"inference server process group {pid} survived SIGKILL")


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


#: A line that says what failed: a traceback's last (`torch.OutOfMemoryError: ...`), a parser's (`Error: No such
#: option`, `server.py: error: unrecognized arguments`), a logger's `ERROR:`; not one that only mentions an error
#: (SGLang's `Ignore import error when loading ...` at every start).
ERROR_LINE = re.compile(r"^(?:[\w.]*(?:Error|Exception)\b|error\b|ERROR\b|\S+: error:)")
#: How much of a server's log `reason` reads, from its end: a server's log can be long.
REASON_BYTES = 64 * 1024


def log_end(log_path: Path) -> int:
    """Where the next start's output begins in `log_path` (which keeps every start's): its size."""
    try:
        return log_path.stat().st_size
    except OSError:
        return 0


def reason(log_path: Path | None, since: int = 0, limit: int = 300) -> str:
    """What a server's log says went wrong since byte `since`: its last line that names an error, else its
    last line. A command-line parser prints its usage (or a list of options) around the error, and a
    server that fails in its startup logs more after the traceback, so the last line alone is rarely it."""
    if log_path is None:
        return "(no log)"
    if not log_path.is_file():
        return f"(no log at {log_path})"
    written = log_end(log_path) - since
    text = tail(log_path, min(written, REASON_BYTES)) if written > 0 else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return f"(nothing in its log {log_path})"
    return next((line for line in reversed(lines) if ERROR_LINE.search(line)), lines[-1])[:limit]


class ManagedServer:
    """The inference server that aerie starts itself (``stages.infer.server_command``): started, waited
    on until healthy, and stopped by process group; one class for the pipeline runner and for an infer
    job that brings its own (on Slurm, inside its allocation).

    `settings` is what the workstation sends (`command`, `url`, `start_timeout`, `env`); with `record`,
    the server's identity (pid, start time, boot id) is kept in that file so that a later process (a
    resumed runner) adopts it. A recorded pid that is no longer that server (after a reboot, or handed
    to another process) is never adopted nor signalled.
    """

    def __init__(self, settings: dict[str, Any] | None, log: Path, record: Path | None = None) -> None:
        self.settings = settings or {}
        self.log = log
        self.record = record
        self.started: dict[str, Any] | None = None
        """The identity of the server this object runs or adopted."""

    @property
    def pid(self) -> int | None:
        return self.started["pid"] if self.started else None

    @property
    def is_managed(self) -> bool:
        """False for a server run outside aerie (no command): it is neither started nor stopped here."""
        return bool(self.settings.get("command"))

    def ensure(self, python: str) -> int | None:
        """Start the server unless one of ours is running and healthy; the pid started, if one was."""
        if not self.is_managed:
            return None
        recorded = self._recorded()
        if recorded is not None and is_healthy(self.settings["url"]):
            self.started = recorded
            return None
        if recorded is not None:  # ours, but not answering: it must not keep the GPU beside a new one
            stop(recorded)
        since = log_end(self.log)
        pid = start(self.settings["command"].replace("{python}", python), self.log, env=self.settings.get("env") or {})
        self.started = processes.identity(pid)
        if self.record is not None:
            write_json_atomic(self.record, self.started)
        wait_healthy(self.settings["url"], self.settings.get("start_timeout", 1800), pid, self.log, since=since)
        return pid

    def stop(self) -> int | None:
        """Stop our server if it runs; the pid stopped, if one was."""
        record = self.started or self._recorded()
        stopped = None
        if record is not None and processes.is_ours(record):
            stop(record)
            stopped = record["pid"]
        self.started = None
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        return stopped

    def _recorded(self) -> dict[str, Any] | None:
        """The recorded server, if the record can prove which process it was; a record that cannot
        (torn, or only a pid, as older releases wrote) is said so in the log and never acted on."""
        if self.record is None:
            return None
        try:
            recorded = json.loads(self.record.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            recorded = None
        if isinstance(recorded, dict) and isinstance(recorded.get("pid"), int) and recorded.get("pid_start"):
            if processes.is_ours(recorded):
                return recorded
            why = "the host has rebooted since" if not processes.same_boot(recorded) else "that pid is another process now"
        else:
            why = "the record cannot prove which process it was"
        print(f"server: {self.record} is not our server ({why}): left alone, never signalled", flush=True)
        self.record.unlink(missing_ok=True)
        return None
