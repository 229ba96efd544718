"""What infer asks of a prompts row: its turns to regenerate, and where the target speaks in them.

A prompts record holds the system prompt, every user turn with text and, for an agent row, each
original call (an assistant turn of its `tool_calls` alone, which infer matches the target's own
call against) and the tool results that answered it. The dataset's answers are left out: the
target writes its own (`remote.infer.conversation`).
"""

from __future__ import annotations

from typing import Any

from remote.prep.errors import Skip

#: Families whose agent writes its actions in the text, not as tool calls.
INLINE_ACTIONS = ("agent_trajectory", "swe_agent")


def prompt_turns(turns: list[dict[str, Any]], fmt: str) -> tuple[list[dict[str, Any]], int]:
    """The record's turns, and how many of the row's turns are left out (an agent's text actions); raises `Skip`."""
    conversation = _regenerated_turns(turns)
    if not fmt.startswith(INLINE_ACTIONS):
        return conversation, 0
    # NOTE: their actions are written in the text, so no answer of the target can be matched to one:
    # the observations after the first would answer actions the target never took.
    points = ask_points(conversation)
    return conversation[: points[0] + 1], len(points) - 1


def _regenerated_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What infer regenerates: the system prompt, every user turn with text, and for an agent row each
    original call (an assistant turn of its `tool_calls` alone, to match the target's own against) and
    the tool results that answered it. The dataset's answers are left out: the target writes its own
    (`remote.infer.conversation`)."""
    first = next((i for i, t in enumerate(turns) if t["role"] == "user" and t["content"].strip()), None)
    if first is None:
        raise Skip("no user turn with text")
    system = next((t for t in turns[:first] if t["role"] == "system"), None)
    out = [{"role": "system", "content": system["content"]}] if system else []
    for turn in turns[first:]:
        if turn["role"] == "user" and turn["content"].strip():
            out.append({"role": "user", "content": turn["content"]})
        elif turn["role"] == "assistant" and turn.get("tool_calls"):
            out.append({"role": "assistant", "content": "", "tool_calls": turn["tool_calls"]})
        elif turn["role"] == "tool" and out[-1]["role"] in ("assistant", "tool"):
            out.append({k: v for k, v in turn.items() if k in ("role", "content", "tool_call_id", "name")})
    while out[-1]["role"] == "assistant":  # a call never answered: nothing to regenerate after it
        out.pop()
    return out


def ask_points(turns: list[dict[str, Any]]) -> list[int]:
    """Where the target speaks in a prompts record: after each user turn and after each block of tool
    results, as indices of the turn it answers."""
    points = []
    for i, turn in enumerate(turns):
        after = turns[i + 1]["role"] if i + 1 < len(turns) else None
        if turn["role"] == "user" or (turn["role"] == "tool" and after != "tool"):
            points.append(i)
    return points
