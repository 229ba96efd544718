"""The inference server that the infer stage talks to: start it, wait for it, stop it, ask it.

The launch command is a string from the inventory (SGLang's
``python -m sglang.launch_server ...`` on the GPU host, ``transformers serve``
for the demo). The server runs in its own session, so `stop` ends its whole
process group: SGLang forks scheduler and detokenizer processes that a plain
kill of the parent would leave holding the GPUs.

`server_info` and `check_server_config` serve ``inv check``: the last round ran
``--speculative-algorithm EAGLE`` with an EAGLE-3 draft, which fed the draft
one 7168-wide final-layer state instead of three concatenated auxiliary layers.

Standard library only: the host's Python may have nothing else installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from remote.control_plane import processes
from remote.eagle3 import StageInputError
from remote.eagle3 import layer_ids
from remote.control_plane.jobs import tail
from remote.control_plane.progress import write_json_atomic


class ServerError(Exception):
    """The server did not start, did not answer, or could not be asked."""


def start(command: str, log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start `command` detached in its own session, output appended to `log_path`; return its pid.

    `env` is laid over the current environment. The pid is also the process
    group id, which is what `stop` signals.
    """
    if not command.strip():
        raise ServerError("inference server launch command is empty: set it in the inventory")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return process.pid


def base_url(url: str) -> str:
    """The server's root: ``http://h:p/v1`` and ``http://h:p/`` both give ``http://h:p``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def is_healthy(url: str, timeout: float = 5.0) -> bool:
    """True when ``/health`` answers 200, or, on servers without it, ``/v1/models`` does."""
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
                 beat: Callable[[], None] = lambda: None) -> None:
    """Block until the server at `url` is healthy; raise `ServerError` after `timeout` seconds.

    With `pid`, a server that exits while starting fails at once, with the last
    line of `log_path` in the message, instead of after the whole timeout. `beat`
    is called while waiting, so that a long model load is not taken for a stall.
    """
    deadline = time.monotonic() + timeout
    where = f" (log: {log_path})" if log_path is not None else ""
    while True:
        if is_healthy(url, timeout=min(5.0, timeout)):
            return
        if pid is not None and not is_running(pid):
            raise ServerError(f"inference server (pid {pid}) exited while starting: {_last_line(log_path)}{where}")
        if time.monotonic() >= deadline:
            raise ServerError(f"inference server at {url} not healthy after {timeout:.0f}s: {_last_line(log_path)}{where}")
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


def server_info(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The server's own configuration (SGLang: its ServerArgs), plus the draft's config when readable.

    SGLang answers ``/server_info`` (newer) or ``/get_server_info`` (older,
    kept as an alias). The draft's ``config.json`` is read from
    ``speculative_draft_model_path`` when that is a directory here, which is
    the case for ``inv check`` running on the GPU host; it carries the
    auxiliary layer ids that ServerArgs does not.
    """
    root = base_url(url)
    info = None
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(root + path, timeout=timeout) as response:
                info = json.loads(response.read())
                break
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise ServerError(f"{root}{path} answered HTTP {exc.code}") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ServerError(f"cannot read {root}{path}: {exc}") from None
    if info is None:
        raise ServerError(f"{root} has no /server_info or /get_server_info: not an SGLang server?")
    for key, path_key in (("draft_config", "speculative_draft_model_path"), ("target_config", "model_path")):
        config = _read_config(info.get(path_key))
        if config is not None:
            info[key] = config
    return info


def check_server_config(info: dict[str, Any], layers: list[int]) -> list[str]:
    """Problems in a server's configuration for serving an EAGLE-3 draft fed from `layers`.

    `layers` are auxiliary layer ids as the draft's config gives them to SGLang
    (``eagle_config.eagle_aux_hidden_state_layer_ids``). What an id captures
    depends on the target's architecture (`remote.eagle3.layer_ids`), so the
    server's draft and the extraction are compared by the decoder layers whose
    inputs they capture: a draft with no ids, or other ids, may still read the
    same states, and the same ids on another architecture may not.
    """
    algorithm = (info.get("speculative_algorithm") or "").upper()
    draft_path = info.get("speculative_draft_model_path")
    draft = info.get("draft_config") or {}
    problems = []
    if not algorithm:
        return problems
    if algorithm == "EAGLE" and (_is_eagle3_draft(draft) or not draft):
        problems.append(
            "server runs --speculative-algorithm EAGLE but the draft is EAGLE-3: the draft gets the final hidden "
            "state instead of the concatenated auxiliary layers; relaunch with --speculative-algorithm EAGLE3"
        )
    if algorithm == "EAGLE3":
        if not draft_path:
            problems.append("server runs EAGLE3 without --speculative-draft-model-path")
        problems += _layer_problems(info, layers)
    return problems


def _layer_problems(info: dict[str, Any], layers: list[int]) -> list[str]:
    """The server's draft against the extraction: what each captures, where the target's architecture is known."""
    served = aux_layers(info)
    arch = _target_architecture(info)
    if served is None:
        return []
    if arch is None:
        if list(served) == list(layers):
            return []
        return [f"server's draft uses auxiliary layers {list(served)} but extraction uses {list(layers)}: "
                "set eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json or stages.extract.layers"]
    try:
        wanted = layer_ids.captured(list(layers), arch)
        got = layer_ids.captured(list(served), arch) if _draft_ids(info) else server_captures(info)
    except StageInputError as exc:
        return [f"cannot compare the draft's layers with the extraction's: {exc}"]
    if got == wanted:
        return []
    return [f"server's draft uses auxiliary layers {list(served)} but extraction uses {list(layers)}: on {arch} SGLang "
            f"feeds the draft the inputs of decoder layers {got}, extract stored those of {wanted}; "
            "set eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json or stages.extract.layers"]


def aux_layers(info: dict[str, Any]) -> list[int] | None:
    """The auxiliary layer ids the server's EAGLE-3 draft reads, or None when they cannot be known.

    The draft's ``eagle_config`` wins (SGLang reads the ids nowhere else). A
    draft without them makes SGLang capture the inputs of layers ``[2, N // 2,
    N - 3]`` of an ``N``-layer target, whatever its architecture; those are
    given here as the ids that capture them on that target (for Llama
    ``[1, N // 2 - 1, N - 4]``, for DeepSeek/Kimi ``[2, N // 2, N - 3]``).
    """
    ids = _draft_ids(info)
    if ids:
        return ids
    captures = server_captures(info)
    if captures is None:
        return None
    arch = _target_architecture(info)
    shift = arch is not None and layer_ids.RULES.get(arch) == layer_ids.DEEPSEEK
    return captures if shift else [j - 1 for j in captures]


def server_captures(info: dict[str, Any]) -> list[int] | None:
    """The decoder layers whose inputs SGLang captures for a draft without ids, or None when unknown."""
    if not info.get("draft_config"):
        return None
    target = info.get("target_config") or {}
    n = (target.get("text_config") or target).get("num_hidden_layers")
    return [2, n // 2, n - 3] if n else None


def _draft_ids(info: dict[str, Any]) -> list[int] | None:
    draft = info.get("draft_config") or {}
    ids = (draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else None


def _target_architecture(info: dict[str, Any]) -> str | None:
    """The served target's architecture when its config is readable here and aerie has checked it."""
    names = (info.get("target_config") or {}).get("architectures") or []
    return names[0] if names and names[0] in layer_ids.RULES else None


def _is_eagle3_draft(draft: dict[str, Any]) -> bool:
    architectures = " ".join(draft.get("architectures") or [])
    return "eagle3" in architectures.lower() or "eagle_config" in draft


def _read_config(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _last_line(log_path: Path | None) -> str:
    if log_path is None:
        return "(no log)"
    if not log_path.is_file():
        return f"(no log at {log_path})"
    lines = [line for line in tail(log_path).splitlines() if line.strip()]  # a server's log can be long
    return lines[-1][:300] if lines else f"(empty log {log_path})"


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
        pid = start(self.settings["command"].replace("{python}", python), self.log, env=self.settings.get("env") or {})
        self.started = processes.identity(pid)
        if self.record is not None:
            write_json_atomic(self.record, self.started)
        wait_healthy(self.settings["url"], self.settings.get("start_timeout", 1800), pid, self.log)
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
