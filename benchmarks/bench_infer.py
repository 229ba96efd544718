"""Speed of the infer stage's client, against plain clients driving the same server the same way.

The limit is what the server can do: the same prompts, at the same
concurrency and max_tokens, sent by a bare thread pool of `urllib` requests and
by the `openai` package. The infer stage also journals every answer durably
(fsync per batch) and counts progress; the ratio says how much of the limit it
keeps (aim: 0.9 or more). The server is a real ``transformers serve`` of the
tiny model on loopback; greedy decoding, so every client gets the same tokens.

The second part, `autotune`, drives a stand-in server whose throughput
saturates at a known concurrency and falls past it (`benchmarks/harness/saturating_server.py`)
with the stage at pinned concurrencies 4, the knee and 64, and at ``auto``;
each figure is the output tokens/s the server gave, as a ratio to its best.
The third, `multi_turn`, drives the same stand-in at ``auto`` with rows of five user turns
(each asked after the target's own earlier answers) against as many one-turn rows.

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

from remote.control_plane.progress import Progress
from remote.stages import StageContext
from remote.stages import infer
from benchmarks.harness.infer_servers import Server, build_tiny_model, make_prompts, stage_env, write_prep
from benchmarks.harness.saturating_server import SaturatingServer

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


def autotune(records: int = 800, knee: int = 16, per_request: float = 200.0, tokens: int = 100) -> dict[str, Any]:
    """Output tokens/s of the stage at pinned 4, the knee and 64, and at auto, against the saturating server.

    Each run is the whole stage over `records` prompts (ramp included); ``held`` is
    the second half of the run, once `auto` has found its level.
    """
    levels: list[int | str] = [4, knee, 64, "auto"]
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, SaturatingServer(knee, per_request, tokens) as server:
        for level in levels:
            data = Path(tempfile.mkdtemp(dir=tmp)) / "data" / "bench"
            write_prep(data, make_prompts(records))
            settings = {"server_url": server.url, "model": "stand-in", "concurrency": level, "max_concurrency": 256}
            progress = Progress()
            started = time.monotonic()
            infer.run_stage(StageContext.from_env(stage_env(data, settings)), progress)
            ended = time.monotonic()
            figures[str(level)] = {
                "tokens_per_s": round(server.tokens_per_s(started, ended), 1),
                "held_tokens_per_s": round(server.tokens_per_s((started + ended) / 2, ended), 1),
                "final_concurrency": progress.values["concurrency"],
            }
        best = server.best
    ratios = {f"{name}_to_best": round(f["tokens_per_s"] / best, 3) for name, f in figures.items()}
    return {
        "server": f"stand-in, best {best:.0f} tokens/s at concurrency {knee}, (knee/n)^0.5 past it",
        "records": records,
        "runs": figures,
        **ratios,
        "auto_held_to_best": round(figures["auto"]["held_tokens_per_s"] / best, 3),
        "auto_to_best_pinned": round(figures["auto"]["tokens_per_s"] / figures[str(knee)]["tokens_per_s"], 3),
    }


def multi_turn(rows: int = 160, turns: int = 5, knee: int = 16, per_request: float = 200.0,
               tokens: int = 100) -> dict[str, Any]:
    """Output tokens/s of the stage at `auto` over rows of `turns` user turns each (every turn asked after
    the target's own answers, one request at a time per row) against rows of one turn, as many requests
    in all, on the saturating stand-in: what regenerating whole conversations costs the server's rate."""
    single = make_prompts(rows * turns)
    chats = [{"id": f"c{i:04d}", "conversations": [{"role": "system", "content": "You are terse."}] + [
        {"role": "user", "content": f"question {k} of chat {i}"} for k in range(turns)]} for i in range(rows)]
    figures = {}
    with tempfile.TemporaryDirectory() as tmp, SaturatingServer(knee, per_request, tokens) as server:
        for name, prompts in (("one turn per row", single), (f"{turns} turns per row", chats)):
            data = Path(tempfile.mkdtemp(dir=tmp)) / "data" / "bench"
            write_prep(data, prompts)
            settings = {"server_url": server.url, "model": "stand-in", "concurrency": "auto", "max_concurrency": 256}
            started = time.monotonic()
            infer.run_stage(StageContext.from_env(stage_env(data, settings)), Progress())
            ended = time.monotonic()
            quarter = (ended - started) / 4
            figures[name] = {"tokens_per_s": round(server.tokens_per_s(started, ended), 1),
                             "middle_half_tokens_per_s": round(server.tokens_per_s(started + quarter, ended - quarter), 1)}
        best = server.best
    one, many = figures["one turn per row"], figures[f"{turns} turns per row"]
    return {"requests": rows * turns, "best": best, "runs": figures,
            "ratio": round(many["tokens_per_s"] / one["tokens_per_s"], 3),
            "middle_half_ratio": round(many["middle_half_tokens_per_s"] / one["middle_half_tokens_per_s"], 3)}


def run(records: int = 32, concurrency: int = 4, max_tokens: int = 16, rounds: int = 3) -> dict[str, Any]:
    """The client against plain clients on a real server, then `auto` against pinned levels on a stand-in."""
    return {**clients(records, concurrency, max_tokens, rounds), "autotune": autotune(), "multi_turn": multi_turn()}


def clients(records: int = 32, concurrency: int = 4, max_tokens: int = 16, rounds: int = 3) -> dict[str, Any]:
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
