"""The infer stage's settings, read from the stage's part of ``$AERIE_CONFIG``.

The inventory validates them on the workstation (`local.inventory.stages.Infer`);
they are checked again here because the host only sees JSON, and a stage run by
hand must fail with a line naming the key, not a traceback.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from remote.settings import typed


class SettingsError(ValueError):
    """A stage setting has the wrong type or value; the message names the key."""


@dataclass(frozen=True)
class InferSettings:
    """How to reach the server and what to ask it (``stages.infer`` in the inventory)."""

    #: The server's OpenAI-compatible base, e.g. ``http://127.0.0.1:30000/v1``.
    server_url: str
    #: The ``model`` field of each request (SGLang accepts ``default``; a
    #: pinned ``transformers serve`` wants the path it serves).
    model: str
    #: Requests in flight at once: a number pins it; ``auto`` finds the level that
    #: gives the most output tokens/s (`remote.infer.autotune`).
    concurrency: int | str
    #: The most requests in flight that ``auto`` may try.
    max_concurrency: int
    #: Seconds one request may take before it counts as a timeout.
    timeout: float
    #: Extra attempts after a connection error, timeout, 5xx or 429.
    retries: int
    #: First backoff delay in seconds; doubled per attempt, with full jitter.
    backoff: float
    max_tokens: int
    temperature: float
    top_p: float
    #: Passed through to the server's chat template (Kimi-K2.5: ``{"thinking": false}``).
    chat_template_kwargs: dict[str, Any]
    #: ``all``: every turn of a prompts row answered in order (`remote.infer.conversation`); ``first``: the first.
    turns: str
    #: A turn cut at `max_tokens` (``finish_reason: length``): ``keep`` it (the conversation ends there) or ``drop`` it.
    truncated: str
    #: Ask for each answer's token ids (SGLang's ``return_token_ids``), kept in the record for tokenize.
    return_token_ids: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "InferSettings":
        """Settings from the stage config; unknown keys (``command``, ``stall_after``) are the supervisor's."""
        settings = typed(cls, config, "infer", SettingsError)  # every default is the inventory's (remote/settings.py)
        settings.check()
        return settings

    def check(self) -> None:
        if not isinstance(self.server_url, str) or not self.server_url.startswith(("http://", "https://")):
            raise SettingsError(f"stages.infer.server_url: expected an http:// or https:// URL (got {self.server_url!r})")
        if not isinstance(self.model, str) or not self.model:
            raise SettingsError(f"stages.infer.model: expected the served model's name (got {self.model!r})")
        if self.concurrency != "auto" and (not isinstance(self.concurrency, int) or isinstance(self.concurrency, bool)
                                           or self.concurrency < 1):
            raise SettingsError(f"stages.infer.concurrency: expected auto or an integer >= 1 (got {self.concurrency!r})")
        for name, minimum in (("max_concurrency", 1), ("retries", 0), ("max_tokens", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise SettingsError(f"stages.infer.{name}: expected an integer >= {minimum} (got {value!r})")
        for name in ("timeout", "backoff", "temperature", "top_p"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise SettingsError(f"stages.infer.{name}: expected a number >= 0 (got {value!r})")
        if self.timeout == 0:
            raise SettingsError("stages.infer.timeout: expected a number of seconds > 0 (got 0)")
        for name, allowed in (("turns", ("all", "first")), ("truncated", ("keep", "drop"))):
            if getattr(self, name) not in allowed:
                raise SettingsError(f"stages.infer.{name}: expected one of {', '.join(allowed)} (got {getattr(self, name)!r})")
        if not isinstance(self.return_token_ids, bool):
            raise SettingsError(f"stages.infer.return_token_ids: expected true or false (got {self.return_token_ids!r})")
        if not isinstance(self.chat_template_kwargs, dict):
            raise SettingsError(
                f"stages.infer.chat_template_kwargs: expected a mapping such as {{thinking: false}} "
                f"(got {self.chat_template_kwargs!r})"
            )

    @property
    def is_auto(self) -> bool:
        return self.concurrency == "auto"

    def sampling(self) -> dict[str, Any]:
        """The settings that shape the answers: a journal made with others must not be continued."""
        keep = ("model", "max_tokens", "temperature", "top_p", "chat_template_kwargs", "turns", "truncated",
                "return_token_ids")
        return {k: v for k, v in asdict(self).items() if k in keep}
