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
    # ShareGPT-style tool calling (LLaMA-Factory's glaive conversion and its role tags): a turn
    # whose value is the JSON of the assistant's call(s), then the tool's answer.
    "function_call": "assistant",
    "tool_call": "assistant",
    "tool_calls": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
    "observation": "tool",
    "tool_response": "tool",
    "function_response": "tool",
}
#: Spellings of a turn whose text is the JSON of the assistant's tool call(s), not words.
CALL_ROLES = frozenset({"function_call", "tool_call", "tool_calls"})


def canonical_role(name: object) -> str | None:
    """The role `name` stands for, or None when the table has no such spelling."""
    if not isinstance(name, str):
        return None
    return ROLE_ALIASES.get(name.strip().lower())


def is_call_role(name: object) -> bool:
    """Whether `name` marks a turn that holds tool calls as JSON (ShareGPT's ``function_call``)."""
    return isinstance(name, str) and name.strip().lower() in CALL_ROLES
