"""`inv check` on the host: can the stages run here, and is the inference server set up right?

Each check is ``{"name", "status", "detail"}``, status ``ok``, ``warn`` or ``fail``. Packages are looked up, not
imported (importing torch takes seconds). Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from remote import plan, server

# NOTE: tiktoken is what Kimi-K2.5's own tokenizer (trust_remote_code) is built on.
PACKAGES = ("datasets", "transformers", "tokenizers", "tiktoken", "torch", "pyarrow", "safetensors")
DTYPE = "bfloat16"  # the states' dtype this check sizes by (it is not sent stages.extract.dtype)


def check(name: str, ok: bool, detail: str, warn_only: bool = False) -> dict[str, Any]:
    status = "ok" if ok else "warn" if warn_only else "fail"
    return {"name": name, "status": status, "detail": detail}


def python() -> dict[str, Any]:
    ok = sys.version_info >= (3, 10)
    return check("python", ok, f"{sys.executable} {sys.version.split()[0]}" + ("" if ok else ": 3.10 or newer needed"))


def packages() -> list[dict[str, Any]]:
    results = []
    for name in PACKAGES:
        try:
            results.append(check(f"package {name}", True, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            results.append(check(f"package {name}", False, f"not installed for {sys.executable}: pip install {name}"))
    return results


def gpus() -> dict[str, Any]:
    if not shutil.which("nvidia-smi"):
        # A warning, not a failure: the demo and small runs work on the CPU.
        return check("gpus", False, "nvidia-smi not found: no NVIDIA GPU visible (extract and train would run on the CPU)", True)
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True)
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return check("gpus", bool(names), "; ".join(names) or done.stderr.strip() or "none")


def disk(root: Path, datasets: list[str], layers: list[int], model: str | None) -> dict[str, Any]:
    """Free space against the hidden states' size: tokens × `plan.bytes_per_token`."""
    free = shutil.disk_usage(root if root.exists() else root.parent).free
    width = plan.hidden_size(model)
    tokens = sum(_tokens(root / "data" / name) for name in datasets)
    if not width or not tokens:
        return check("disk", True, f"{free / 2**30:,.1f} GiB free; no estimate yet (needs prep's token counts and the target's config)")
    per_token = plan.bytes_per_token(layers, width, DTYPE)
    need = per_token * tokens
    detail = f"{free / 2**30:,.1f} GiB free, hidden states need about {need / 2**30:,.1f} GiB ({tokens:,} tokens × {per_token:,} B)"
    return check("disk", free > need, detail)


def _tokens(data: Path) -> int:
    manifest = plan.prep_manifest(data)
    return int(manifest["tokens"]["total"]) if manifest else 0


def inference_server(url: str, layers: list[int]) -> dict[str, Any]:
    try:
        info = server.server_info(url)
    except server.ServerError as exc:
        return check("inference server", False, f"not checked: {exc}", True)
    problems = server.check_server_config(info, layers)
    algorithm = info.get("speculative_algorithm") or "no speculative decoding"
    return check("inference server", not problems, "; ".join(problems) or f"{url}: {algorithm}, layers agree")


def run(args: dict[str, Any]) -> list[dict[str, Any]]:
    layers = args["layers"]
    return [
        python(),
        *packages(),
        gpus(),
        disk(Path(args["root"]), args["datasets"], layers, args.get("model")),
        inference_server(args["server_url"], layers),
    ]
