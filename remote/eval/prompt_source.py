"""The prompts `inv eval` sends: by default the held-out records of training, never trained on.

Each held-out record is the target's own tokens with its loss mask; its prompt
is everything before the first trained (assistant) token, sent as
``input_ids`` so the server sees exactly the chat template training saw.
A ``stages.eval.prompts`` file (JSONL of ``{"text": ...}`` or
``{"input_ids": [...]}``) replaces them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError
from remote.eagle3.heldout import HELDOUT_LIST


def from_file(path: Path, limit: int) -> list[dict[str, Any]]:
    if not path.is_file():
        raise StageInputError(f"stages.eval.prompts {path}: no such file on the host")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise StageInputError(f"{path}:{number}: not JSON") from None
        if isinstance(row, dict) and isinstance(row.get("text"), str):
            prompts.append({"text": row["text"]})
        elif isinstance(row, dict) and isinstance(row.get("input_ids"), list):
            prompts.append({"input_ids": [int(i) for i in row["input_ids"]]})
        else:
            raise StageInputError(f"{path}:{number}: expected {{\"text\": ...}} or {{\"input_ids\": [...]}}")
    return prompts[:limit]


def from_training(train_output: Path, limit: int) -> list[dict[str, Any]]:
    """The prompts of train's held-out records (`heldout.json` beside its manifest)."""
    listed = train_output / HELDOUT_LIST
    try:
        files = json.loads(listed.read_text())
    except FileNotFoundError:
        raise StageInputError(f"no held-out list at {listed}: train has not run (or predates held-out records); "
                              "run it, or set stages.eval.prompts") from None
    if not files:
        raise StageInputError(f"train held out no records ({listed}): set stages.train.eval_records or stages.eval.prompts")
    from remote.eagle3.shards import load_sample

    prompts = []
    for name in files:
        if len(prompts) >= limit:
            break
        sample = load_sample(Path(name), mmap=True)
        trained = sample["loss_mask"].nonzero()
        if len(trained) and int(trained[0]) > 0:
            prompts.append({"input_ids": sample["input_ids"][: int(trained[0])].tolist()})
    if not prompts:
        raise StageInputError(f"none of the {len(files)} held-out records has a prompt before its first trained token")
    return prompts
