"""The supervisor: runs one stage command and keeps the job's state file true.

Started by `remote.control_plane.jobs.launch` in a session of its own, so it outlives the SSH
connection that started it. It records the exit and decides the end state:
`succeeded`, `empty` (exit 0, zero records), `failed`, `stopped` (only when
`inv stop` asked: its request, ``stop.json``, is written before it signals) or
`died` (ended by any other signal: the OOM killer's SIGKILL, systemd's SIGTERM
at shutdown, an operator's `kill`), with the signal named.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from remote.control_plane import cgroups, disk, inference_server, scratch
from remote.control_plane.jobs import HEARTBEAT_SECONDS
from remote.control_plane.logfile import SUPERVISOR_MARK, bounded, last_line, tail
from remote.vocabulary.layout import LOCK, LOG, PROGRESS, SERVER_LOG, SPEC, STATE, STOP
from remote.control_plane.logfile import CappedLog
from remote.control_plane.processes import die_with_parent, identity
from remote.control_plane.progress import read_json, read_mapping, write_json_atomic
from remote.control_plane.stage_contract import OUTPUT_ENV, stage_command, stage_env
from remote.vocabulary.states import JobState


def exec_form(command: str) -> str:
    """`exec CMD` for a simple command, so that the stage is the shell's process and inherits its
    parent-death signal (dash forks even the last command of `sh -c`); other command lines as they are."""
    if any(c in command for c in ";&|\n()`"):
        return command
    try:
        first = shlex.split(command)[0]
    except (ValueError, IndexError):
        return command
    if "=" in first or first in ("if", "for", "while", "until", "case", "{", "!", "exec"):
        return command
    return f"exec {command}"


def killed_by(exit_code: int) -> signal.Signals | None:
    """The signal that ended the stage: negative from Popen, 128+N as /bin/sh reports its child's."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def end_state(exit_code: int, records: int, stopping: bool, signalled: signal.Signals | None = None) -> JobState:
    """`stopping`: `inv stop` asked; `signalled`: the supervisor was sent a signal by anyone else."""
    if stopping:
        return JobState.STOPPED
    if signalled or killed_by(exit_code):  # the OOM killer's SIGKILL, systemd's SIGTERM, an operator's kill
        return JobState.DIED
    if exit_code != 0:
        return JobState.FAILED
    return JobState.SUCCEEDED if records > 0 else JobState.EMPTY


def end_message(state: JobState, exit_code: int, progress: dict[str, Any], log: Path, no_space: bool = False,
                signalled: signal.Signals | None = None, lost: str = "") -> str:
    """`lost`: the stage's last line that a full disk kept out of `log`, which then says it instead."""
    if state == JobState.DIED:
        name = (signalled or killed_by(exit_code) or signal.SIGKILL).name
        why = last_line(log, ERROR_LIMIT)
        return f"killed by {name}, not by `inv stop`" + (f"; its log ends: {why}" if why else "")
    if state == JobState.EMPTY:
        reasons = sorted(progress.get("skip_reasons", {}).items(), key=lambda kv: -kv[1])[:3]
        why = ", ".join(f"{reason} ×{count}" for reason, count in reasons) or "the stage reported no records"
        return f"exit 0 with zero records: {why}"
    if state == JobState.FAILED and no_space:
        why = lost or last_line(log, ERROR_LIMIT)
        # NOTE: a stage's own line names the path and the room left (remote.control_plane.disk): it is the message.
        if why and scratch.NO_SPACE in why and "left of" in why:
            return f"exit {exit_code}: {why}"
        return f"no space left on device: exit {exit_code}" + (f": {why}" if why and scratch.NO_SPACE not in why else "")
    if state == JobState.FAILED:
        return f"exit {exit_code}: {lost or last_line(log, ERROR_LIMIT)}"
    return progress.get("message", "")


#: The most of a job's error kept in its state (its end: a stage's last words say what went wrong);
#: the status table shortens it to its width, `inv status --json` and the lines under the table do not.
ERROR_LIMIT = 4096


@contextmanager
def job_server(settings: dict[str, Any] | None, directory: Path, say: Callable[[str], None]) -> Iterator[None]:
    """The server an infer job needs, for that job alone (on Slurm, inside its allocation).

    On one host `inv run`'s pipeline runner manages the server instead, and such
    specs carry no `server`.
    """
    managed = inference_server.ManagedServer(settings, directory / SERVER_LOG)
    if not managed.is_managed:
        yield
        return
    try:
        pid = managed.ensure(sys.executable)
        say(f"{SUPERVISOR_MARK} inference server pid {pid} healthy")
        yield
    finally:
        managed.stop()


class Supervisor:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state_path = directory / STATE
        self.stopping = False
        self.signalled: signal.Signals | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.log: CappedLog | None = None

    def run(self) -> int:
        self._wait_for_launcher()
        spec = read_json(self.directory / SPEC)
        state = read_json(self.state_path)
        # Under Slurm the job was only queued by the launcher: this is where it starts, and on which node.
        # The run's id names its temporary files, so that no other run of this job can take them for its own.
        self.run_id = f"{time.time_ns():x}-{os.getpid()}"
        # Before the stage starts, so that all it starts is in it: the one its launcher placed it in, else
        # one of its own. Not under Slurm, whose own cgroups hold the job.
        own = f"{spec['dataset']}.{spec['stage']}.{self.run_id}"
        self.cgroup = None if spec.get("executor") == "slurm" else cgroups.placed(state.get("cgroup")) or cgroups.enter(own)
        state.update(state=JobState.RUNNING.value, **identity(os.getpid()), pgid=os.getpgrp(),
                     node=socket.gethostname(), run=self.run_id, cgroup=self.cgroup,
                     started_at=state.get("started_at") or time.time())
        write_json_atomic(self.state_path, state)
        # Every byte of the log passes through here from now on, so that it stays under its limit.
        self.log = CappedLog(self.directory / LOG, spec.get("log_limit"))
        self.log.take_stdio()
        release = Path.cwd()
        env = {**os.environ, **stage_env(spec, self.directory, release, self.run_id)}
        self.output = Path(env[OUTPUT_ENV])
        self.output.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        command = stage_command(spec["stage"], spec.get("command"))
        self._log_line(f"{SUPERVISOR_MARK} {spec['stage']} {spec['dataset']} on release {release.name}: {command}")
        try:
            with job_server(spec.get("server"), self.directory, self._log_line):
                exit_code = self._run_stage(command, release, env, state)
        except inference_server.ServerError as exc:
            self._log_line(f"inference server: {exc}")
            exit_code = 1
        ended = self._finish(state, exit_code)
        cgroups.leave(self.cgroup)
        # Only a success exits 0: Slurm's `afterok` dependents (and its own end state) read this.
        return 0 if ended == JobState.SUCCEEDED else 1

    def _run_stage(self, command: str, release: Path, env: dict[str, str], state: dict[str, Any]) -> int:
        """Run the stage, its output piped into the capped log, until it exits; its exit code."""
        import threading

        assert self.log is not None
        read_end, write_end = os.pipe()
        try:
            # The stage dies with this supervisor: a kill -9 here must not leave it writing on its own.
            self.child = subprocess.Popen(["/bin/sh", "-c", exec_form(command)], cwd=release, env=env,
                                          stdout=write_end, stderr=subprocess.STDOUT,
                                          preexec_fn=die_with_parent(os.getpid()))
        finally:
            os.close(write_end)
        pump = threading.Thread(target=self.log.pump, args=(read_end,), daemon=True)
        pump.start()
        exit_code = self._wait(state)
        # NOTE: a process the stage left behind may hold the pipe open for ever; what the stage wrote
        # itself is in the pipe already and is drained at once.
        pump.join(timeout=PUMP_DRAIN_S)
        return exit_code

    def _wait_for_launcher(self) -> None:
        # The launcher holds this lock until it has recorded our pid; then state.json is ours.
        with open(self.directory / LOCK, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)

    def _on_term(self, signum: int, frame: object) -> None:
        # NOTE: `inv stop` writes its request before it signals; a signal without one (systemd at
        # shutdown, an operator's kill) is not a stop, and the job must not look finished on purpose.
        if (self.directory / STOP).exists():
            self.stopping = True
        else:
            self.signalled = self.signalled or signal.Signals(signum)
        if self.child and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def _wait(self, state: dict[str, Any]) -> int:
        assert self.child is not None
        while True:
            try:
                return self.child.wait(timeout=HEARTBEAT_SECONDS)
            except subprocess.TimeoutExpired:
                state["heartbeat_at"] = time.time()
                try:
                    write_json_atomic(self.state_path, state)
                except OSError:  # a full disk: the stage's end is what matters, not this beat
                    _remove_torn(self.state_path)

    def _finish(self, state: dict[str, Any], exit_code: int) -> JobState:
        progress = read_mapping(self.directory / PROGRESS)
        records = progress.get("records", 0) if isinstance(progress.get("records"), int) else 0
        # NOTE: a stop requested without a signal is the stage's own (the pipeline runner stopped with a job of it).
        ended = end_state(exit_code, records, self.stopping or (self.directory / STOP).exists(), self.signalled)
        no_space = False
        if ended != JobState.SUCCEEDED:
            log = self.directory / LOG
            no_space = scratch.is_nearly_full(self.output) or scratch.NO_SPACE in tail(log)
            removed = scratch.remove_temporaries(self.output, self.run_id)
            if removed:
                self._log_line(f"{SUPERVISOR_MARK} removed this run's temporary files: {', '.join(removed[:5])}"
                               + (f" and {len(removed) - 5} more" if len(removed) > 5 else ""))
        state.update(
            state=ended.value,
            exit_code=exit_code,
            signal=getattr(self.signalled or killed_by(exit_code), "name", None),
            ended_at=time.time(),
            message=bounded(end_message(ended, exit_code, progress, self.directory / LOG, no_space, self.signalled,
                                        self.log.lost_line() if self.log else ""), 2 * ERROR_LIMIT),
        )
        # The log's last line first: `inv logs --follow` ends when it reads the end state, and must have it.
        self._log_line(f"{SUPERVISOR_MARK} {ended.value}: exit {exit_code}, {records} records")
        write_state_last(self.state_path, state)
        return ended

    def _log_line(self, text: str) -> None:
        """One line of the supervisor's own in the job's log (a full disk loses it; the state says it all)."""
        if self.log is not None:
            self.log.line(text)
            return
        try:
            print(text, flush=True)
        except OSError:
            pass


#: How long the supervisor waits, once the stage has exited, for the rest of its output.
PUMP_DRAIN_S = 2.0


def _remove_torn(path: Path) -> None:
    for torn in path.parent.glob(f".{path.name}.{os.getpid()}.tmp"):
        torn.unlink(missing_ok=True)


def write_state_last(path: Path, state: dict[str, Any]) -> None:
    """The end state must land even on a full disk: through a rename if it can, else over the old record
    (whose blocks it reuses) in place."""
    try:
        write_json_atomic(path, state)
        return
    except OSError:
        _remove_torn(path)
    with open(path, "r+b") as handle:
        handle.write(json.dumps(state, sort_keys=True).encode())
        handle.truncate()

def main(directory: Path) -> int:
    """Run the job; a full disk before its stage started (its record or log not writable) ends it
    `failed` in one line naming what could not be written, never a traceback and a job left `running`."""
    supervisor = Supervisor(directory)
    try:
        return supervisor.run()
    except OSError as exc:
        if not disk.is_no_room(exc) or (supervisor.child is not None and supervisor.child.poll() is None):
            raise
        line = disk.failed_write("supervisor", exc, directory)
        state = read_mapping(directory / STATE)
        state.update(state=JobState.FAILED.value, exit_code=1, ended_at=time.time(), message=line)
        write_state_last(directory / STATE, state)
        supervisor._log_line(line)
        return 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
