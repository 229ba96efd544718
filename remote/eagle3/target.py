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

from remote.eagle3 import StageInputError

EMBED_SUFFIX = "embed_tokens.weight"
LM_HEAD_SUFFIX = "lm_head.weight"
#: Where a multimodal wrapper (Kimi-K2.5) keeps its language model's weights.
LANGUAGE_PREFIX = "language_model."


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
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not (path / "config.json").is_file():
        raise StageInputError(f"target.model {model!r}: no config.json in {path}; point it at a model directory on the host")
    return path, bool(target.get("trust_remote_code", False))


def read_config(path: Path) -> dict[str, Any]:
    """The target's (text) config as a dict, read from config.json without importing transformers.

    Multimodal wrappers such as Kimi-K2.5 keep the language model's shape in
    ``text_config``; reading the JSON needs no ``trust_remote_code``.
    """
    try:
        config = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise StageInputError(f"{path / 'config.json'} is not valid JSON ({exc.msg})")
    text = config.get("text_config") or config
    missing = [k for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k not in text]
    if missing:
        raise StageInputError(f"{path / 'config.json'} lacks {', '.join(missing)}: is target.model a causal LM?")
    return {**text, "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}


def quantization_config(path: Path) -> dict[str, Any] | None:
    """The checkpoint's quantization config: the text config's, else the wrapper's top-level one -- both
    placements mean the language model's weights (vLLM's ``KimiK25Config`` propagates the one inside
    ``text_config`` up; transformers reads only the config it builds the model from)."""
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    found = text.get("quantization_config") or config.get("quantization_config")
    return found if isinstance(found, dict) else None


def read_shape(path: Path) -> TargetShape:
    """The target's shape, from its config alone (no weights)."""
    text = read_config(path)
    return TargetShape(
        path=path,
        hidden_size=int(text["hidden_size"]),
        num_layers=int(text["num_hidden_layers"]),
        vocab_size=int(text["vocab_size"]),
        tie_word_embeddings=bool(text["tie_word_embeddings"]),
    )


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

