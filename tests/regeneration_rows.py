"""Dataset rows of the kinds infer regenerates, as a prompts dataset holds them, and the prompts prep makes
of them: a five-turn chat, an agent row whose call the target matches, one whose call it does not, and a
chat with a turn the target answers past max_tokens (see `tests.infer_fixtures.echo_target`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from remote.prep.normalise import normalise

WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]


def five_turns() -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are terse."}]
    for k in range(1, 6):
        messages += [{"role": "user", "content": f"question {k}"}, {"role": "assistant", "content": f"ORIGINAL {k}"}]
    return {"prompt_id": "chat5", "messages": messages}


def agent(row_id: str, asked_city: str) -> dict[str, Any]:
    """The user asks for `asked_city`'s weather; the row's own agent called for Lima's."""
    call = {"id": "orig_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
    return {"id": row_id, "tools": WEATHER, "messages": [
        {"role": "user", "content": f'call get_weather {{"city": "{asked_city}"}}'},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "orig_1", "content": "22 C"},
        {"role": "assistant", "content": "ORIGINAL: it is 22 C."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "ORIGINAL: welcome."}]}


def long_second_turn() -> dict[str, Any]:
    return {"id": "long", "conversations": [
        {"from": "human", "value": "first"}, {"from": "gpt", "value": "ORIGINAL"},
        {"from": "human", "value": "second [long]"}, {"from": "gpt", "value": "ORIGINAL"},
        {"from": "human", "value": "third"}, {"from": "gpt", "value": "ORIGINAL"}]}


def rows() -> list[dict[str, Any]]:
    return [five_turns(), agent("matching", "Lima"), agent("diverging", "Quito"), long_second_turn()]


def prompts(raw: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """What prep writes for `raw` (default: `rows()`) as a prompts dataset."""
    return [normalise(row, i, kind="prompts").to_json() for i, row in enumerate(raw or rows())]


def write_rows(path: Path, raw: list[dict[str, Any]] | None = None) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in raw or rows()))
    return path
