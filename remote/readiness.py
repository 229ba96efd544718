"""What is knowable before a run, from the inventory and the host's files: `inv check`'s rows, and what
`inv plan` and `inv run` refuse before any job starts (so that a mistake fails in seconds, not an hour into a run).

- the target (`target.model`) is a model directory on the host, and its tokenizer (`target.tokenizer`,
  else the model's) a directory there or in the host's Hugging Face cache;
- `stages.extract.layers` (the request's, extract's as its job's spec carries them) are ids the target's
  architecture can capture (`remote.eagle3.layer_ids`: what an id means differs by architecture), its
  config.json read as every reader does (`remote.eagle3.model_config`: a bad one is the same line everywhere);
- a prompts dataset has an inference server: one answering at `stages.infer.server_url`, or one the
  runner starts (`stages.infer.server_command`).

A stage given a `command` of its own runs the user's code, which reads what it likes: its checks are
skipped. The request is `local.tasks.planning.readiness`'s. Standard library only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from remote.control_plane import inference_server
from remote.eagle3 import StageInputError, layer_ids, model_config
from remote.eagle3.model_config import ConfigError, ModelConfig
from remote.preflight import check

#: A Hugging Face hub id (`org/name`), which prep's tokenizer may be; the model must be a directory.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def on_host(root: Path, value: str) -> Path:
    """A path of the inventory as a job reads it: relative ones from its release (`<root>/current`)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / "current" / path


def target(root: Path, model: str | None) -> tuple[dict[str, Any], ModelConfig | None]:
    """The model's check, and its config when it is readable (`remote.eagle3.model_config`)."""
    if not model:
        return check("target", False, "target.model is not set: extract needs the target model's directory on the host"), None
    try:
        config = model_config.read(on_host(root, model), "target.model")
    except ConfigError as exc:
        cached = cached_snapshot(model, "config.json") if exc.problem.startswith("no ") and HUB_ID.fullmatch(model) else None
        line = exc.with_fix(f"it is in the host's Hugging Face cache: set target.model to {cached}") if cached else exc
        return check("target", False, str(line)), None
    names = config.raw.get("architectures")
    return check("target", True, f"{config.directory}: {names[0] if isinstance(names, list) and names else '?'}"), config


def hub_cache() -> Path:
    """Where the host's Hugging Face hub cache is, as huggingface_hub finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"


def cached_snapshot(repo_id: str, file: str) -> Path | None:
    """A snapshot of hub repo `repo_id` in the host's cache that holds `file`, the newest; None if none does."""
    found = (hub_cache() / f"models--{repo_id.replace('/', '--')}").glob(f"snapshots/*/{file}")
    snapshots = sorted((p.parent for p in found), key=lambda p: p.stat().st_mtime)
    return snapshots[-1] if snapshots else None


def tokenizer(root: Path, name: str | None) -> dict[str, Any]:
    if not name:
        return check("tokenizer", False, "target.tokenizer (or target.model) is not set: prep needs the target's tokenizer")
    path = on_host(root, name)
    if path.is_dir():
        found = any((path / f).is_file() for f in ("tokenizer_config.json", "tokenizer.json", "tokenizer.model"))
        return check("tokenizer", found, f"{path}" + ("" if found else ": no tokenizer_config.json or tokenizer.json in it"))
    if HUB_ID.fullmatch(name):
        cached = cached_snapshot(name, "tokenizer_config.json")
        if cached:
            return check("tokenizer", True, f"{name} in the host's Hugging Face cache ({cached})")
        # NOTE: a warning: prep downloads it where the host reaches the hub.
        return check("tokenizer", False, f"{name}: not in the host's Hugging Face cache ({hub_cache()}); prep would "
                     "download it, or give a directory on the host", True)
    return check("tokenizer", False, f"target.tokenizer {name!r}: no such directory on the host ({path})")


def layers(ids: list[int], config: ModelConfig) -> dict[str, Any]:
    """The ids against the target's architecture and depth, as the extract stage checks them."""
    try:
        arch, count = config.architecture, config.num_layers
        layer_ids.validate_layers(list(ids), count, arch)
    except StageInputError as exc:
        return check("layers", False, str(exc))
    return check("layers", True, f"{list(ids)} on a {count}-layer {arch}: {layer_ids.CONVENTIONS[layer_ids.rule(arch)]}")


def server(prompts: list[str], url: str, managed: bool) -> dict[str, Any]:
    """Prompts datasets need an inference server: a managed one (started by the runner), or one answering now."""
    if not url.startswith(("http://", "https://")):
        return check("infer's server", False, f"stages.infer.server_url {url!r} is not a URL such as http://127.0.0.1:30000/v1")
    if managed:
        return check("infer's server", True, f"started by the pipeline's runner (stages.infer.server_command) at {url}")
    if inference_server.is_healthy(url):
        return check("infer's server", True, f"{url} answers")
    return check("infer's server", False, f"prompts datasets {', '.join(prompts)} need an inference server: none answers at "
                 f"{url} (stages.infer.server_url) and none is managed; start one, or set stages.infer.server_command")


def checks(args: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks `args["readiness"]` names (`local.tasks.planning.readiness` builds it), in that order; the layer
    ids are the request's own (`inv plan`'s and `inv check`'s: extract's, as its job's spec carries them)."""
    asked = args.get("readiness") or {}
    root = Path(args["root"])
    results = []
    for name in asked.get("checks", []):
        if name == "tokenizer":
            results.append(tokenizer(root, asked["tokenizer"]))
        elif name == "target":
            found, config = target(root, asked["model"])
            results.append(found)
            if config is not None:
                results.append(layers(args["layers"], config))
        elif name == "server":
            results.append(server(asked["prompts"], asked["server_url"], asked["server_managed"]))
    return results


def refusals(args: dict[str, Any]) -> list[str]:
    """What `inv plan` and `inv run` refuse on: each failed check, as `name: detail`."""
    return [f"{c['name']}: {c['detail']}" for c in checks(args) if c["status"] == "fail"]
