"""The infer tests' fixtures over `benchmarks.harness.infer_servers`, and their scripted server; every
server listens on 127.0.0.1."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.infer_servers import (  # noqa: F401 (the infer tests import them from here too)
    Server, build_tiny_model, make_prompts, offline_env, stage_env, write_prep,
)
from tests.helpers.session import built_once

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(request, lambda: build_tiny_model(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """`transformers serve` of the tiny model, started once a session and stopped as it ends."""
    return built_once(request, lambda: Server(tiny_model, tmp_path_factory.mktemp("server") / "server.log").start(),
                      stop=Server.stop)


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

        from benchmarks.harness.json_http import JSONHandler

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


def echo_target(body: dict[str, Any], attempt: int = 1) -> tuple[int, Any]:
    """A target that answers deterministically from what it is asked, so a test can tell what it saw.

    The answer to the conversation's n-th request is ``answer n to <last user text>`` with reasoning
    ``thinking n``, or after tool results ``answer n: the tool said <their text>``. A user text
    ``call NAME {json}`` (with tools declared) is answered by that call alone; one holding ``[long]`` is
    cut at max_tokens (``finish_reason: length``)."""
    messages = body["messages"]
    n = sum(m["role"] == "assistant" for m in messages) + 1
    last = messages[-1]
    if last["role"] == "tool":
        said = " + ".join(m["content"] for m in reversed(_tail(messages, "tool")))
        return 200, completion(f"answer {n}: the tool said {said}", reasoning=f"thinking {n}")
    text = last_user(body)
    if text.startswith("call ") and body.get("tools"):
        name, arguments = text[len("call "):].split(" ", 1)
        call = {"id": f"srv_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}
        payload = completion("", reasoning=f"thinking {n}", finish_reason="tool_calls")
        payload["choices"][0]["message"]["tool_calls"] = [call]
        return 200, payload
    finish = "length" if "[long]" in text else "stop"
    return 200, completion(f"answer {n} to {text}", reasoning=f"thinking {n}", finish_reason=finish)


def _tail(messages: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    out = []
    for message in reversed(messages):
        if message["role"] != role:
            break
        out.append(message)
    return out
