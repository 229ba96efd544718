"""A stand-in OpenAI-compatible server whose throughput saturates at a known concurrency.

It answers chat completions on loopback the way a batching server behaves
under load: the requests in flight share an output rate of ``rate(n)``
tokens/s, which grows linearly up to `knee` requests and falls past it as
``(knee / n) ** decay`` (a real server preempts and recomputes). Each answer
has `tokens` completion tokens, so the best any client can get is
``rate(knee)`` tokens/s, and the server counts what it served to say what a
client actually got. Standard library only; used by the infer tests and
`benchmarks/bench_infer.py`.
"""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from benchmarks.harness.json_http import JSONHandler

TICK = 0.005  # seconds between two decode steps of the engine


class SaturatingServer:
    def __init__(self, knee: int = 16, per_request: float = 100.0, tokens: int = 100, decay: float = 0.5) -> None:
        self.knee, self.per_request, self.tokens, self.decay = knee, per_request, tokens, decay
        self.active: list[dict[str, Any]] = []
        self.served: list[tuple[float, int]] = []  # (when, tokens) of each answer sent
        self._lock = threading.Lock()
        self._running = True
        outer = self

        class Handler(JSONHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.decode()
                self.send_json(200, {
                    "id": "x", "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 8},
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": outer.tokens},
                })

            def do_GET(self) -> None:  # noqa: N802
                self.send_json(200, {"object": "list", "data": [{"id": "stand-in"}]})

        ThreadingHTTPServer.request_queue_size = 512  # 256 clients may connect at once
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._threads = [threading.Thread(target=self.httpd.serve_forever, daemon=True),
                         threading.Thread(target=self._engine, daemon=True)]

    def rate(self, n: int) -> float:
        """Tokens/s in all with `n` requests in flight."""
        if n <= self.knee:
            return self.per_request * n
        return self.per_request * self.knee * (self.knee / n) ** self.decay

    @property
    def best(self) -> float:
        return self.rate(self.knee)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def decode(self) -> None:
        """Wait until the engine has produced this request's tokens."""
        request = {"left": float(self.tokens), "done": threading.Event()}
        with self._lock:
            self.active.append(request)
        request["done"].wait()

    def _engine(self) -> None:
        last = time.monotonic()
        while self._running:
            time.sleep(TICK)
            now = time.monotonic()
            with self._lock:
                if self.active:
                    each = self.rate(len(self.active)) / len(self.active) * (now - last)
                    for request in self.active:
                        request["left"] -= each
                    for request in [r for r in self.active if r["left"] <= 0]:
                        self.active.remove(request)
                        self.served.append((now, self.tokens))
                        request["done"].set()
            last = now

    def tokens_per_s(self, since: float, until: float | None = None) -> float:
        """What clients got between two `time.monotonic()` readings."""
        until = until or time.monotonic()
        with self._lock:
            tokens = sum(t for at, t in self.served if since <= at <= until)
        return tokens / (until - since)

    def __enter__(self) -> "SaturatingServer":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._running = False
        self.httpd.shutdown()
        self.httpd.server_close()
