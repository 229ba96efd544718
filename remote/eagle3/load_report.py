"""What a loaded target is made of: every parameter from the checkpoint, every tensor of it used, one dtype.

transformers loads what it can and only logs the rest: a parameter the checkpoint did not fill
(``MISSING ... newly initialized``) is random, and a checkpoint tensor it could not place
(``UNEXPECTED``) is a weight the forward pass never sees -- Kimi-K2.5's INT4 experts with the
quantization config where transformers does not look for it are both at once, and extract
would store states from random experts with every check green. `check_complete` turns the
loading info into a refusal naming the first keys; only a multimodal wrapper's vision tower
is expected to stay unread (by name, `VISION_PREFIXES`).

compressed-tensors dequantizes INT4 experts into their scales' dtype (bfloat16) whatever dtype
the rest was loaded in; `to_dtype` converts them, so the states are computed in the dtype the
settings name, not in a mix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError, target_tensors

#: The tensors of a multimodal wrapper the language model never reads (Kimi-K2.5's MoonViT and projector).
VISION_PREFIXES = ("vision_tower.", "mm_projector.")
#: How many keys a refusal names.
SHOWN = 3


def check_checkpoint(path: Path, quantization: dict[str, Any] | None) -> None:
    """Refuse, from the headers and before loading, a pack-quantized module whose tensors are not exactly its
    packed set: transformers drops a dense ``weight`` beside ``weight_packed`` without reporting it."""
    odd = target_tensors.unpaired_quantized(target_tensors.read_tensors(path), quantization)
    if odd:
        raise StageInputError(f"target {path}: {len(odd)} tensor(s) break a pack-quantized module's set "
                              f"(weight_packed, weight_scale, weight_shape) and would not be loaded: {_first(odd)}")


def check_complete(info: dict[str, Any], path: Any, wrapper: bool) -> None:
    """Refuse a load that left a parameter initialised at random or a checkpoint tensor unused."""
    missing = sorted(info.get("missing_keys") or ())
    unused = sorted(k for k in info.get("unexpected_keys") or () if not (wrapper and k.startswith(VISION_PREFIXES)))
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys") or ())
    errors = list(info.get("error_msgs") or ())
    if not (missing or unused or mismatched or errors):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} parameter(s) not in the checkpoint (would be random): {_first(missing)}")
    if unused:
        parts.append(f"{len(unused)} checkpoint tensor(s) left unused: {_first(unused)}")
    if mismatched:
        parts.append(f"{len(mismatched)} tensor(s) of the wrong shape: {_first(mismatched)}")
    if errors:
        parts.append(f"load errors: {str(errors[0]).splitlines()[0]}")
    raise StageInputError(f"target {path} did not load whole: {'; '.join(parts)}; no states are computed from "
                          "weights that were not loaded (is quantization_config where transformers reads it?)")


def to_dtype(model: Any, dtype: str) -> list[str]:
    """Convert every floating parameter not in `dtype` to it, except those the model keeps in float32 on
    purpose (its ``_keep_in_fp32_modules``: DeepseekV3's router); the names converted. Buffers (RoPE's
    frequencies) stay as the model built them, as in a plain load."""
    import torch

    wanted = getattr(torch, dtype)
    kept = set(getattr(model, "_keep_in_fp32_modules", None) or ()) | set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    converted = []
    for name, tensor in model.named_parameters():
        if tensor.is_floating_point() and tensor.dtype != wanted and not any(k in name for k in kept):
            tensor.data = tensor.data.to(wanted)
            converted.append(name)
    return converted


def _first(keys: list[str]) -> str:
    return ", ".join(keys[:SHOWN]) + (", ..." if len(keys) > SHOWN else "")
