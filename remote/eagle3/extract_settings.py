"""The extract stage's settings (``stages.extract``), typed once from the stage's JSON config.

Declared, with their defaults and docs, in `local.inventory.stages.Extract` alone: the
workstation sends every one (remote/settings.py). The chunked route reads the
same class for the keys it shares with extract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from remote.eagle3 import StageInputError
from remote.eagle3.extractor import DTYPES
from remote.eagle3.target_memory import ENGINES
from remote.settings import typed


@dataclass(frozen=True)
class ExtractSettings:
    """What extract reads of ``stages.extract``; ``draft_config`` is read with train's (`remote.eagle3.draft_config`)."""

    #: ``hf`` (transformers in this process) or ``sglang`` (the serving engine's capture).
    engine: str
    #: engine sglang: GPUs the target is split over (None: every GPU on the host).
    tp_size: int | None
    #: engine sglang: the command that runs Python in the host's SpecForge environment.
    specforge_python: str
    #: engine sglang: environment variables of the capture.
    specforge_env: dict[str, str]
    #: engine sglang: more fields of SGLang's ``ServerArgs``.
    sglang_args: dict[str, Any]
    #: Auxiliary layer ids as the draft's config gives them to SGLang (`remote.eagle3.layer_ids`).
    layers: list[int]
    #: The dtype the target runs and the states are stored in.
    dtype: str
    #: Records per forward pass.
    batch_size: int
    #: Records per shard.
    shard_size: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "ExtractSettings":
        """The settings, each key checked once: one line naming a missing key, the layers or the dtype."""
        settings = typed(cls, config, "extract", StageInputError)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in settings.layers):
            raise StageInputError(f"stages.extract.layers {settings.layers!r}: expected a list of layer ids, e.g. [2, 30, 58]")
        if settings.engine not in ENGINES:
            raise StageInputError(f"stages.extract.engine {settings.engine!r}: expected one of {', '.join(ENGINES)}")
        if settings.dtype not in DTYPES:
            raise StageInputError(f"stages.extract.dtype {settings.dtype!r}: expected one of {', '.join(DTYPES)}")
        return settings
