"""Prep's settings and the target tokenizer, read from the stage's JSON config.

The workstation validates the inventory already; these checks are for a stage
started by hand or by an older workstation, and say which key is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.prep.errors import PrepError
from remote.settings import typed

OVERLONG = ("truncate", "drop")
REASONING = ("expand", "preserve")


@dataclass(frozen=True)
class PrepSettings:
    """``stages.prep`` of the inventory, declared (with defaults and docs) in `local.inventory.stages.Prep` alone:
    the workstation sends every field (see remote/settings.py)."""

    max_length: int
    #: What to do with a record longer than `max_length`: ``truncate`` or ``drop``.
    overlong: str
    #: Kept records / rows read below this fails the stage.
    min_kept_ratio: float
    num_proc: int
    #: Records per Parquet shard.
    shard_size: int
    #: Rows handed to one tokenizer call (and one worker task).
    batch_size: int
    #: ``expand``: every assistant turn after the context the target's server rendered for it,
    #: a record of its own where a later context strips its reasoning (nothing is lost);
    #: ``preserve``: one record per row, contexts keeping earlier reasoning (`remote.prep.sequences`).
    reasoning: str
    #: What the target's server passed to its chat template (e.g. ``{"thinking": false}``); the
    #: tokenize stage takes the infer stage's.
    chat_template_kwargs: dict[str, Any]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "PrepSettings":
        settings = typed(cls, config, "prep", PrepError)
        for name in ("max_length", "num_proc", "shard_size", "batch_size"):
            value = getattr(settings, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PrepError(f"stages.prep.{name} must be a positive integer (got {value!r})")
        if settings.overlong not in OVERLONG:
            raise PrepError(f"stages.prep.overlong must be one of {', '.join(OVERLONG)} (got {settings.overlong!r})")
        if settings.reasoning not in REASONING:
            raise PrepError(f"stages.prep.reasoning must be one of {', '.join(REASONING)} (got {settings.reasoning!r})")
        if not isinstance(settings.chat_template_kwargs, dict):
            raise PrepError(f"stages.prep.chat_template_kwargs must be a mapping such as {{thinking: false}} "
                            f"(got {settings.chat_template_kwargs!r})")
        if not isinstance(settings.min_kept_ratio, (int, float)) or not 0 <= settings.min_kept_ratio <= 1:
            raise PrepError(f"stages.prep.min_kept_ratio must be between 0 and 1 (got {settings.min_kept_ratio!r})")
        return settings


@dataclass(frozen=True)
class Target:
    """The target model's tokenizer: a directory or a hub id."""

    tokenizer: str | None = None
    trust_remote_code: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any], base: Path | None = None) -> "Target":
        name = config.get("tokenizer") or config.get("model")
        if name and not Path(name).is_absolute() and (Path(base or Path.cwd()) / name).exists():
            name = str((Path(base or Path.cwd()) / name).resolve())
        return cls(name, bool(config.get("trust_remote_code", False)))

    def load(self) -> Any:
        """The tokenizer, from a local directory or the host's hub cache."""
        if not self.tokenizer:
            raise PrepError("target.tokenizer is not set: prep of a native dataset needs the target's tokenizer")
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.tokenizer, trust_remote_code=self.trust_remote_code)
        except Exception as exc:  # transformers raises OSError, ValueError, ... for the same cause
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            if "couldn't connect" in first_line:  # what transformers says offline, though it tried no network
                first_line = "not a directory here and not in the Hugging Face cache"
            hint = "" if self.trust_remote_code else " (Kimi's tokenizer needs target.trust_remote_code: true)"
            raise PrepError(f"cannot load tokenizer {self.tokenizer!r}: {first_line}{hint}") from None
