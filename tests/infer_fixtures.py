"""Shared pieces of the infer tests: the tiny model on disk, real and scripted servers, stage runs.

Nothing is downloaded: the model and tokenizer are built by `remote.tiny_model`
and `remote.tiny_tokenizer`, and every server listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.settings import complete
from tests.sshd import free_port

REPO = Path(__file__).resolve().parent.parent

def build_tiny_model(path: Path) -> Path:
    """The project's tiny random Llama and Kimi-style tokenizer, in one directory `path`."""
    from remote.tiny_model import build_model, tokenizer_vocab_size
    from remote.tiny_tokenizer import build_tokenizer

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
        from remote import server

        from remote import processes

        self.pid = server.start(serve_command(self.model_dir, self.port), self.log_path, offline_env())
        self.started = processes.identity(self.pid)
        server.wait_healthy(self.url, timeout=120, pid=self.pid, log_path=self.log_path)
        return self

    def stop(self) -> None:
        from remote import server

        if self.pid is not None:
            server.stop(self.started)
            self.pid = None


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def live_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tiny_model, tmp_path_factory.mktemp("server") / "server.log").start()
    yield server
    server.stop()


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


def subprocess_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AERIE_")}
    env.update(offline_env())
    # The conftest's guard lives on PYTHONPATH too: keep it, the repo first.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ScriptedServer:
    """A loopback HTTP server that records each request body and answers by a script.

    Used only where a real server cannot be made to misbehave on cue (a 500,
    a 429, a 400 for one record) or to read exactly what the client sent.
    `script(body, attempt)` returns ``(status, payload)``; `attempt` counts the
    requests seen so far for the same last user message.
    """

    def __init__(self, script: Any = None) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        from tests.json_http import JSONHandler

        self.script = script or (lambda body, attempt: (200, completion(f"answer to {last_user(body)}")))
        self.bodies: list[dict[str, Any]] = []
        self.attempts: dict[str, int] = {}
        self.routes: dict[str, Any] = {}
        self._lock = threading.Lock()
        outer = self

        class Handler(JSONHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.bodies.append(body)
                    key = last_user(body)
                    outer.attempts[key] = outer.attempts.get(key, 0) + 1
                    attempt = outer.attempts[key]
                status, payload = outer.script(body, attempt)
                self.send_json(status, payload, {"Retry-After": "0"} if status == 429 else None)

            def do_GET(self) -> None:  # noqa: N802
                if self.path in outer.routes:
                    self.send_json(200, outer.routes[self.path])
                else:
                    self.send_json(404, {"detail": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def asked_for(self) -> list[str]:
        """The last user message of every request, in arrival order."""
        return [last_user(body) for body in self.bodies]


def last_user(body: dict[str, Any]) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "user"][-1]


def completion(content: str, reasoning: str | None = None, finish_reason: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
