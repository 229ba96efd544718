"""The one table of role names: every spelling a dataset uses, to the four roles templates know."""

from __future__ import annotations

ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "prompter": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "ai": "assistant",
    "bot": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    # LLaMA-Factory's ShareGPT variant: the assistant's call and the tool's answer.
    "function_call": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
    "tool_response": "tool",
}


def canonical_role(name: object) -> str | None:
    """The role `name` stands for, or None when the table has no such spelling."""
    if not isinstance(name, str):
        return None
    return ROLE_ALIASES.get(name.strip().lower())
