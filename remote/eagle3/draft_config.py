"""The draft's ``config.json`` and the check that extraction feeds it the right width.

SGLang builds the draft's ``fc`` as ``Linear(3 * target_hidden_size, hidden_size)``
(``target_hidden_size`` defaulting to ``hidden_size``), so a draft accepts
exactly ``3 * target_hidden_size`` features per token. Extraction writes
``len(layers) * hidden_size``. When the two differ every trained weight is
useless -- the 7168-vs-21504 mistake, where one final-layer state reached a
draft built for three -- so both stages compare them before any work.

The draft's ``eagle_config.eagle_aux_hidden_state_layer_ids`` are
``stages.extract.layers`` as given: SGLang hands those ids to the target's
``set_eagle3_layers_to_capture``, and extract stored what that captures for
the target's architecture (`remote.eagle3.layer_ids`), so the same ids mean the
same states on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError
from remote.eagle3.layer_ids import EAGLE3_AUX_LAYERS, feature_width

ARCHITECTURE = "LlamaForCausalLMEagle3"


def draft_config_path(stage: dict[str, Any], shared: dict[str, Any]) -> Path | None:
    """The draft config named by the train settings, seen from either stage."""
    name = stage.get("draft_config") or ((shared.get("stages") or {}).get("train") or {}).get("draft_config")
    if not name:
        return None
    path = Path(name).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def load(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageInputError(f"stages.train.draft_config: no file {path}")
    except json.JSONDecodeError as exc:
        raise StageInputError(f"stages.train.draft_config {path}: not valid JSON ({exc.msg} at line {exc.lineno})")
    if not isinstance(config, dict) or "hidden_size" not in config:
        raise StageInputError(f"stages.train.draft_config {path}: expected a config with hidden_size")
    return config


def expected_width(config: dict[str, Any]) -> int:
    """The feature width the draft's fc takes."""
    return EAGLE3_AUX_LAYERS * int(config.get("target_hidden_size") or config["hidden_size"])


def aux_layer_ids(config: dict[str, Any]) -> list[int] | None:
    return (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")


def check_width(layers: list[int], hidden_size: int, config: dict[str, Any] | None, source: str) -> int:
    """Refuse a feature width the draft cannot take; the width on success."""
    width = feature_width(layers, hidden_size)
    wanted = EAGLE3_AUX_LAYERS * hidden_size if config is None else expected_width(config)
    if width != wanted:
        raise StageInputError(
            f"feature width mismatch: extraction writes {width} ({len(layers)} x hidden {hidden_size}, layers {layers}) "
            f"but {source} expects {wanted}; use three layer ids of this target or fix the draft config"
        )
    if config is not None:
        if int(config["hidden_size"]) != hidden_size:
            raise StageInputError(
                f"{source}: hidden_size {config['hidden_size']} differs from the target's {hidden_size}; "
                "an EAGLE-3 draft shares the target's embeddings, so they must match"
            )
        ids = aux_layer_ids(config)
        if ids is not None and list(ids) != list(layers):
            raise StageInputError(
                f"{source} serves aux layers {list(ids)} but stages.extract.layers is {layers}; make them the same"
            )
    return width


def build(target: dict[str, Any], layers: list[int], draft_vocab_size: int) -> dict[str, Any]:
    """A one-layer Llama draft config shaped after the target's own config (a dict of its text config)."""
    hidden = int(target["hidden_size"])
    heads = int(target["num_attention_heads"])
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": int(target.get("intermediate_size") or 4 * hidden),
        "num_attention_heads": heads,
        "num_key_value_heads": int(target.get("num_key_value_heads") or heads),
        "head_dim": _head_dim(target, hidden, heads),
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": float(target.get("rms_norm_eps") or 1e-6),
        "rope_theta": float(_rope_theta(target)),
        "rope_scaling": None,
        "max_position_embeddings": int(target.get("max_position_embeddings") or 4096),
        "vocab_size": int(target["vocab_size"]),
        "draft_vocab_size": int(draft_vocab_size),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": target.get("bos_token_id"),
        "eos_token_id": target.get("eos_token_id"),
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True},
    }


def finalize(config: dict[str, Any], layers: list[int], vocab_size: int, draft_vocab_size: int) -> dict[str, Any]:
    """A user's draft config with the fields SGLang's loader needs filled in."""
    config = dict(config)
    config["architectures"] = [ARCHITECTURE]
    config.setdefault("target_hidden_size", config["hidden_size"])
    config.setdefault("num_hidden_layers", 1)
    config["vocab_size"] = int(config.get("vocab_size") or vocab_size)
    config["draft_vocab_size"] = int(draft_vocab_size)
    config["tie_word_embeddings"] = False
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True}
    return config


def _head_dim(target: dict[str, Any], hidden: int, heads: int) -> int:
    # NOTE: an MLA target's (DeepseekV3, Kimi) head_dim is its rope part only,
    # not a Llama attention head's width.
    if "kv_lora_rank" in target:
        return hidden // heads
    return int(target.get("head_dim") or hidden // heads)


def _rope_theta(target: dict[str, Any]) -> float:
    # transformers 5 moved rope_theta into rope_parameters.
    params = target.get("rope_parameters") or {}
    return target.get("rope_theta") or params.get("rope_theta") or 10000.0
