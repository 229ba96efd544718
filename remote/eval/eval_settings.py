"""The eval stage's settings (``stages.eval``), typed once from the stage's JSON config.

Declared, with their defaults and docs, in `local.inventory.stages.Eval` alone: the
workstation sends every one, ``drafts`` and ``model`` resolved (remote/settings.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from remote.vocabulary import hints
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

    def slug(self) -> str:
        return f"s{self.num_steps}-k{self.topk}-d{self.num_draft_tokens}"


@dataclass(frozen=True)
class Server:
    """One server of the comparison: the baseline (no draft), or one named draft with one grid setting."""

    #: The draft's name (a key of ``stages.eval.drafts``); None: the baseline.
    draft: str | None = None
    path: str | None = None
    setting: Setting | None = None

    def flags(self) -> list[str]:
        """The speculative flags of this server; none for the baseline."""
        return self.setting.flags(self.path) if self.setting and self.path else []

    def label(self) -> str:
        return f"{self.draft}, {self.setting.label()}" if self.setting else "no speculation"

    def slug(self) -> str:
        """A file-name part: draft names are checked on the workstation as dataset names are."""
        return f"{self.draft}-{self.setting.slug()}" if self.setting else "baseline"


BASELINE = Server()


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
    #: The drafts compared, by name: their --speculative-draft-model-path (the workstation resolves
    #: an unset one to train's output, named ``draft``).
    drafts: dict[str, str]
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
        """The settings with their types; one line naming a missing key, or the drafts when they are unset."""
        if "drafts" in config and not config["drafts"]:
            raise StageInputError(f"stages.eval.drafts is unset: run the evaluation with {hints.inv('eval')}, "
                                  "which resolves it to train's output")
        settings = typed(cls, config, "eval", StageInputError)
        return dataclasses.replace(settings, grid=[Setting.of(entry) for entry in settings.grid])

    def servers(self) -> list[Server]:
        """Every server of the comparison, in order: the baseline once, then each draft with each grid setting."""
        return [BASELINE, *(Server(name, path, setting) for name, path in self.drafts.items() for setting in self.grid)]
