"""What `inv plan` reads on the host, at Kimi-K2.5's shape: the target's config.json, prep's manifests, a plan request."""

from __future__ import annotations

import json
from pathlib import Path


KIMI_TEXT = {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}


KIMI_BYTES_PER_TOKEN = (3 + 1) * 7168 * 2  # 57,344: three aux layers and the final state, bfloat16


def kimi_config(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                  "model_type": "kimi_k25", "text_config": KIMI_TEXT}))
    return path


def prep_manifest(root: Path, dataset: str, kept: int, tokens: int, stage: str = "prep") -> None:
    directory = root / "data" / dataset / stage
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {"kept": kept, "release": "r", "tokens": {"total": tokens, "max": 4096}}
    (directory / "manifest.json").write_text(json.dumps(manifest))


def request(root: Path, model: Path, datasets: list[dict], **extra) -> dict:
    return {"root": str(root), "model": str(model), "layers": [2, 30, 58], "dtype": "bfloat16",
            "datasets": datasets, "engine": "aerie", "route": "auto", **extra}
