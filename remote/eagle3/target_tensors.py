"""The target's tensors as its safetensors headers declare them: name, dtype, shape, bytes on disk.

A safetensors file opens with an 8-byte little-endian header length and a JSON header naming
every tensor's dtype, shape and byte range; reading it touches no weight, so a 594 GB
checkpoint is sized in a second, before anything is loaded (`remote.eagle3.target_memory`).
`unpaired_quantized` checks the one thing transformers' loading report does not: a
compressed-tensors module stores its packed tensors and nothing else (a dense ``weight`` beside
``weight_packed`` is silently dropped by the loader). Standard library only.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, NamedTuple

from remote.eagle3 import StageInputError

#: Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: A header larger than this is not a safetensors header (the format caps it at 100 MB).
MAX_HEADER = 100_000_000
#: What compressed-tensors' pack-quantized format stores per module instead of ``weight``.
PACKED = "weight_packed"
COMPRESSED_NAMES = (PACKED, "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")


class Tensor(NamedTuple):
    """One tensor of the checkpoint, as its file's header declares it (a named tuple: a checkpoint such as
    Kimi-K2.5's declares 200,000 of them, and a frozen dataclass takes seconds to build that many)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file; one line naming the file when it is not one."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > MAX_HEADER:
                raise ValueError(f"header length {length}")
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError) as exc:
        raise StageInputError(f"{path} is not a readable safetensors file ({exc}): re-download it") from None
    if not isinstance(header, dict):
        raise StageInputError(f"{path} has no safetensors header: re-download it")
    return header


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files: the index's when there is one, else every file in `path`."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise StageInputError(f"{index} is not a safetensors index ({exc}): re-download it") from None
        return [path / name for name in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise StageInputError(f"no safetensors weights in {path}")
    return files


def read_tensors(path: Path) -> list[Tensor]:
    """Every tensor of the checkpoint in `path`, from its headers alone."""
    tensors = []
    for file in weight_files(path):
        for name, entry in read_header(file).items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            tensors.append(Tensor(name, entry["dtype"], tuple(entry["shape"]), int(end) - int(start)))
    return tensors


def expected_compressed(quantization: dict[str, Any] | None) -> set[str] | None:
    """The tensors a pack-quantized module stores (compressed-tensors' `compression_param_names`), or None
    when the checkpoint is not pack-quantized."""
    if not quantization or quantization.get("format") != "pack-quantized":
        return None
    names = {PACKED, "weight_scale", "weight_shape"}
    for group in (quantization.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        if weights.get("symmetric") is False:
            names.add("weight_zero_point")
        if weights.get("actorder") == "group":
            names.add("weight_g_idx")
    return names


def unpaired_quantized(tensors: list[Tensor], quantization: dict[str, Any] | None) -> list[str]:
    """The names in pack-quantized modules that break the module's packed set: a tensor beside it (a dense
    ``weight`` next to ``weight_packed``, which the loader drops without a word) or one of it missing."""
    expected = expected_compressed(quantization)
    if expected is None:
        return []
    modules: dict[str, set[str]] = {}
    for tensor in tensors:
        module, _, leaf = tensor.name.rpartition(".")
        modules.setdefault(module, set()).add(leaf)
    odd = []
    for module, leaves in modules.items():
        if leaves & set(COMPRESSED_NAMES) and leaves != expected:
            odd += [f"{module}.{leaf}" for leaf in sorted(leaves - expected)]
            odd += [f"{module}.{leaf} (missing)" for leaf in sorted(expected - leaves)]
    return sorted(odd)
