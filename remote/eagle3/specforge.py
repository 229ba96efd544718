"""Run SpecForge's EAGLE-3 trainer instead of aerie's (``stages.train.engine: specforge``).

SpecForge is not a dependency of aerie; the host needs a checkout of it
(``stages.train.specforge_dir``, or ``$SPECFORGE_DIR``) with its packages
installed. The command is SpecForge's documented offline recipe::

    torchrun --standalone --nproc_per_node N <specforge>/scripts/train_eagle3.py
        --target-model-path T --draft-model-config C
        --train-data-path J --train-hidden-states-path <extract output>
        --output-dir O --num-epochs E --batch-size B --learning-rate LR
        --max-length L --chat-template TPL --ttt-length K --cache-dir D

The extract stage's output is already in the layout its offline dataset reads.
SpecForge also wants the conversations as JSONL (``--train-data-path``: it
builds its vocabulary mapping from them): prep's ``conversations.jsonl``
(SpecForge's layout already), or ``stages.train.specforge_train_data``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError
from remote.settings import need

SCRIPT = Path("scripts") / "train_eagle3.py"


@dataclass(frozen=True)
class SpecForgeRun:
    """What the command is built from."""

    specforge_dir: Path
    target_model: Path
    draft_config: Path
    train_data: Path
    hidden_states: Path
    output: Path
    epochs: int
    batch_size: int
    learning_rate: float
    max_length: int
    chat_template: str
    ttt_steps: int
    nproc: int


def settings(stage: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The SpecForge-only settings, with the one-line errors a missing one deserves."""
    env = os.environ if env is None else env
    where = stage.get("specforge_dir") or env.get("SPECFORGE_DIR")
    if not where:
        raise StageInputError("engine specforge: set stages.train.specforge_dir (or $SPECFORGE_DIR) to a SpecForge checkout on the host")
    if not stage.get("draft_config"):
        raise StageInputError("engine specforge needs stages.train.draft_config (e.g. SpecForge's configs/kimi-k25-eagle3.json)")
    return {
        "specforge_dir": Path(where).expanduser(),
        "chat_template": need(stage, "train", "chat_template", StageInputError),
        "nproc": int(need(stage, "train", "nproc", StageInputError)),
        "max_length": int(need(stage, "train", "max_length", StageInputError)),
    }


def command(run: SpecForgeRun) -> list[str]:
    """The argv that runs SpecForge's offline EAGLE-3 training."""
    return [
        "torchrun",
        "--standalone",
        "--nproc_per_node",
        str(run.nproc),
        str(run.specforge_dir / SCRIPT),
        "--target-model-path", str(run.target_model),
        "--draft-model-config", str(run.draft_config),
        "--train-data-path", str(run.train_data),
        "--train-hidden-states-path", str(run.hidden_states),
        "--output-dir", str(run.output),
        "--num-epochs", str(run.epochs),
        "--batch-size", str(run.batch_size),
        "--learning-rate", str(run.learning_rate),
        "--max-length", str(run.max_length),
        "--chat-template", run.chat_template,
        "--ttt-length", str(run.ttt_steps),
        "--cache-dir", str(run.output / "cache"),
    ]  # fmt: skip


def check_installed(run: SpecForgeRun) -> None:
    """Refuse, in one line, when SpecForge or torchrun is not there."""
    if not (run.specforge_dir / SCRIPT).is_file():
        raise StageInputError(
            f"SpecForge is not installed: no {SCRIPT} under {run.specforge_dir}; "
            "clone sgl-project/SpecForge there and pip install it, or use engine: aerie"
        )
    if shutil.which("torchrun") is None:
        raise StageInputError("engine specforge: torchrun is not on PATH; install torch in the host's Python")
