"""One load of the target for every extract job of a pipeline: the extract phase's session.

The pipeline runner (`remote.orchestration.runner`) starts it once, when the first extract job of
its run is to start, and stops it once no extract job of the run is left. It loads the target on
the first dataset's request and keeps it (`remote.orchestration.resident.Extractor`, as the
chunked route keeps it for every chunk: one transformers model for engine ``hf``, the capture's
torchrun workers for engine ``sglang``) and extracts dataset after dataset with it.

Each dataset's extract job still runs under its own supervisor, with its own state, log, progress
and output: its stage (`remote.stages.extract`) finds the session's record (`layout.extract_session`),
sends its context over the session's socket and turns the Progress calls that come back into its own;
the shards and manifest it ends with are those it would have written alone. A stage that finds no
session (none started, or one that has ended) loads the target itself, as before. The stage's side
is `remote.stages.extract.in_session`.

The socket is an abstract Unix socket (Linux): no path to outgrow `sun_path` or to leave behind.
One request at a time: the runner starts one GPU job at a time.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from remote.vocabulary import layout
from remote.control_plane import collector
from remote.control_plane.progress import write_json_atomic
from remote.eagle3 import StageInputError
from remote.stages import StageContext

#: The Progress calls a stage makes that travel back to it (`Remote`), each a JSON line.
CALLS = ("written", "skipped", "resumed", "metrics", "note", "expect", "beat")
#: The session's address (an abstract Unix socket's name), under this prefix.
ADDRESS = "aerie-extract"


def from_fields(fields: dict[str, Any]) -> StageContext:
    """The stage's context, from what it sent (`remote.stages.extract.in_session`)."""
    return StageContext(**{**fields, **{k: Path(fields[k]) for k in ("root", "output", "data")}})


class Remote:
    """The requesting stage's progress, as seen from the session: each call sent back as a line."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def __getattr__(self, name: str) -> Any:
        if name not in CALLS:
            raise AttributeError(name)
        return lambda *args, **kwargs: self.send({"call": name, "args": args, "kwargs": kwargs})

    def send(self, message: dict[str, Any]) -> None:
        self.stream.write((json.dumps(message) + "\n").encode())
        self.stream.flush()


class Session:
    """The loaded target and the datasets it served."""

    def __init__(self) -> None:
        self.extractor: Any = None
        self.key: Any = None
        self.served: list[str] = []
        self.busy = False  # a request is being served: a stop ends the engine mid-request

    def extract(self, ctx: StageContext, progress: Any) -> dict[str, Any]:
        from remote.orchestration import resident

        key = load_key(ctx)
        if self.extractor is not None and key != self.key:
            self.close()  # another target or engine: this load serves no more
        if self.extractor is None:
            self.extractor, self.key = resident.Extractor(ctx, ctx.stage_config), key
        loads, self.busy = self.extractor.loads, True
        manifest = self.extractor.run_stage(ctx, progress)
        self.busy = False  # NOTE: not on the way out of a stop or a failure: `close` must abort the engine then
        if self.extractor.loads > loads:
            print(f"target: loaded {Path(key[0]).name} (engine {key[1]}) for {ctx.dataset}", flush=True)
        self.served.append(ctx.dataset)
        return manifest

    def close(self, abort: bool = False) -> None:
        """Let the target go; `abort`: now, even mid-request (a stage that has ended must not have its output
        written on behind it)."""
        if self.extractor is not None:
            self.extractor.close(abort or self.busy)
            print(f"target: one load served {len(self.served)} dataset(s): {', '.join(self.served) or 'none'}", flush=True)
        self.extractor, self.served, self.busy = None, [], False


def load_key(ctx: StageContext) -> tuple[Any, ...]:
    """What a load depends on: a request that differs in any of these needs a load of its own."""
    settings, target = ctx.stage_config, ctx.shared_config.get("target") or {}
    return (str(target.get("model")), settings.get("engine") or "hf", settings.get("dtype"),
            bool(target.get("trust_remote_code")), json.dumps(settings.get("layers")), settings.get("tp_size"),
            json.dumps(settings.get("sglang_args"), sort_keys=True), settings.get("specforge_python"))


def answer(session: Session, connection: socket.socket) -> None:
    """One request: a stage's context in, its Progress calls and then its manifest (or its error) out."""
    with connection, connection.makefile("rwb") as stream:
        line = stream.readline()
        if not line:
            return
        remote = Remote(stream)
        try:
            manifest = session.extract(from_fields(json.loads(line)), remote)
        except StageInputError as exc:
            remote.send({"refusal": str(exc)})
            return
        except (BrokenPipeError, ConnectionResetError):
            print(f"target: the stage of {json.loads(line).get('dataset')} ended before its extraction did", flush=True)
            session.close(abort=True)  # NOTE: the engine may be mid-request (the capture's workers)
            return
        except Exception as exc:  # noqa: BLE001 — the stage fails with it; the session serves the next
            import traceback

            traceback.print_exc()
            session.close(abort=True)
            remote.send({"error": f"{type(exc).__name__}: {exc}"})
            return
        remote.send({"done": manifest})


def serve(root: Path) -> None:
    """Listen, record where, and answer requests until SIGTERM (the runner's stop)."""
    address = f"\0{ADDRESS}-{os.getpid()}-{secrets.token_hex(4)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(4)
    session = Session()
    record = layout.extract_session(root)
    write_json_atomic(record, {"pid": os.getpid(), "address": address[1:], "started_at": time.time()})
    try:
        while True:
            connection, _ = listener.accept()
            answer(session, connection)
    finally:
        session.close(abort=session.busy)
        listener.close()


def _on_term(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


def main(argv: list[str]) -> int:
    collector.tune()
    signal.signal(signal.SIGTERM, _on_term)
    serve(Path(argv[0]))
    return 0


# -- the runner's side -----------------------------------------------------------


def serves(node: dict[str, Any]) -> bool:
    """Whether the plan's job runs the built-in extract stage, the one that asks the session: a configured
    ``stages.extract.command`` is the user's own code, run as it is."""
    from remote.control_plane.stage_contract import DEFAULT_COMMANDS

    spec = node["spec"]
    return spec["stage"] == "extract" and spec.get("command") in (None, "", DEFAULT_COMMANDS["extract"])


class Handle:
    """The session as the runner starts and stops it: a process of its own, ended with the runner
    (it holds the GPUs: a killed runner must not leave the target loaded)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.process: Any = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout: float = 60.0) -> int | None:
        """Start the session unless it runs; the pid started, if one was."""
        import subprocess

        from remote.control_plane.processes import die_with_parent

        if self.process is not None and self.process.poll() is None:
            return None
        record = layout.extract_session(self.root)
        record.unlink(missing_ok=True)  # a session of an ended runner ended with it
        self.process = subprocess.Popen([sys.executable, "-m", "remote.orchestration.extract_session", str(self.root)],
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=die_with_parent(os.getpid(), signal.SIGTERM))
        deadline = time.monotonic() + timeout
        while not record.exists() and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until it listens: a stage started before would load the target itself
        return self.process.pid

    def stop(self, grace: float = 120.0) -> int | None:
        """End the session (the target let go, the datasets it served said in the log); the pid stopped."""
        import subprocess

        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        layout.extract_session(self.root).unlink(missing_ok=True)
        return process.pid


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
