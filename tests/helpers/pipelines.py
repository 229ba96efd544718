"""`inv run` over the scripted stage: the inventory every stage of which is benchmarks/harness/scripted_stage.py,
the plans' traces, and the wait for the pipeline's end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.harness.checkout import SCRIPTED, Bench


def pipeline_inventory(bench: Bench, plans: Path, port: int, kinds: dict[str, str]) -> None:
    """Every stage runs the scripted stage; the managed "server" is Python's http.server on `port`."""
    plans.mkdir(exist_ok=True)
    (plans / "health").write_text("ok")
    command = f"{{python}} {SCRIPTED} {plans}"
    stages = {name: {"command": command} for name in ("prep", "extract", "train")}
    stages["infer"] = {
        "command": command,
        "server_command": f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {plans}",
        "server_url": f"http://127.0.0.1:{port}/v1",
        "server_start_timeout": 30,
    }
    bench.inventory({name: {"source": f"{name}.data", "kind": kind} for name, kind in kinds.items()}, stages)


def traces(plans: Path) -> dict[str, dict[str, float]]:
    return {p.stem: json.loads(p.read_text()) for p in (plans / "trace").glob("*.json")}


def wait_pipeline(bench: Bench, timeout: float = 90) -> dict[str, dict]:
    bench.wait_state("pipeline/run", {"succeeded", "failed", "died", "stopped"}, timeout=timeout)
    return bench.poll()
