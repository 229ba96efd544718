"""The serving engine's capture from the extract stage's side (``stages.extract.engine: sglang``).

`start` launches torchrun in the host's SpecForge environment (``stages.extract.specforge_python``,
``specforge_env``) with one `remote.eagle3.sglang_worker` per GPU (``tp_size``, default every GPU),
and waits until SGLang has loaded the target and said which decoder layers it captures for the
ids; those must be the layers `remote.eagle3.layer_ids` says, or the stage refuses. `Workers.fill`
then hands it one prep directory and output directory at a time and turns what rank 0 reports
into the stage's progress; the offline route sends one and closes, the chunked route
(`remote.orchestration.resident`) keeps the workers, and the loaded target, for every chunk.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError
from remote.eagle3.sglang_worker import TAG

WORKER = "remote.eagle3.sglang_worker"
#: Minutes SpecForge's process group waits for a collective: loading Kimi-K2.5 takes many.
TIMEOUT_MINUTES = 60


def tp_size(settings: Any) -> int:
    """``stages.extract.tp_size``, else every GPU the stage sees (one process on a host without any)."""
    if settings.tp_size:
        return settings.tp_size
    import torch

    return max(torch.cuda.device_count(), 1)


def command(python: str, nproc: int, spec: dict[str, Any]) -> list[str]:
    """torchrun (the SpecForge environment's own) of `nproc` workers, each in that environment's Python."""
    argv = shlex.split(python)
    if not argv:
        raise StageInputError("stages.extract.specforge_python is empty: give the SpecForge environment's python")
    return [*argv, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--no-python", *argv, "-m", WORKER, json.dumps(spec)]


def environment(extra: dict[str, str]) -> dict[str, str]:
    """The stage's environment with ``stages.extract.specforge_env`` over it; the release directory stays
    on PYTHONPATH, after the given one, so the workers import this aerie. A ``${NAME}`` in it (a secret, or a
    literal the workstation sealed) is filled in from this process's environment, where the secrets are held."""
    from remote.vocabulary import secrets
    from remote.eagle3 import StageInputError

    try:
        extra = secrets.expand_env(extra)
    except secrets.MissingSecret as exc:
        raise StageInputError(f"stages.extract.specforge_env: {exc}") from None
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    paths = [extra.get("PYTHONPATH", ""), os.getcwd(), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def worker_spec(checked: Any, nproc: int) -> dict[str, Any]:
    """What every worker is started with (`checked`: `remote.stages.extract.ExtractPlan`)."""
    settings = checked.settings
    return {"target": str(checked.shape.path), "dtype": settings.dtype, "trust_remote_code": checked.trust_remote_code,
            "layers": list(settings.layers), "shard_size": settings.shard_size, "batch_size": settings.batch_size,
            "tp_size": nproc, "sglang_args": dict(settings.sglang_args), "timeout_minutes": TIMEOUT_MINUTES}


class Workers:
    """The torchrun of the capture, with the target loaded; `fill` as often as wanted, then `close`."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        try:
            # NOTE: torchrun stays in the stage's process group, which a kill of the job ends; no death
            # signal against the stage: the kernel sends it when the *thread* that started the child
            # ends, and the chunked route starts the workers from a thread that ends after the load.
            # A stage killed alone closes the pipes: rank 0 reads the end of requests, or fails to write.
            self.process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        except OSError as exc:
            raise StageInputError(f"stages.extract.specforge_python {argv[0]!r} cannot be run ({exc.strerror}): give "
                                  "the python of the host's SpecForge environment (SpecForge 0.2.0, SGLang 0.5.14)") from None
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_event(self, progress: Any) -> dict[str, Any]:
        """The next event rank 0 sends; the log lines before it are passed on, and the job kept alive
        (`progress.beat`) while the workers load or compute."""
        while True:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                getattr(progress, "beat", lambda: None)()
                continue
            if line is None:
                code = self.process.wait()
                raise StageInputError(f"the SGLang capture (torchrun) ended with exit status {code} before it was done; "
                                      "its log is above")
            if not line.startswith(TAG):
                print(line, end="", flush=True)
                continue
            event = json.loads(line[len(TAG):])
            if event["event"] == "error":
                self.close()
                raise StageInputError(f"the SGLang capture failed: {event['message']}")
            return event

    def wait_ready(self, expected: list[int], progress: Any) -> list[int]:
        """Wait for the target to load; the decoder layers SGLang captures, refused unless `expected`."""
        event = self.next_event(progress)
        captured = event.get("captured")
        if captured != list(expected):
            self.close()
            raise StageInputError(f"SGLang captures the inputs of decoder layers {captured} for these ids, aerie expected "
                                  f"{list(expected)}: remote/eagle3/layer_ids.py is wrong for this target; see docs/hidden-states.md")
        return captured

    def fill(self, prep: Path, output: Path, progress: Any) -> dict[str, int]:
        """Fill `output`'s incomplete shards from `prep`'s records; the counts `extractor.fill` returns."""
        try:
            self.process.stdin.write(json.dumps({"prep": str(prep), "output": str(output)}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the workers are gone: next_event says how they ended
        while True:
            event = self.next_event(progress)
            kind = event["event"]
            if kind == "done":
                return event["counts"]
            if kind == "written":
                progress.written(event["n"])
            elif kind == "resumed":
                progress.resumed()
            elif kind == "skipped":
                progress.skipped(event["reason"], event["n"])
            elif kind == "note":
                progress.note(event["message"])

    def abort(self) -> None:
        """End the workers now, mid-request: torchrun passes SIGTERM on to them; killed after half a minute."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self) -> None:
        """End of requests: the workers end; killed if they do not within a minute."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def start(checked: Any, progress: Any) -> Workers:
    """The capture's workers with the target of `checked` loaded over ``tp_size`` GPUs."""
    settings = checked.settings
    nproc = tp_size(settings)
    progress.note(f"loading {checked.shape.path.name} in SGLang over {nproc} process(es) (tensor parallel)")
    workers = Workers(command(settings.specforge_python, nproc, worker_spec(checked, nproc)),
                      environment(settings.specforge_env))
    workers.wait_ready(checked.inputs, progress)
    return workers
