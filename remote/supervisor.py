"""The supervisor: runs one stage command and keeps the job's state file true.

Started by `remote.jobs.launch` in a session of its own, so it outlives the SSH
connection that started it. It records the exit and decides the end state:
`succeeded`, `empty` (exit 0, zero records), `failed`, `died` (the stage was
killed by SIGKILL, as the OOM killer does) or `stopped` (by `inv stop`).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from remote import server
from remote.jobs import HEARTBEAT_SECONDS, SUPERVISOR_MARK, last_line, process_start
from remote.progress import PROGRESS_ENV, read_json, write_json_atomic
from remote.stages import DEFAULT_COMMANDS
from remote.states import JobState


def stage_env(spec: dict[str, Any], directory: Path, release: Path) -> dict[str, str]:
    """The stage contract's variables (see remote.stages)."""
    root = directory.parents[2]
    data = root / "data" / spec["dataset"]
    return {
        "AERIE_ROOT": str(root),
        "AERIE_RELEASE": release.name,
        "AERIE_DATASET": spec["dataset"],
        "AERIE_STAGE": spec["stage"],
        "AERIE_SOURCE": spec.get("source", ""),
        "AERIE_KIND": spec.get("kind", "native"),
        "AERIE_OUTPUT": str(data / spec["stage"]),
        "AERIE_DATA": str(data),
        PROGRESS_ENV: str(directory / "progress.json"),
        "AERIE_CONFIG": json.dumps(spec.get("config", {})),
    }


def stage_command(spec: dict[str, Any]) -> str:
    command = spec.get("command") or DEFAULT_COMMANDS[spec["stage"]]
    return command.replace("{python}", sys.executable)


def killed_by(exit_code: int) -> signal.Signals | None:
    """The signal that ended the stage: negative from Popen, 128+N as /bin/sh reports its child's."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def end_state(exit_code: int, records: int, stopping: bool) -> JobState:
    if stopping:
        return JobState.STOPPED
    if killed_by(exit_code) == signal.SIGKILL:  # what the OOM killer sends
        return JobState.DIED
    if exit_code != 0:
        return JobState.FAILED
    return JobState.SUCCEEDED if records > 0 else JobState.EMPTY


def end_message(state: JobState, exit_code: int, progress: dict[str, Any], log: Path) -> str:
    if state == JobState.EMPTY:
        reasons = sorted(progress.get("skip_reasons", {}).items(), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{reason} ×{count}" for reason, count in reasons) or "the stage reported no records"
        return f"exit 0 with zero records: {why}"
    if killed_by(exit_code):
        return f"killed by {killed_by(exit_code).name}"
    if state == JobState.FAILED:
        return f"exit {exit_code}: {last_line(log)}"
    return progress.get("message", "")


@contextmanager
def inference_server(settings: dict[str, Any] | None, directory: Path) -> Iterator[None]:
    """The server an infer job needs, for that job alone (on Slurm, inside its allocation).

    On one host `inv run`'s pipeline runner manages the server instead, and such
    specs carry no `server`.
    """
    if not settings or not settings.get("command"):
        yield
        return
    log = directory / "server.log"
    pid = server.start(settings["command"].replace("{python}", sys.executable), log, env=settings.get("env") or {})
    print(f"{SUPERVISOR_MARK} inference server pid {pid} starting", flush=True)
    try:
        server.wait_healthy(settings["url"], settings.get("start_timeout", 1800), pid, log)
        yield
    finally:
        server.stop(pid)


class Supervisor:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_path = directory / "state.json"
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        self._wait_for_launcher()
        spec = read_json(self.directory / "spec.json")
        state = read_json(self.state_path)
        # Under Slurm the job was only queued by the launcher: this is where it starts, and on which node.
        state.update(state=JobState.RUNNING.value, pid=os.getpid(), pid_start=process_start(os.getpid()),
                     node=socket.gethostname(), started_at=state.get("started_at") or time.time())
        write_json_atomic(self.state_path, state)
        release = Path.cwd()
        env = {**os.environ, **stage_env(spec, self.directory, release)}
        Path(env["AERIE_OUTPUT"]).mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        command = stage_command(spec)
        print(f"{SUPERVISOR_MARK} {spec['stage']} {spec['dataset']} on release {release.name}: {command}", flush=True)
        try:
            with inference_server(spec.get("server"), self.directory):
                self.child = subprocess.Popen(["/bin/sh", "-c", command], cwd=release, env=env)
                exit_code = self._wait(state)
        except server.ServerError as exc:
            print(f"inference server: {exc}", flush=True)
            exit_code = 1
        ended = self._finish(state, exit_code)
        # Only a success exits 0: Slurm's `afterok` dependents (and its own end state) read this.
        return 0 if ended == JobState.SUCCEEDED else 1

    def _wait_for_launcher(self) -> None:
        # The launcher holds this lock until it has recorded our pid; then state.json is ours.
        with open(self.directory / "launch.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)

    def _on_term(self, signum: int, frame: object) -> None:
        self.stopping = True
        if self.child and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def _wait(self, state: dict[str, Any]) -> int:
        assert self.child is not None
        while True:
            try:
                return self.child.wait(timeout=HEARTBEAT_SECONDS)
            except subprocess.TimeoutExpired:
                state["heartbeat_at"] = time.time()
                write_json_atomic(self.state_path, state)

    def _finish(self, state: dict[str, Any], exit_code: int) -> JobState:
        progress = read_json(self.directory / "progress.json", {})
        ended = end_state(exit_code, progress.get("records", 0), self.stopping)
        state.update(
            state=ended.value,
            exit_code=exit_code,
            signal=getattr(killed_by(exit_code), "name", None),
            ended_at=time.time(),
            message=end_message(ended, exit_code, progress, self.directory / "log"),
        )
        write_json_atomic(self.state_path, state)
        print(f"{SUPERVISOR_MARK} {ended.value}: exit {exit_code}, {progress.get('records', 0)} records", flush=True)
        return ended


if __name__ == "__main__":
    sys.exit(Supervisor(Path(sys.argv[1])).run())
