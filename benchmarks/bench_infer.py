"""Speed of the infer stage's client, against plain clients driving the same server the same way.

The limit is what the server can do: the same prompts, at the same
concurrency and max_tokens, sent by a bare thread pool of `urllib` requests and
by the `openai` package. The infer stage also journals every answer durably
(fsync per batch) and counts progress; the ratio says how much of the limit it
keeps (aim: 0.9 or more). The server is a real ``transformers serve`` of the
tiny model on loopback; greedy decoding, so every client gets the same tokens.

Usage: ``python -m benchmarks.bench_infer`` (prints JSON), or ``run()`` from `inv bench`.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from remote.progress import Progress
from remote.stages import StageContext
from remote.stages import infer
from tests.infer_fixtures import Server, build_tiny_model, make_prompts, stage_env, write_prep

#: Every client asks for the same sampling, so the server does the same work for each.
SAMPLING = {"temperature": 0.7, "top_p": 1.0}


def urllib_client(url: str, model: str, prompts: list[dict[str, Any]], concurrency: int, max_tokens: int) -> int:
    """A bare thread pool of urllib requests; returns the completion tokens received."""

    def one(prompt: dict[str, Any]) -> int:
        body = {"model": model, "messages": prompt["conversations"], "max_tokens": max_tokens, **SAMPLING}
        request = urllib.request.Request(
            url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())["usage"]["completion_tokens"]

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, prompts))


def openai_client(url: str, model: str, prompts: list[dict[str, Any]], concurrency: int, max_tokens: int) -> int:
    """The `openai` package's client, shared by a thread pool; returns the completion tokens received."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="none", max_retries=0)

    def one(prompt: dict[str, Any]) -> int:
        reply = client.chat.completions.create(
            model=model, messages=prompt["conversations"], max_tokens=max_tokens, **SAMPLING
        )
        return reply.usage.completion_tokens

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, prompts))


def aerie_stage(root: Path, url: str, model: str, prompts: list[dict[str, Any]], concurrency: int, max_tokens: int) -> int:
    """The whole infer stage over a fresh data directory; returns the completion tokens it recorded."""
    data = Path(tempfile.mkdtemp(dir=root)) / "data" / "bench"
    write_prep(data, prompts)
    settings = {"server_url": url, "model": model, "concurrency": concurrency, "max_tokens": max_tokens, **SAMPLING}
    progress = Progress()
    infer.run_stage(StageContext.from_env(stage_env(data, settings)), progress)
    return int(progress.values["completion_tokens"])


def timed(client: Callable[..., int], *args: Any) -> tuple[float, int]:
    started = time.perf_counter()
    tokens = client(*args)
    return time.perf_counter() - started, tokens


def run(records: int = 32, concurrency: int = 4, max_tokens: int = 16, rounds: int = 3) -> dict[str, Any]:
    """Prompts/s of each client (median of `rounds`, interleaved) and the stage's ratio to each plain one."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_tiny_model(root / "model")
        server = Server(model, root / "server.log").start()
        try:
            prompts = make_prompts(records)
            args = (server.url, str(model), prompts, concurrency, max_tokens)
            urllib_client(server.url, str(model), prompts[:concurrency], concurrency, max_tokens)  # warm up
            clients = {"aerie": lambda *a: aerie_stage(root, *a), "urllib": urllib_client, "openai": openai_client}
            seconds: dict[str, list[float]] = {name: [] for name in clients}
            tokens: dict[str, int] = {}
            for _ in range(rounds):
                for name, client in clients.items():
                    elapsed, tokens[name] = timed(client, *args)
                    seconds[name].append(elapsed)
        finally:
            server.stop()
    rate = {name: records / statistics.median(times) for name, times in seconds.items()}
    return {
        "server": "transformers serve (tiny Llama, CPU, loopback)",
        "records": records,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "rounds": rounds,
        "prompts_per_s": {name: round(r, 2) for name, r in rate.items()},
        "completion_tokens": tokens,
        "ratio_to_urllib": round(rate["aerie"] / rate["urllib"], 3),
        "ratio_to_openai": round(rate["aerie"] / rate["openai"], 3),
    }


if __name__ == "__main__":
    json.dump(run(), sys.stdout, indent=2)
    print()
