"""Tool-call ids as Kimi writes them: ``functions.NAME:IDX``.

Kimi's chat template renders a call's id where other templates render the
function's name, so the id is what the target generated: Kimi names its calls
``functions.NAME:IDX``, IDX counting the calls of the conversation from 0. Rows
from other servers carry ids such as ``call_abc123``; rendered as they are, the
draft would learn ids the target never writes (and the function's name would
appear nowhere). They are rewritten, and so are the ``tool_call_id`` of the tool
results that answer them; a result without an id (ShareGPT observations)
answers the oldest call not answered yet.
"""

from __future__ import annotations

import re
from typing import Any

KIMI_ID = re.compile(r"functions\.(?P<name>.+):(?P<index>\d+)")


def is_kimi_id(call: dict[str, Any]) -> bool:
    match = KIMI_ID.fullmatch(call.get("id") or "")
    return bool(match) and match["name"] == call["function"]["name"]


def kimi_ids(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`conversation` with every tool call and tool result on Kimi's ids (a new list; unchanged
    when every call already has one)."""
    calls = [call for turn in conversation for call in turn.get("tool_calls") or []]
    if all(is_kimi_id(call) for call in calls) and all(
        turn.get("tool_call_id") for turn in conversation if turn["role"] == "tool"
    ):
        return conversation
    renamed: dict[str, str] = {}
    unanswered: list[str] = []
    out, counter = [], 0
    for turn in conversation:
        if turn.get("tool_calls"):
            new_calls = []
            for call in turn["tool_calls"]:
                new_id = call["id"] if is_kimi_id(call) else f"functions.{call['function']['name']}:{counter}"
                counter += 1
                renamed.setdefault(call["id"], new_id)
                unanswered.append(new_id)
                new_calls.append({**call, "id": new_id})
            turn = {**turn, "tool_calls": new_calls}
        elif turn["role"] == "tool":
            answered = renamed.get(turn.get("tool_call_id") or "") or (unanswered[0] if unanswered else None)
            if answered is not None:
                turn = {**turn, "tool_call_id": answered}
                if answered in unanswered:
                    unanswered.remove(answered)
        out.append(turn)
    return out
