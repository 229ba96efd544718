"""The GPU loads of one `inv run`: inference server starts and target loads, counted from the logs.

``run()`` takes the demo's wired tiny target, `transformers serve` of it as the managed
inference server, and ten datasets of the shipped samples (six native, four prompts), and runs
`inv deploy` and `inv run --follow` on the local backend, as a user types them. It counts, from the
pipeline's log and the jobs' logs:

- ``server_starts``: ``server: started`` lines of the runner;
- ``target_loads``: loads of the target's weights: an extract job's own (transformers' ``Loading
  weights`` in its log) and the runner's extract session's (``target: loaded`` in the pipeline's);

and the pipeline's wall seconds (the runner's start to its end, from its state). Run from another
checkout (``git archive`` of an earlier commit, with this file copied in) it gives the figures before.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NATIVE = ("sharegpt", "openthoughts", "ultrachat", "openai_tools", "agent_trajectory", "swe_agent")
PROMPTS = ("prompts_alpaca", "prompts_problem", "prompts_prompt", "prompts_question")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def inventory(bench: Any, target: Path, port: int) -> None:
    samples = REPO / "inventories" / "samples"
    stages = {
        "prep": {"max_length": 512},
        "infer": {"server_command": (f"{{python}} -m transformers.cli.transformers serve {target} --host 127.0.0.1 "
                                     f"--port {port} --device cpu --dtype float32 --log-level warning"),
                  "server_url": f"http://127.0.0.1:{port}/v1", "server_start_timeout": 300,
                  "server_env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
                  "model": str(target), "concurrency": 4, "max_tokens": 8, "temperature": 0},
        "extract": {"layers": [0, 1, 2], "dtype": "float32", "route": "offline"},
        "train": {"draft_vocab_size": 256, "epochs": 1, "ttt_steps": 3},
    }
    datasets = {name: {"source": str(samples / f"{name}.jsonl"), "kind": "prompts" if name in PROMPTS else "native",
                       "sample": str(samples / f"{name}.jsonl")} for name in (*NATIVE, *PROMPTS)}
    bench.host_settings["env"] = {"OMP_NUM_THREADS": "1"}
    bench.inventory(datasets, stages, target={"tokenizer": str(target), "model": str(target)})


def count(root: Path) -> dict[str, Any]:
    jobs = root / "jobs"
    pipeline = (jobs / "pipeline" / "run" / "log").read_text(errors="replace")
    extracts = [p.read_text(errors="replace") for p in jobs.glob("*/extract/log")]
    runner = json.loads((jobs / "pipeline" / "run" / "state.json").read_text())
    states = {f"{p.parent.parent.name}/{p.parent.name}": json.loads(p.read_text())["state"] for p in jobs.glob("*/*/state.json")}
    return {"server_starts": pipeline.count("server: started"),
            # a load of its own in an extract job's log, or one of the runner's extract session
            "target_loads": sum("Loading weights" in log for log in extracts) + pipeline.count("target: loaded"),
            "wall_seconds": round(runner["ended_at"] - runner["started_at"], 1),
            "succeeded": sum(state == "succeeded" for state in states.values()), "jobs": len(states)}


def run() -> dict[str, Any]:
    from benchmarks.harness.checkout import Bench, copy_checkout
    from remote.demo import tiny_model
    from remote.demo.tiny_tokenizer import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(os.environ.get("AERIE_BENCH_KEEP") or tmp)  # a directory to keep, to read the logs after
        target = base / "target"
        build_tokenizer(target)
        tiny_model.main([str(target), "--tokenizer", str(target), "--recite", tiny_model.DEMO_RECITAL])
        bench = Bench(copy_checkout(base / "checkout"), base / "root", "local")
        inventory(bench, target, free_port())
        bench.inv("deploy", timeout=300)
        bench.inv("run", "--follow", check=False, timeout=1800)
        return {"datasets": len(NATIVE) + len(PROMPTS), "prompts": len(PROMPTS), **count(bench.root)}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
    sys.exit(0)
