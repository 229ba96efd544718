"""A target as the host's checks read it: the demo's real tiny tokenizer beside a config.json of any depth and architecture."""

from __future__ import annotations

import json
from pathlib import Path


LLAMA = "LlamaForCausalLM"


def target_files(path: Path, num_layers: int = 4, arch: str = LLAMA) -> Path:
    """A target directory: the demo's real tiny tokenizer, and the config.json of a `num_layers`-layer `arch`."""
    from remote.demo.tiny_tokenizer import build_tokenizer

    if not (path / "tokenizer_config.json").exists():
        build_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "hidden_size": 64, "vocab_size": 785,
                                                  "num_hidden_layers": num_layers}))
    return path
