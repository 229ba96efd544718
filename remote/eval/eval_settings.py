"""The eval stage's settings (``stages.eval``), typed once from the stage's JSON config.

Declared, with their defaults and docs, in `local.inventory.Eval` alone: the
workstation sends every one, ``draft`` and ``model`` resolved (remote/settings.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from remote.eagle3 import StageInputError
from remote.settings import typed

ALGORITHM = "EAGLE3"


@dataclass(frozen=True)
class Setting:
    """One speculative configuration of the grid."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def of(cls, entry: dict[str, Any]) -> "Setting":
        return cls(int(entry["num_steps"]), int(entry["topk"]), int(entry["num_draft_tokens"]))

    def flags(self, draft: str) -> list[str]:
        """The server flags that serve `draft` with this setting."""
        return ["--speculative-algorithm", ALGORITHM, "--speculative-draft-model-path", draft,
                "--speculative-num-steps", str(self.num_steps), "--speculative-eagle-topk", str(self.topk),
                "--speculative-num-draft-tokens", str(self.num_draft_tokens)]

    def label(self) -> str:
        return f"steps {self.num_steps}, topk {self.topk}, draft tokens {self.num_draft_tokens}"



@dataclass(frozen=True)
class EvalSettings:
    """What `inv eval` reads of ``stages.eval``."""

    #: The command that starts SGLang; aerie appends --model-path, --host, --port, ...
    launcher: str
    #: --model-path (the workstation resolves an unset one to target.model).
    model: str
    port: int
    #: More launch flags, the same for every server of the comparison.
    server_args: list[str]
    server_env: dict[str, str]
    #: Seconds a server may take to answer /health.
    server_start_timeout: float
    #: --speculative-draft-model-path (the workstation resolves an unset one to train's output).
    draft: str
    #: The speculative settings tried, each against the same baseline.
    grid: list[Setting]
    #: JSONL of prompts on the host; unset: train's held-out records.
    prompts: str | None
    num_prompts: int
    max_new_tokens: int
    #: Requests in flight at once.
    concurrency: int
    #: Seconds one /generate request may take.
    request_timeout: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "EvalSettings":
        """The settings with their types; one line naming a missing key, or the draft when it is unset."""
        settings = typed(cls, config, "eval", StageInputError)
        if not settings.draft:
            raise StageInputError("stages.eval.draft is unset: run the evaluation with `inv eval`, "
                                  "which resolves it to train's output")
        return dataclasses.replace(settings, grid=[Setting.of(entry) for entry in settings.grid])
