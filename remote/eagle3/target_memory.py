"""What each extract engine holds of the target, against the memory it will use -- before a weight is read.

From the safetensors headers (`remote.eagle3.target_tensors`) alone:

- ``hf`` (transformers in the extract process) builds the language model (a wrapper's vision
  tower is left unread) in ``stages.extract.dtype``: every parameter x that dtype's bytes,
  INT4 experts counted as what compressed-tensors makes of them -- dense weights of
  ``rows x packed columns x 32 / bits`` values. It holds them on the GPUs (all of them,
  ``device_map="auto"``), else in the host's RAM.
- ``sglang`` (the serving engine) keeps the weights as stored -- INT4 experts stay INT4 under
  its own kernels -- spread over its tensor-parallel GPUs (every GPU), and each GPU keeps
  `SGLANG_RESERVED` besides for activations and CUDA graphs (SGLang 0.5.23's
  ``memory_hook``: at least 10 GiB on GPUs over 60 GiB); the KV cache takes what is left.

Reading Kimi-K2.5's 64 headers (200,000 tensors) is most of a plan's time on the host, and `inv plan`,
`inv run` and `inv check` each plan: what the headers add up to is kept under the host's root
(`layout.target_sizes`), keyed by the checkpoint files' sizes and times, and read again only when one changes.

Sizes are decimal (GB, TB), as disks and the issue's figures are. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from remote.control_plane.progress import write_json_atomic
from remote.eagle3 import StageInputError
from remote.eagle3.model_config import ConfigError
from remote.eagle3.target import LANGUAGE_PREFIX, quantization_config
from remote.eagle3.target_tensors import COMPRESSED_NAMES, PACKED, Tensor, read_tensors
from remote.vocabulary import layout
from remote.vocabulary.sizes import decimal

#: Bytes per value of each dtype extract runs in: the target's weights here, the stored states in `remote.sizing`.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: Per GPU, what SGLang keeps beside the weights and the KV cache (its memory_hook's floor on big GPUs).
SGLANG_RESERVED = 10 * 2**30
#: Prefill tokens per second of each engine where no run on the host measured it: an estimate, stated
#: as such (SGLang's tensor-parallel prefill of a DeepSeek-V3-sized MoE on one 8-GPU node is of the
#: order of 10^4 tokens/s; docs/hidden-states.md). The HF engine has no such figure.
STATED_TOKENS_PER_S = {"sglang": 10_000}
#: Extract's engines (stages.extract.engine), each sized here.
ENGINES = ("hf", "sglang")


def bits(quantization: dict[str, Any] | None) -> int:
    """The quantized weights' bits (pack-quantized INT4: 4)."""
    for group in ((quantization or {}).get("config_groups") or {}).values():
        if ((group or {}).get("weights") or {}).get("num_bits"):
            return int(group["weights"]["num_bits"])
    return 4


def hf_parameters(tensors: list[Tensor], quantization: dict[str, Any] | None, wrapper: bool) -> tuple[int, int]:
    """(parameters the HF engine builds, of them dequantized from packed weights)."""
    total = quantized = 0
    per_int32 = 32 // bits(quantization)
    for tensor in tensors:
        if wrapper and not tensor.name.startswith(LANGUAGE_PREFIX):
            continue  # the vision tower and projector: never built
        leaf = tensor.name.rpartition(".")[2]
        if leaf == PACKED:
            count = tensor.shape[0] * tensor.shape[-1] * per_int32 if tensor.shape else 0
            total, quantized = total + count, quantized + count
        elif leaf not in COMPRESSED_NAMES:
            total += tensor.numel
    return total, quantized


def host_memory() -> int:
    """The host's available RAM in bytes (``MemAvailable``), 0 when unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


class Footprint(NamedTuple):
    """What the target's headers add up to: the parameters the HF engine builds, of them dequantized, and
    the bytes stored on disk."""

    params: int
    quantized: int
    stored: int


def footprint(path: Path, quantization: dict[str, Any] | None, root: Path | None = None) -> Footprint:
    """The target's `Footprint`, from its headers, or from `root`'s record of them while no file of the
    checkpoint has changed (no `root`: read, and kept nowhere)."""
    key = _files_key(path) if root is not None else None
    record = _record(root, path) if root is not None and key is not None else None
    kept = _kept(record, key) if record is not None else None
    if kept is not None:
        return kept
    tensors = read_tensors(path)  # a file it cannot read: the one line naming it
    params, quantized = hf_parameters(tensors, quantization, wrapper=any(t.name.startswith(LANGUAGE_PREFIX) for t in tensors))
    found = Footprint(params, quantized, sum(t.nbytes for t in tensors))
    if record is not None:
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(record, {"model": str(path), "files": key, "footprint": found._asdict()})
        except OSError:
            pass  # a full or read-only root: the next plan reads the headers again
    return found


def _kept(record: Path, key: list[list[Any]]) -> Footprint | None:
    """The footprint `record` keeps for files of `key`; None when it keeps none, for other files, or is torn
    or not counts (an edited record is read again, never multiplied into a size)."""
    try:
        kept = json.loads(record.read_text())
        if kept["files"] != key:
            return None
        found = Footprint(**kept["footprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if all(type(n) is int and n >= 0 for n in found) else None


def _record(root: Path, path: Path) -> Path:
    return layout.target_sizes(root) / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}.json"


def _files_key(path: Path) -> list[list[Any]] | None:
    """Name, size and modification time of each file the footprint is read from (config.json for the bits,
    the index, every safetensors file): a re-download or an edit changes one of them. None when one cannot
    be looked at (a hub cache's dangling link): the headers are read, and say which."""
    key = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.name == "config.json" or entry.name.endswith((".safetensors", ".safetensors.index.json")):
                    stat = entry.stat()
                    key.append([entry.name, stat.st_size, stat.st_mtime_ns])
    except OSError:
        return None
    return sorted(key)


def engines(path: Path, dtype: str, gpu_bytes: list[int], host_bytes: int, root: Path | None = None) -> dict[str, dict[str, Any]]:
    """Per engine: {need_bytes, capacity_bytes, fits, holds, in, params, quantized_params} for the target in
    `path` run in `dtype` on GPUs of `gpu_bytes` each (none: the HF engine uses `host_bytes` of RAM); `root`:
    the host's aerie root, where the headers' footprint is kept between plans."""
    quantization = quantization_config(path)  # first: a model directory's config.json, or the one line why not
    params, quantized, stored = footprint(path, quantization, root)
    count = len(gpu_bytes)
    hf_need = params * DTYPE_BYTES[dtype]
    hf_capacity = sum(gpu_bytes) if gpu_bytes else host_bytes
    per_gpu = -(-stored // count) + SGLANG_RESERVED if count else stored + SGLANG_RESERVED
    return {
        "hf": {"need_bytes": hf_need, "capacity_bytes": hf_capacity, "fits": hf_need <= hf_capacity,
               "holds": _gpus(count) if count else "this host's RAM (no GPU)",
               "in": f"{dtype}" + (f" once its INT{bits(quantization)} experts are dequantized" if quantized else ""),
               "params": params, "quantized_params": quantized},
        "sglang": {"need_bytes": per_gpu * count if count else per_gpu, "capacity_bytes": sum(gpu_bytes),
                   "per_gpu_need_bytes": per_gpu, "per_gpu_bytes": min(gpu_bytes) if gpu_bytes else 0,
                   "fits": bool(count) and per_gpu <= min(gpu_bytes), "stored_bytes": stored,
                   "holds": _gpus(count) if count else "no GPU", "in": "as stored, tensor-parallel over every GPU",
                   "params": params, "quantized_params": quantized},
    }


def refusal(sizes: dict[str, dict[str, Any]], engine: str) -> str | None:
    """One line when `engine` cannot hold the target: both sizes, and the engine that can (or what it needs)."""
    mine = sizes[engine]
    if mine["fits"]:
        return None
    if engine == "sglang" and not mine["per_gpu_bytes"]:
        line = f"target {decimal(mine['stored_bytes'])} as stored; stages.extract.engine: sglang runs on GPUs and this host has none"
    elif engine == "sglang":
        line = (f"target {decimal(mine['stored_bytes'])} as stored; SGLang needs {decimal(mine['per_gpu_need_bytes'])} on "
                f"each of {mine['holds']} (its share plus {decimal(SGLANG_RESERVED)} reserved), they hold "
                f"{decimal(mine['per_gpu_bytes'])} each")
    else:
        line = f"target {decimal(mine['need_bytes'])} in {mine['in']}; {holds(mine)}"
    others = [e for e in ENGINES if e != engine]
    fitting = [e for e in others if sizes[e]["fits"]]
    if fitting:
        return f"{line}: use stages.extract.engine: {fitting[0]}"
    other = others[0]
    if other == "sglang":
        need = sizes["sglang"]
        return (f"{line}: use stages.extract.engine: sglang on GPUs that hold {decimal(need['stored_bytes'])} "
                f"as stored plus {decimal(SGLANG_RESERVED)} each (e.g. 8 x H200)")
    return f"{line}: no engine fits this host"


def require(path: Path, dtype: str, engine: str, gpu_bytes: list[int], host_bytes: int) -> dict[str, dict[str, Any]]:
    """The sizes, or a `StageInputError` with the one line of `refusal`."""
    sizes = engines(path, dtype, gpu_bytes, host_bytes)
    why = refusal(sizes, engine)
    if why:
        raise StageInputError(why)
    return sizes


def holds(size: dict[str, Any]) -> str:
    """"the 8 GPUs hold 1.21 TB", "this host's RAM (no GPU) holds 21 GB"."""
    verb = "hold" if size["holds"].endswith("GPUs") else "holds"
    return f"{size['holds']} {verb} {decimal(size['capacity_bytes'])}"


def _gpus(count: int) -> str:
    return "the GPU" if count == 1 else f"the {count} GPUs"


def nvidia_smi_gpus(visible: str | None = None) -> list[int]:
    """Each GPU's memory in bytes as ``nvidia-smi`` reports it, without importing torch (none without it: as
    `inv check` says, no NVIDIA GPU). `visible`: a ``CUDA_VISIBLE_DEVICES`` value (indices or UUIDs) that
    narrows them to the extract process's."""
    from remote.control_plane import gpus

    board = gpus.Query().read()
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        board = [g for g in board if str(g["index"]) in wanted or g["uuid"] in wanted]
    return [int(gpu["memory_total"] * 2**20) for gpu in board if gpu.get("memory_total")]


def per_engine(model: str | None, dtype: str, configured: str | None, tokens: int, measured: dict[str, Any],
               root: Path | None = None) -> dict[str, Any]:
    """For `inv plan` and `inv check`: each engine's sizes against this host's GPUs (nvidia-smi), whether it
    fits, its refusal, and the hours `tokens` take at a measured rate (`measured`: {engine, tokens_per_s}) or
    the stated one; {"error"} when the target's headers cannot be read. `root`: as `engines` keeps it."""
    if not model:
        return {"error": "target.model is not set", "configured": configured}
    gpu_bytes = nvidia_smi_gpus()
    try:
        sizes = engines(Path(model), dtype, gpu_bytes, host_memory(), root)
    except ConfigError as exc:  # already the one line naming target.model and the fix
        return {"error": str(exc), "configured": configured}
    except (StageInputError, KeyError, TypeError, ValueError) as exc:
        return {"error": f"target.model {model!r}: {exc}", "configured": configured}
    for engine, size in sizes.items():
        size["refusal"] = refusal(sizes, engine)
        rate, basis = (measured["tokens_per_s"], "measured") if measured.get("engine") == engine and measured.get("tokens_per_s") \
            else (STATED_TOKENS_PER_S.get(engine), "stated (estimate)" if engine in STATED_TOKENS_PER_S else None)
        size.update(tokens_per_s=rate, rate_basis=basis, hours=round(tokens / rate / 3600, 2) if rate and tokens else None)
    return {"configured": configured, "gpus": gpu_bytes, "engines": sizes}
