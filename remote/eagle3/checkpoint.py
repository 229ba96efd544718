"""Draft checkpoints SGLang loads with ``--speculative-algorithm EAGLE3``.

A checkpoint directory holds ``config.json`` (``architectures:
["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``, ``target_hidden_size``,
``eagle_config.eagle_aux_hidden_state_layer_ids``) and ``model.safetensors``
with the draft's weights under SGLang's names and the ``d2t``/``t2d`` maps.
The frozen embeddings are left out: SGLang hands the draft the target's own.
tests/test_sglang_args.py loads what `save` writes with SGLang 0.5.23's own
``LlamaForCausalLMEagle3.load_weights`` and finds every other weight.
It is written to a temporary directory and renamed into place; an older
checkpoint of the same name is swapped out only after the new one is whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from remote.eagle3 import model_config
from remote.eagle3.model import Eagle3Draft

WEIGHTS = "model.safetensors"
#: Not saved: SGLang shares the target's embeddings with the draft.
SHARED = ("embed_tokens.weight",)


def state_for_sglang(draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The draft's tensors under the names SGLang's loader looks up."""
    return {name: t.detach().contiguous().cpu() for name, t in draft.state_dict().items() if name not in SHARED}


def save(draft: Eagle3Draft, directory: Path, extra: dict[str, Any] | None = None) -> Path:
    """Write the checkpoint atomically into `directory`; refused (one line) when a weight is not finite."""
    from safetensors.torch import save_file

    weights = state_for_sglang(draft)
    diverged = next((name for name, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if diverged is not None:
        from remote.eagle3 import StageInputError, resume

        raise StageInputError(f"the draft's {diverged} holds NaN or infinite values, not written to {directory}: the "
                              f"training diverged; {resume.after_diverging()}")
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(draft.config, indent=2, sort_keys=True))
    if extra:
        (tmp / "aerie.json").write_text(json.dumps(extra, indent=2, sort_keys=True))
    return promote(tmp, directory)


def promote(written: Path, directory: Path) -> Path:
    """A whole checkpoint written at `written` put in `directory`'s place (the old one, if any, removed)."""
    old = directory.with_name(f".{directory.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.replace(directory, old)
    os.replace(written, directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def load(directory: Path, embed: torch.Tensor) -> Eagle3Draft:
    """A draft from a checkpoint, given the target's embeddings."""
    from safetensors.torch import load_file

    config = model_config.read(directory, "the draft checkpoint").raw
    draft = Eagle3Draft(config)
    state = load_file(str(directory / WEIGHTS))
    state["embed_tokens.weight"] = embed
    draft.load_state_dict(state, strict=True)
    return draft.eval()
