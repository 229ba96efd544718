"""The train stage's settings (``stages.train``), typed once from the stage's JSON config.

Declared, with their defaults and docs, in `local.inventory.stages.Train` alone: the
workstation sends every one (remote/settings.py). Both engines and the chunked
route (`remote.orchestration.chunked`, `remote.orchestration.resident`) read this one class.

Not here: the optional settings that are unset unless given (``draft_config``,
read with extract's by `remote.eagle3.draft_config`; ``specforge_dir``,
``specforge_train_data``, ``specforge_mooncake``), and the chunked driver's own
``schedule_steps`` and ``chunk_pass``, which no inventory has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from remote.eagle3 import StageInputError
from remote.settings import typed

ENGINES = ("aerie", "specforge")
#: Where training's curves go besides training.png (`remote.eagle3.reporting`).
REPORTERS = ("none", "tensorboard", "wandb")


@dataclass(frozen=True)
class TrainSettings:
    """What the train stage reads of ``stages.train`` (the docs are `local.inventory.stages.Train`'s)."""

    #: ``aerie`` (`remote.stages.train`, plain torch) or ``specforge`` (`remote.eagle3.specforge`).
    engine: str
    #: The reduced vocabulary, capped at the target's.
    draft_vocab_size: int
    epochs: int
    learning_rate: float
    batch_size: int
    ttt_steps: int
    #: Tokens per record used in training.
    max_length: int
    #: Optimizer steps between resume checkpoints (SpecForge's ``training.save_interval``).
    checkpoint_every: int
    #: Records held out of training (0: none; None: `eval_fraction` of them).
    eval_records: int | None
    eval_fraction: float
    #: Draft steps of the held-out acceptance length.
    eval_steps: int
    #: Legacy SpecForge's chat template.
    chat_template: str
    #: Training processes, either engine's (`remote.eagle3.distributed`); None: every visible GPU.
    nproc: int | None
    #: With `init_draft`: the share of the optimizer steps the learning rate rises over.
    warmup_fraction: float
    #: Online SpecForge: the SGLang capture servers' URLs.
    specforge_server_urls: list[str]
    #: Merged into SpecForge's ``deployment:``.
    specforge_deployment: dict[str, Any]
    #: ``none``, ``tensorboard`` or ``wandb``: `remote.eagle3.reporting` (aerie), SpecForge's ``tracking.report_to``.
    report_to: str
    #: A draft directory to continue from (`remote.eagle3.init_draft`); None: a new draft.
    init_draft: str | None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "TrainSettings":
        """The settings with their types; one line naming a missing key or an unknown engine."""
        settings = typed(cls, config, "train", StageInputError)
        if settings.engine not in ENGINES:
            raise StageInputError(f"stages.train.engine {settings.engine!r}: expected one of {', '.join(ENGINES)}")
        if settings.report_to not in REPORTERS:
            raise StageInputError(f"stages.train.report_to {settings.report_to!r}: expected one of {', '.join(REPORTERS)}")
        return settings

    def warmup_steps(self, total_steps: int) -> int:
        """The optimizer steps of the learning rate's rise: a warm start's only (a new draft has nothing to undo)."""
        import math

        return math.ceil(self.warmup_fraction * total_steps) if self.init_draft else 0
