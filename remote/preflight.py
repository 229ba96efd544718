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

from remote import sizing
from remote.control_plane import inference_server
from remote.vocabulary import hints, layout
from remote.eagle3 import server_check, target_memory
from remote.eagle3.model_config import ConfigError
from remote.vocabulary.sizes import decimal

# NOTE: tiktoken is what Kimi-K2.5's own tokenizer (trust_remote_code) is built on.
PACKAGES = ("datasets", "transformers", "tokenizers", "tiktoken", "torch", "pyarrow", "safetensors", "xxhash")


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


def disk(root: Path, datasets: list[str], layers: list[int], model: str | None, dtype: str) -> dict[str, Any]:
    """Free space against the hidden states' size, sized as `inv plan` sizes them (`sizing.stored_bytes`)."""
    free = sizing.free_bytes(root)
    try:
        width = sizing.hidden_size(model)
    except ConfigError as exc:  # the target's row of `inv check` names it too
        return check("disk", True, f"{free / 2**30:,.1f} GiB free; no estimate: {exc}")
    manifests = [m for m in (sizing.prep_manifest(layout.data_dir(root, name)) for name in datasets) if m]
    tokens = sum(int(m["tokens"]["total"]) for m in manifests)
    if not width or not tokens:
        return check("disk", True, f"{free / 2**30:,.1f} GiB free; no estimate yet (needs prep's token counts and the target's config)")
    per_token = sizing.bytes_per_token(layers, width, dtype)
    need = sizing.stored_bytes(tokens, sum(int(m.get("kept") or 0) for m in manifests), per_token)
    detail = (f"{free / 2**30:,.1f} GiB free, hidden states need about {need / 2**30:,.1f} GiB ({tokens:,} tokens × "
              f"{per_token:,} B in {dtype}, with ids and file framing)")
    # NOTE: a warning: the chunked and online routes need far less than all the states (`inv plan`).
    return check("disk", free > need, detail + ("" if free > need else f"; {hints.inv('plan')} shows the route that fits"), True)


def extract_engines(model: str | None, dtype: str, configured: str | None, root: Path | None = None) -> list[dict[str, Any]]:
    """Per extract engine: the bytes the target needs there against this host's GPUs (`inv plan` sizes it the
    same way, and keeps what it read under `root`); the configured engine fails when it cannot hold the target,
    the other only warns."""
    sized = target_memory.per_engine(model, dtype, configured, 0, {}, root)
    if sized.get("error"):
        return [check("extract engines", False, f"not sized: {sized['error']}", True)]
    results = []
    for name, size in sized["engines"].items():
        need = (f"{decimal(size['per_gpu_need_bytes'])} on each GPU ({decimal(size['stored_bytes'])} "
                "as stored)" if name == "sglang" else f"{decimal(size['need_bytes'])} in {size['in']}")
        detail = size["refusal"] or f"needs {need}; {size['holds']}: {decimal(size['capacity_bytes'])}"
        label = f"extract engine {name}" + (" (configured)" if name == configured else "")
        # NOTE: sglang unsized for want of nvidia-smi only warns: its CPU stand-in (the tests') runs there
        results.append(check(label, size["fits"], detail, warn_only=name != configured or not sized["gpus"] and name == "sglang"))
    return results


def served_draft(url: str, layers: list[int]) -> dict[str, Any]:
    try:
        info = server_check.server_info(url)
    except inference_server.ServerError as exc:
        return check("inference server", False, f"not checked: {exc}", True)
    problems = server_check.check_server_config(info, layers)
    algorithm = info.get("speculative_algorithm") or "no speculative decoding"
    return check("inference server", not problems, "; ".join(problems) or f"{url}: {algorithm}, layers agree")


def job_processes() -> dict[str, Any]:
    """Whether `inv stop` can end every process a job starts here (a cgroup per job), or its process group only."""
    from remote.control_plane import cgroups

    ok, how = cgroups.probe()
    if ok:
        return check("job processes", True, f"{how}: `inv stop` ends every process a job started, setsid or not")
    return check("job processes", False, f"{how}: each job is its process group, and a process that leaves it "
                 "(setsid) outlives `inv stop`", warn_only=True)


def states(root: Path, datasets: list[str]) -> list[dict[str, Any]]:
    """`inv check --verify`: every stored state of each dataset read and checked against the size and
    checksum extract recorded (`remote.eagle3.shards.verify`); a bad file fails, and is marked for
    extract again as train would mark it."""
    from remote.eagle3 import shards  # here: only a verify reads the states

    results = []
    for name in datasets:
        store = layout.output_dir(root, name, "extract")
        if not (store / "manifest.json").is_file():
            results.append(check(f"states {name}", False, f"none to verify: {name}'s extract has not succeeded", True))
            continue
        try:
            found = shards.verify(store)
        except shards.BadState as exc:
            results.append(check(f"states {name}", False, str(exc)))
            continue
        results.append(check(f"states {name}", True, f"{found['files']:,} files, {found['bytes'] / 2**30:,.2f} GiB: "
                                                      "each its recorded size and checksum"))
    return results


def run(args: dict[str, Any]) -> list[dict[str, Any]]:
    layers = args["layers"]
    return [
        python(),
        *packages(),
        gpus(),
        job_processes(),
        disk(Path(args["root"]), args["datasets"], layers, args.get("model"), args["dtype"]),
        served_draft(args["server_url"], layers),
        *extract_engines(args.get("model"), args["dtype"], args.get("extract_engine"), Path(args["root"])),
        *(states(Path(args["root"]), args["datasets"]) if args.get("verify") else []),
    ]
