"""The infer stage's real parts, for the tests and the benchmarks: the tiny model on disk, its real
OpenAI-compatible server on loopback, and the files and environment of an infer run.

Nothing is downloaded: the model and tokenizer are built by `remote.demo.tiny_model` and `remote.demo.tiny_tokenizer`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.sshd import free_port
from benchmarks.harness.stage_settings import complete


def build_tiny_model(path: Path) -> Path:
    """The project's tiny random Llama and Kimi-style tokenizer, in one directory `path`."""
    from remote.demo.tiny_model import build_model, tokenizer_vocab_size
    from remote.demo.tiny_tokenizer import build_tokenizer

    build_tokenizer(path)
    return build_model(path, vocab_size=tokenizer_vocab_size(path))


def serve_command(model_dir: Path, port: int) -> str:
    """The launch command of a real OpenAI-compatible server for `model_dir` on loopback."""
    # NOTE: `-m` rather than the `transformers` script, which a host's PATH may lack.
    return (
        f"{sys.executable} -m transformers.cli.transformers serve {model_dir} "
        f"--host 127.0.0.1 --port {port} --device cpu --dtype float32 --log-level warning"
    )


def offline_env() -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "OMP_NUM_THREADS": "1"}


class Server:
    """A `transformers serve` process for the tiny model on a free loopback port."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.model_dir = model_dir
        self.log_path = log_path
        self.port = free_port()
        self.pid: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "Server":
        from remote.control_plane import inference_server

        from remote.control_plane import processes

        self.pid = inference_server.start(serve_command(self.model_dir, self.port), self.log_path, offline_env())
        self.started = processes.identity(self.pid)
        inference_server.wait_healthy(self.url, timeout=120, pid=self.pid, log_path=self.log_path)
        return self

    def stop(self) -> None:
        from remote.control_plane import inference_server

        if self.pid is not None:
            inference_server.stop(self.started)
            self.pid = None


def write_prep(data: Path, prompts: list[dict[str, Any]], release: str = "r1") -> None:
    """What a finished prep job leaves behind for infer."""
    prep = data / "prep"
    prep.mkdir(parents=True, exist_ok=True)
    (prep / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    (prep / "manifest.json").write_text(json.dumps({"release": release, "records": len(prompts)}))


def make_prompts(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"p{i:03d}",
            "conversations": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": f"hello world number {i}"},
            ],
        }
        for i in range(n)
    ]


def stage_env(data: Path, settings: dict[str, Any], progress: Path | None = None) -> dict[str, str]:
    """The environment the supervisor gives the infer stage (see `remote.stages`)."""
    output = data / "infer"
    output.mkdir(parents=True, exist_ok=True)
    env = {
        "AERIE_ROOT": str(data.parent),
        "AERIE_RELEASE": "r1",
        "AERIE_DATASET": data.name,
        "AERIE_STAGE": "infer",
        "AERIE_SOURCE": "",
        "AERIE_KIND": "prompts",
        "AERIE_OUTPUT": str(output),
        "AERIE_DATA": str(data),
        "AERIE_CONFIG": json.dumps({"dataset": {}, "stage": complete("infer", settings), "inventory": {}}),
    }
    if progress is not None:
        env["AERIE_PROGRESS"] = str(progress)
    return env
