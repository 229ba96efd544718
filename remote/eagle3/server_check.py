"""A running SGLang server asked for its configuration, and that held against the extraction.

``inv check`` runs this on the GPU host: the last round ran
``--speculative-algorithm EAGLE`` with an EAGLE-3 draft, which fed the draft
one 7168-wide final-layer state instead of three concatenated auxiliary layers.

Standard library only: the host's Python may have nothing else installed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from remote.control_plane.inference_server import ServerError, base_url
from remote.eagle3 import StageInputError, layer_ids, model_config
from remote.eagle3.model_config import ConfigError


def server_info(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The server's own configuration (SGLang: its ServerArgs), plus the draft's config when readable.

    SGLang answers ``/server_info`` (newer) or ``/get_server_info`` (older,
    kept as an alias). The draft's ``config.json`` is read from
    ``speculative_draft_model_path`` when that is a directory here, which is
    the case for ``inv check`` running on the GPU host; it carries the
    auxiliary layer ids that ServerArgs does not.
    """
    root = base_url(url)
    info = None
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(root + path, timeout=timeout) as response:
                info = json.loads(response.read())
                break
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise ServerError(f"{root}{path} answered HTTP {exc.code}") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ServerError(f"cannot read {root}{path}: {exc}") from None
    if info is None:
        raise ServerError(f"{root} has no /server_info or /get_server_info: not an SGLang server?")
    for key, path_key, setting in (("draft_config", "speculative_draft_model_path", "the server's --speculative-draft-model-path"),
                                   ("target_config", "model_path", "the server's --model-path")):
        path = info.get(path_key)
        if not path or not Path(path).is_dir():
            continue  # NOTE: the server may run on another machine: nothing here to read
        try:
            info[key] = model_config.read(path, setting).raw
        except ConfigError as exc:
            info.setdefault("config_errors", []).append(str(exc))
    return info


def check_server_config(info: dict[str, Any], layers: list[int]) -> list[str]:
    """Problems in a server's configuration for serving an EAGLE-3 draft fed from `layers`.

    `layers` are auxiliary layer ids as the draft's config gives them to SGLang
    (``eagle_config.eagle_aux_hidden_state_layer_ids``). What an id captures
    depends on the target's architecture (`remote.eagle3.layer_ids`), so the
    server's draft and the extraction are compared by the decoder layers whose
    inputs they capture: a draft with no ids, or other ids, may still read the
    same states, and the same ids on another architecture may not.
    """
    algorithm = (info.get("speculative_algorithm") or "").upper()
    draft_path = info.get("speculative_draft_model_path")
    draft = info.get("draft_config") or {}
    problems = []
    if not algorithm:
        return problems
    problems += info.get("config_errors") or []
    if algorithm == "EAGLE" and (_is_eagle3_draft(draft) or not draft):
        problems.append(
            "server runs --speculative-algorithm EAGLE but the draft is EAGLE-3: the draft gets the final hidden "
            "state instead of the concatenated auxiliary layers; relaunch with --speculative-algorithm EAGLE3"
        )
    if algorithm == "EAGLE3":
        if not draft_path:
            problems.append("server runs EAGLE3 without --speculative-draft-model-path")
        problems += _layer_problems(info, layers)
    return problems


def _layer_problems(info: dict[str, Any], layers: list[int]) -> list[str]:
    """The server's draft against the extraction: what each captures, where the target's architecture is known."""
    served = aux_layers(info)
    arch = _target_architecture(info)
    if served is None:
        return []
    if arch is None:
        if list(served) == list(layers):
            return []
        return [f"server's draft uses auxiliary layers {list(served)} but extraction uses {list(layers)}: "
                "set eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json or stages.extract.layers"]
    try:
        wanted = layer_ids.captured(list(layers), arch)
        got = layer_ids.captured(list(served), arch) if _draft_ids(info) else server_captures(info)
    except StageInputError as exc:
        return [f"cannot compare the draft's layers with the extraction's: {exc}"]
    if got == wanted:
        return []
    return [f"server's draft uses auxiliary layers {list(served)} but extraction uses {list(layers)}: on {arch} SGLang "
            f"feeds the draft the inputs of decoder layers {got}, extract stored those of {wanted}; "
            "set eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json or stages.extract.layers"]


def aux_layers(info: dict[str, Any]) -> list[int] | None:
    """The auxiliary layer ids the server's EAGLE-3 draft reads, or None when they cannot be known.

    The draft's ``eagle_config`` wins (SGLang reads the ids nowhere else). A
    draft without them makes SGLang capture the inputs of layers ``[2, N // 2,
    N - 3]`` of an ``N``-layer target, whatever its architecture; those are
    given here as the ids that capture them on that target (for Llama
    ``[1, N // 2 - 1, N - 4]``, for DeepSeek/Kimi ``[2, N // 2, N - 3]``).
    """
    ids = _draft_ids(info)
    if ids:
        return ids
    captures = server_captures(info)
    if captures is None:
        return None
    arch = _target_architecture(info)
    shift = arch is not None and layer_ids.RULES.get(arch) == layer_ids.DEEPSEEK
    return captures if shift else [j - 1 for j in captures]


def server_captures(info: dict[str, Any]) -> list[int] | None:
    """The decoder layers whose inputs SGLang captures for a draft without ids, or None when unknown."""
    if not info.get("draft_config"):
        return None
    n = model_config.of(info.get("target_config") or {}).text.get("num_hidden_layers")
    return [2, n // 2, n - 3] if isinstance(n, int) and n else None


def _draft_ids(info: dict[str, Any]) -> list[int] | None:
    draft = info.get("draft_config") or {}
    ids = (draft.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids else None


def _target_architecture(info: dict[str, Any]) -> str | None:
    """The served target's architecture when its config is readable here and aerie has checked it."""
    names = (info.get("target_config") or {}).get("architectures") or []
    return names[0] if names and names[0] in layer_ids.RULES else None


def _is_eagle3_draft(draft: dict[str, Any]) -> bool:
    architectures = " ".join(draft.get("architectures") or [])
    return "eagle3" in architectures.lower() or "eagle_config" in draft
