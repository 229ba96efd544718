"""The demo's inventory (inventories/local.yaml) with a test's own root, model and port."""

from __future__ import annotations

from pathlib import Path

import yaml

from benchmarks.harness.checkout import REPO, Bench


SAMPLES = REPO / "inventories" / "samples"


DATASETS = {"chat": ("sharegpt.jsonl", "native"), "asks": ("prompts_alpaca.jsonl", "prompts")}


DEMO = yaml.safe_load((REPO / "inventories" / "local.yaml").read_text())
#: What the demo trains its draft with, and its host's environment (one torch thread per job).
DEMO_TRAIN, DEMO_ENV = DEMO["stages"]["train"], DEMO["host"]["env"]


def demo_inventory(bench: Bench, model: Path, port: int) -> None:
    """Like inventories/local.yaml, with the test's own root, model and port, and less work."""
    stages = {
        "prep": {"max_length": 512},
        "infer": {
            "server_command": (f"{{python}} -m transformers.cli.transformers serve {model} --host 127.0.0.1 "
                               f"--port {port} --device cpu --dtype float32 --log-level warning"),
            "server_url": f"http://127.0.0.1:{port}/v1",
            "server_env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
            "server_start_timeout": 240,
            "model": str(model),
            "concurrency": 4,
            "max_tokens": 24,
            "temperature": 0,
        },
        "extract": {"layers": [0, 1, 2], "dtype": "float32"},
        "train": DEMO_TRAIN,
    }
    datasets = {name: {"source": str(SAMPLES / file), "kind": kind, "sample": str(SAMPLES / file)}
                for name, (file, kind) in DATASETS.items()}
    bench.host_settings["env"] = DEMO_ENV
    bench.inventory(datasets, stages, target={"tokenizer": str(model), "model": str(model)})
