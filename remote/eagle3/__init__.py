"""EAGLE-3 on the host: hidden-state extraction and draft training.

- `layers`: what an auxiliary layer id means and which ids are valid.
- `model_config`: a model's config.json (the target's or a draft's), the one reader, one error line.
- `target`: the target model's shape and the few weights the draft needs.
- `draft_config`: the draft's config.json and the feature-width check.
- `prep_input`: the prep stage's tokenised records, checked before use.
- `shards`: the sharded hidden-state store (SpecForge's per-sample ``.ckpt``).
- `model`, `vocab`, `trainer`, `checkpoint`: the draft model, its reduced
  vocabulary, training-time-test training, SGLang-loadable checkpoints.
- `session`: one draft's training (draft, ranks, held-out measurement, reporter, resume, kept drafts),
  driven by the train stage and by the chunked route's resident trainer.
- `specforge`, `specforge_inputs`, `specforge_engine`: SpecForge's trainer instead (its config and
  command, what it reads, the run and the drafts kept from it).

The stages in `remote.stages.extract` and `remote.stages.train` put them together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from remote.vocabulary import hints


class StageInputError(Exception):
    """A mistake the user can fix (a setting, an upstream job); shown as one line, no traceback."""


def read_upstream_manifest(directory: Path, stage: str, required: tuple[str, ...]) -> dict[str, Any]:
    """An upstream stage's manifest, refused when that stage did not finish (no manifest: it is
    written last) or when an older aerie wrote it (a `required` field missing)."""
    path = directory / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageInputError(f"no {stage} manifest at {path}: {stage} has not succeeded for this dataset; "
                              f"run it first ({hints.inv('launch', stage=stage)})") from None
    except json.JSONDecodeError:
        raise StageInputError(f"{stage} manifest {path} is unreadable: rerun {stage}") from None
    if not isinstance(manifest, dict):
        raise StageInputError(f"{stage} manifest {path} is not a JSON object: rerun {stage}")
    missing = [k for k in required if manifest.get(k) in (None, "")]
    if missing:
        raise StageInputError(f"{stage} manifest {path} lacks {', '.join(missing)}: it comes from an older aerie; "
                              f"rerun {stage} on the current release")
    return manifest
