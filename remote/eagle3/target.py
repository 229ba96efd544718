"""The target model: where it is, its shape, and the two weights the draft borrows.

The shape comes from ``config.json`` alone, so the width check runs before any
weights are read. The draft needs only the input embeddings (a frozen copy)
and the lm_head (to turn stored final hidden states into the target's token
distribution); both are read straight from the safetensors files, never by
loading the whole target (a trillion parameters for Kimi-K2.5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError, model_config
from remote.eagle3.model_config import ModelConfig

EMBED_SUFFIX = "embed_tokens.weight"
LM_HEAD_SUFFIX = "lm_head.weight"
#: Where a multimodal wrapper (Kimi-K2.5) keeps its language model's weights.
LANGUAGE_PREFIX = "language_model."
#: The setting that names the target's directory.
TARGET = "target.model"
#: What a target's config must give: its width, depth and vocabulary.
SHAPE = ("hidden_size", "num_hidden_layers", "vocab_size")


@dataclass(frozen=True)
class TargetShape:
    """What the extraction and the draft need to know about the target."""

    path: Path
    hidden_size: int
    num_layers: int
    vocab_size: int
    tie_word_embeddings: bool


def target_settings(shared: dict[str, Any]) -> tuple[Path, bool]:
    """The target's directory (relative paths from the release directory) and trust_remote_code."""
    target = shared.get("target") or {}
    model = target.get("model")
    if not model:
        raise StageInputError("target.model is not set in the inventory: give the target model's directory on the host")
    return model_config.directory(model, TARGET), bool(target.get("trust_remote_code", False))


def read_target(path: Path) -> ModelConfig:
    """The target's config.json (`remote.eagle3.model_config`), refused unless it has a causal LM's shape."""
    return model_config.read(path, TARGET).require(*SHAPE)


def draft_base(config: ModelConfig) -> dict[str, Any]:
    """The target's (text) config as a dict, with the wrapper's ``tie_word_embeddings``: what a new draft is built from."""
    return {**config.text, "tie_word_embeddings": config.tie_word_embeddings}


def quantization_config(path: Path) -> dict[str, Any] | None:
    """The target's quantization config (`ModelConfig.quantization`)."""
    return model_config.read(path, TARGET).quantization


def shape_of(config: ModelConfig) -> TargetShape:
    """The target's shape, from its config alone (no weights)."""
    config.require(*SHAPE)
    return TargetShape(path=config.directory, hidden_size=config.hidden_size, num_layers=config.num_layers,
                       vocab_size=config.vocab_size, tie_word_embeddings=config.tie_word_embeddings)


def read_shape(path: Path) -> TargetShape:
    """The shape of the target in `path` (`shape_of` its config)."""
    return shape_of(read_target(path))


def read_tensor(path: Path, suffix: str):
    """The one tensor whose name ends in `suffix`, read from the model's safetensors files."""
    from safetensors import safe_open

    files = _weight_files(path)
    for file, names in files.items():
        for name in names:
            # NOTE: the suffix test also skips vision towers' embeddings in
            # multimodal targets, whose names end differently.
            if name.endswith(suffix) and "vision" not in name:
                with safe_open(str(path / file), framework="pt") as handle:
                    return handle.get_tensor(name)
    return None


def read_embed_and_head(shape: TargetShape):
    """(embed_tokens, lm_head) of the target; the lm_head is the embedding when they are tied."""
    embed = read_tensor(shape.path, EMBED_SUFFIX)
    if embed is None:
        raise StageInputError(f"no *{EMBED_SUFFIX} in the safetensors files of {shape.path}")
    head = None if shape.tie_word_embeddings else read_tensor(shape.path, LM_HEAD_SUFFIX)
    return embed, embed if head is None else head


def _weight_files(path: Path) -> dict[str, list[str]]:
    """safetensors file -> tensor names, from the index when there is one."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        by_file: dict[str, list[str]] = {}
        for name, file in json.loads(index.read_text())["weight_map"].items():
            by_file.setdefault(file, []).append(name)
        return by_file
    from safetensors import safe_open

    files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise StageInputError(f"no safetensors weights in {path}")
    result = {}
    for file in files:
        with safe_open(str(path / file), framework="pt") as handle:
            result[file] = list(handle.keys())
    return result


def best_device() -> str:
    """CUDA when there is a GPU, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

