"""Rows of any known family to one record: ``{"id", "conversations", "tools"?}``.

The format is detected per row, because real datasets mix them. A row that
nothing maps raises `Skip` with a reason a person can act on (``unknown role
'narrator'``); the caller counts reasons, so no row disappears silently.

Rows that come through Arrow (hub datasets, Parquet) carry every column of
the unified schema, absent ones as None, so "missing" here always means
"missing or None".
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from remote.prep.content import Content, placeholder_media, read_content, row_media
from remote.prep.errors import Skip
from remote.prep.prompt_turns import prompt_turns
from remote.prep.roles import canonical_role, is_call_role
from remote.prep.tools import normalise_tools, tool_calls

#: Fields that hold a row's own id, in order of preference.
ID_FIELDS = ("id", "prompt_id", "conversation_id", "instance_id", "uuid", "idx")
#: Prompt-only families: the prompt field and the family's name.
PROMPT_FIELDS = (("instruction", "alpaca"), ("prompt", "prompt"), ("question", "question"), ("problem", "problem"))
#: Where those families keep an answer, when they have one.
ANSWER_FIELDS = ("output", "response", "completion", "answer", "solution")
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
CONTENT_FIELDS = ("content", "value", "text")
#: The fields of a turn prep reads, by role; any other that holds something is counted as dropped.
TURN_FIELDS = frozenset({"role", "from", *CONTENT_FIELDS})
USED_FIELDS = {"assistant": TURN_FIELDS | {*REASONING_FIELDS, "tool_calls", "function_call", "output_ids"},
               "tool": TURN_FIELDS | {"tool_call_id", "name"}}
SWE_AGENT_FIELDS = frozenset({"role", "text", "system_prompt"})
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class Record:
    """One normalised conversation, in the layout SpecForge's loader reads."""

    id: str
    conversations: list[dict[str, Any]]
    #: Tool schemas offered to the model, when the row has them.
    tools: list[dict[str, Any]] | None = None
    #: The family the row was detected as (not written to the record).
    format: str = field(default="", compare=False)
    #: Fields of its turns that prep does not use (``thoughts``, ``actions``), by name: turns that held one.
    dropped: Counter = field(default_factory=Counter, compare=False)
    #: Prompts only: turns of the row not asked for (an agent's actions written in its text).
    left_out: int = field(default=0, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "conversations": self.conversations}
        if self.tools:
            out["tools"] = self.tools
        return out


def normalise(row: Any, index: int, kind: str = "native", dataset: str = "") -> Record:
    """The record for `row` (the `index`-th of its dataset); raises `Skip`."""
    if not isinstance(row, dict):
        raise Skip(f"row is not an object ({type(row).__name__})")
    dropped: Counter = Counter()
    fmt, turns = _detect(row, dropped)
    media = row_media(row) or placeholder_media(turns)
    if media:
        raise Skip(media)
    turns = _merge_calls(turns)
    system = row.get("system")
    if isinstance(system, str) and system.strip() and not any(t["role"] == "system" for t in turns):
        turns.insert(0, {"role": "system", "content": system})
    for turn in turns:
        if turn["role"] == "assistant":
            _split_inline_reasoning(turn)
    record = Record(_row_id(row, index, dataset), turns, normalise_tools(row.get("tools")), fmt, dropped)
    if kind == "prompts":
        record.conversations, record.left_out = prompt_turns(turns, fmt)
    else:
        record.conversations = _native_turns(turns)
    return record


def _detect(row: dict[str, Any], dropped: Counter) -> tuple[str, list[dict[str, Any]]]:
    """The row's family and its turns, canonical roles already applied."""
    as_text = False
    for key in ("trajectory", "messages", "conversations", "conversation"):
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            value, as_text = _json_field(value, key), True
        if not isinstance(value, list):
            raise Skip(f"field {key!r} is not a list")
        suffix = "+json_text" if as_text else ""
        if key == "trajectory":
            return "swe_agent" + suffix, _swe_agent_turns(value, dropped)
        turns = [_turn(raw, i, dropped) for i, raw in enumerate(value)]
        turns = [t for t in turns if t is not None]
        if key == "messages":
            return _messages_family(row, turns) + suffix, turns
        return _conversations_family(row, value) + suffix, turns
    for key, family in PROMPT_FIELDS:
        value = row.get(key)
        if isinstance(value, list):  # a prompt given as messages
            turns = [t for t in (_turn(raw, i, dropped) for i, raw in enumerate(value)) if t is not None]
            return family + "_messages", turns + _answer_turn(row)
        if isinstance(value, str):
            return family, _prompt_pair(row, key, value)
    keys = ", ".join(sorted(str(k) for k in row)[:6])
    raise Skip(f"no conversations field (keys: {keys})")


def _messages_family(row: dict[str, Any], turns: list[dict[str, Any]]) -> str:
    if row.get("prompt_id") is not None:
        return "ultrachat"
    if any(t["role"] == "assistant" and "<function=" in t["content"] for t in turns):
        return "agent_trajectory"
    if any(t.get("tool_calls") or t["role"] == "tool" for t in turns):
        return "openai_tools"
    return "openai"


def _conversations_family(row: dict[str, Any], raw_turns: list[Any]) -> str:
    if any(isinstance(t, dict) and is_call_role(t.get("from")) for t in raw_turns):
        return "sharegpt_tools"
    if isinstance(row.get("system"), str):
        return "openthoughts"
    if any(isinstance(t, dict) and t.get("from") is not None for t in raw_turns):
        return "sharegpt"
    return "specforge"  # role/content turns: SpecForge's layout, as the infer stage writes it


def _swe_agent_turns(items: list[Any], dropped: Counter) -> list[dict[str, Any]]:
    """SWE-agent's ``{role: system|ai|user, text, system_prompt}`` items."""
    turns = []
    for item in items:
        if not isinstance(item, dict):
            raise Skip("trajectory item is not an object")
        role = _role(item.get("role"))
        _count_dropped(item, SWE_AGENT_FIELDS, dropped)
        text = item.get("text")
        # NOTE: the system item keeps its prompt in `system_prompt` and has text None.
        if text is None and role == "system":
            text = item.get("system_prompt")
        if text is None:
            continue
        turns.append({"role": role, "content": _content(text)})
    return turns


def _turn(raw: Any, position: int, dropped: Counter) -> dict[str, Any] | None:
    """One turn in OpenAI shape; None for an empty system turn, which says nothing."""
    if not isinstance(raw, dict):
        raise Skip("turn is not an object")
    name = raw.get("role") if raw.get("role") is not None else raw.get("from")
    if name is None:
        raise Skip("turn without a role")
    role = _role(name)
    _count_dropped(raw, USED_FIELDS.get(role, TURN_FIELDS), dropped)
    value = next((raw[k] for k in CONTENT_FIELDS if raw.get(k) is not None), None)
    if is_call_role(name):  # ShareGPT's `function_call`: the value is the call(s), as JSON text
        content = Content(calls=_call_turn(value, name))
    else:
        content = read_content(value)
    if role != "assistant" and (content.reasoning or content.calls):
        raise Skip(f"a reasoning or tool-call content part in a {role} turn")
    turn: dict[str, Any] = {"role": role, "content": content.text}
    if role == "assistant":
        reasoning = next((raw[k] for k in REASONING_FIELDS if isinstance(raw.get(k), str)), None) or content.reasoning
        if reasoning:
            turn["reasoning_content"] = reasoning
        calls = raw.get("tool_calls")
        if calls is None and isinstance(raw.get("function_call"), (dict, str)):
            calls = [raw["function_call"]]  # OpenAI's older single-call field
        calls = _call_list(calls) + content.calls
        if calls:
            turn["tool_calls"] = tool_calls(calls, position)
        if isinstance(raw.get("output_ids"), list):  # the ids infer's server generated (`remote.prep.server_ids`)
            turn["output_ids"] = raw["output_ids"]
    if role == "tool":
        for key in ("tool_call_id", "name"):
            if raw.get(key) is not None:
                turn[key] = str(raw[key])
    if role == "system" and not turn["content"].strip():
        return None
    return turn


def _call_turn(value: Any, name: str) -> list[Any]:
    """The calls of a ShareGPT ``function_call`` turn: ``{"name", "arguments"}`` or a list of them,
    as JSON text (or already parsed)."""
    calls = value
    if isinstance(value, str):
        try:
            calls = json.loads(value)
        except json.JSONDecodeError:
            calls = None
    if not isinstance(calls, (dict, list)) or not calls:
        raise Skip(f"a {name!r} turn is not the JSON of a tool call")
    return calls if isinstance(calls, list) else [calls]


def _call_list(calls: Any) -> list[Any]:
    """A turn's `tool_calls` field as a list (JSON text parsed), for the calls of its parts to follow."""
    if calls is None:
        return []
    if isinstance(calls, str):
        calls = _json_field(calls, "tool_calls")
    if isinstance(calls, dict):
        return [calls]
    if not isinstance(calls, list):
        raise Skip("tool_calls is not a list")
    return calls


def _merge_calls(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A turn of tool calls alone, right after an assistant turn, joined to it: one generation
    (words, then the calls section) that a conversion split in two (ShareGPT's `gpt` then
    `function_call`, or several `function_call` turns for parallel calls)."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        before = out[-1] if out else None
        calls_only = (turn["role"] == "assistant" and turn.get("tool_calls") and not turn["content"]
                      and not turn.get("reasoning_content"))
        if calls_only and before is not None and before["role"] == "assistant":
            out[-1] = {**before, "tool_calls": (before.get("tool_calls") or []) + turn["tool_calls"]}
            continue
        out.append(turn)
    return out


def _count_dropped(raw: dict[str, Any], used: frozenset[str], dropped: Counter) -> None:
    """Count the fields of a turn that prep does not use and that hold something (through Arrow every
    turn has every turn's fields, as None: those hold nothing)."""
    for key in raw.keys() - used:
        if raw[key] not in (None, "", [], {}):
            dropped[str(key)] += 1


def _split_inline_reasoning(turn: dict[str, Any]) -> None:
    """Reasoning written inline in the content (a server without a reasoning parser) moved to
    `reasoning_content`, where the chat template expects it.

    ``<think>R</think>A`` and, as Kimi writes it after a prompt that already opened
    ``<think>``, ``R</think>A``: R is the reasoning and A, exactly as written, the content.
    """
    content = turn["content"]
    if turn.get("reasoning_content") or THINK_CLOSE not in content:
        return
    head, _, answer = content.partition(THINK_CLOSE)
    stripped = head.lstrip()
    if stripped.startswith(THINK_OPEN):
        head = stripped[len(THINK_OPEN):]
    elif THINK_OPEN in head:
        return  # `<think>` in the middle of the text: not a reasoning block, leave it as written
    turn["content"] = answer
    if head:
        turn["reasoning_content"] = head


def _role(name: Any) -> str:
    role = canonical_role(name)
    if role is None:
        raise Skip(f"unknown role {name!r}")
    return role


def _content(value: Any) -> str:
    """Text of a turn that can hold only text (SWE-agent's items)."""
    content = read_content(value)
    if content.reasoning or content.calls:
        raise Skip("a reasoning or tool-call content part where only text is read")
    return content.text


def _prompt_pair(row: dict[str, Any], key: str, prompt: str) -> list[dict[str, Any]]:
    """Alpaca-style ``instruction`` (+ ``input``), or ``prompt``/``question``/``problem``, and any answer."""
    extra = row.get("input") if key == "instruction" else None
    text = f"{prompt}\n\n{extra}" if isinstance(extra, str) and extra.strip() else prompt
    return [{"role": "user", "content": text}] + _answer_turn(row)


def _answer_turn(row: dict[str, Any]) -> list[dict[str, Any]]:
    answer = next((row[k] for k in ANSWER_FIELDS if isinstance(row.get(k), str) and row[k].strip()), None)
    return [{"role": "assistant", "content": answer}] if answer else []


def _native_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns to train on: up to the last assistant turn."""
    last = max((i for i, t in enumerate(turns) if t["role"] == "assistant" and says_something(t)), default=-1)
    if last < 0:
        raise Skip("no assistant turn")
    # NOTE: turns after the last assistant turn (an agent's final observation)
    # carry no loss, so they are cut rather than tokenised for nothing.
    return turns[: last + 1]


def says_something(turn: dict[str, Any]) -> bool:
    return bool(turn["content"].strip() or turn.get("tool_calls") or turn.get("reasoning_content"))


def _row_id(row: dict[str, Any], index: int, dataset: str) -> str:
    for key in ID_FIELDS:
        value = row.get(key)
        if value is not None and not isinstance(value, (dict, list)):
            return str(value)
    return f"{dataset}-{index}" if dataset else str(index)


def _json_field(text: str, key: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise Skip(f"field {key!r} is text but not JSON") from None
