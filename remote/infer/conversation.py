"""One prompts record regenerated the way Kimi-K2.5 is used: every turn in order, with its tools.

A prompts record (`remote.prep.prompt_turns`) holds the system prompt, the user
turns and, for an agent row, each original call with the tool results that answered it. The
target is asked wherever it spoke in the row (`ask_points`): after each user turn, after each block
of tool results; each request carries the target's own earlier answers, never the dataset's. The
history sends back each answer's reasoning too: the chat template decides what to render (Kimi-K2.5's
keeps it within a chain of tool calls and drops it before the last plain answer, as it does when served).

A call of the target that matches the original call at that point (same function names, arguments
equal as JSON) gets the original tool results and the conversation goes on; any other answer where the
row called a tool, or a call where the row did not, ends the conversation after that answer (kept):
`tool call diverged`. A truncated answer (``finish_reason: length``) ends it too, kept or dropped by
``stages.infer.truncated``. Whatever is not asked is counted by reason in `Regenerated.ended`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from remote.infer.client import Answer, RequestFailed, Result
from remote.prep.prompt_turns import ask_points

#: Why a conversation ended before the row did (the keys of the manifest's and status's counts).
BEYOND_FIRST = "beyond turns: first"
DIVERGED = "tool call diverged"
TRUNCATED = "truncated"
EMPTY = "empty answer"


@dataclass
class Regenerated:
    """What became of one record: its conversation as the target wrote it, and what was not asked."""

    record: dict[str, Any]
    #: The conversation: the asked turns and the target's answers, ending with its last kept answer.
    turns: list[dict[str, Any]] = field(default_factory=list)
    #: Each kept answer's finish_reason, in order.
    finish_reasons: list[str | None] = field(default_factory=list)
    #: Where the row has the target speak (`ask_points`).
    points: int = 0
    #: Why the conversation ended before the row's end, or None.
    ended: str | None = None
    #: Truncated answers dropped (``truncated: drop``).
    dropped: int = 0
    #: The failure that left no answer at all (a refusal, a server down), or None.
    failure: RequestFailed | None = None
    retries: int = 0
    seconds: float = 0.0
    completion_tokens: int = 0
    #: The tools sent with each request (None with ``turns: first``, as infer asked before tools were sent).
    tools: list[dict[str, Any]] | None = None

    @property
    def answered(self) -> int:
        return len(self.finish_reasons)

    @property
    def left(self) -> int:
        """The row's turns not regenerated."""
        return self.points - self.answered

    def to_json(self) -> dict[str, Any]:
        """The finished record: the conversation, the row's tools, and what infer did with the row."""
        out: dict[str, Any] = {"id": self.record["id"], "conversations": self.turns}
        if self.tools:
            out["tools"] = self.tools
        out["regenerated"] = {"turns": self.points, "finish_reasons": self.finish_reasons, "ended": self.ended,
                              "dropped": self.dropped}
        return out


Ask = Callable[[dict[str, Any]], Result]


def regenerate(record: dict[str, Any], ask: Ask, turns: str = "all", truncated: str = "keep") -> Regenerated:
    """Ask for every turn of `record` in order; never raises. ``turns: first`` asks the first turn alone and
    without the row's tools: exactly the request infer made before it regenerated whole conversations."""
    prompt = record["conversations"]
    points = set(ask_points(prompt))
    out = Regenerated(record, points=len(points), tools=record.get("tools") if turns == "all" else None)
    talk = Talk()
    for i, turn in enumerate(prompt):
        if turn["role"] == "assistant":
            continue  # an original call: compared with the target's answer before it
        talk.add(turn)
        if i not in points:
            continue
        result = ask({"id": record["id"], "conversations": list(talk.history), "tools": out.tools})
        _add_costs(out, result)
        answer = result.answer
        if answer is None or not answer.says_something():
            if not out.answered or (answer is None and result.failure is not None and result.failure.retryable):
                out.failure = result.failure  # a refusal, or a server down: the record is asked again whole
                return talk.end(out, EMPTY if answer is not None else None, keep=False)
            return talk.end(out, EMPTY if answer is not None else _reason(result.failure))
        if answer.finish_reason == "length" and truncated == "drop":
            out.dropped += 1
            return talk.end(out, TRUNCATED)
        talk.answer(answer)
        out.finish_reasons.append(answer.finish_reason)
        if turns == "first":
            return talk.end(out, BEYOND_FIRST)
        original = prompt[i + 1] if i + 1 < len(prompt) and prompt[i + 1]["role"] == "assistant" else None
        if answer.tool_calls or original is not None:
            if not (original is not None and answer.tool_calls and _same_calls(answer.tool_calls, original["tool_calls"])):
                return talk.end(out, DIVERGED)
            talk.renamed = _ids(original["tool_calls"], answer.tool_calls)
        if answer.finish_reason == "length":
            return talk.end(out, TRUNCATED)
    return talk.end(out, None)


class Talk:
    """The history sent to the server, and what the record keeps of it."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.ids: dict[int, list[int]] = {}  # position of an answer in the history -> its token ids
        self.kept = 0  # the history up to the last answer kept
        self.renamed: dict[str, str] = {}  # original call id -> the target's, for the tool results that answer it

    def add(self, turn: dict[str, Any]) -> None:
        if turn["role"] == "tool" and turn.get("tool_call_id") in self.renamed:
            turn = {**turn, "tool_call_id": self.renamed[turn["tool_call_id"]]}
        self.history.append(turn)

    def answer(self, answer: Answer) -> None:
        if answer.output_ids is not None:
            self.ids[len(self.history)] = answer.output_ids
        self.history.append(answer.turn())
        self.kept = len(self.history)

    def end(self, out: Regenerated, why: str | None, keep: bool = True) -> Regenerated:
        """The conversation ends after its last kept answer (none when not `keep`: asked again whole, never
        two runs' answers in one record); `why` is said only where turns were left."""
        if not keep:
            out.finish_reasons, self.kept = [], 0
        out.turns = [{**turn, "output_ids": self.ids[j]} if j in self.ids else turn
                     for j, turn in enumerate(self.history[: self.kept])]
        out.ended = why if out.left else None
        return out


def _add_costs(out: Regenerated, result: Result) -> None:
    out.retries += result.retries
    out.seconds += result.seconds
    if result.answer is not None:
        out.completion_tokens += result.answer.completion_tokens


def _reason(failure: RequestFailed | None) -> str:
    if failure is None:
        return "no answer"
    return f"{failure.reason}: {failure.detail}" if failure.detail else failure.reason


def _same_calls(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> bool:
    """The same calls, in any order: function names equal, arguments equal as JSON."""
    return sorted(map(_call_key, mine)) == sorted(map(_call_key, theirs))


def _call_key(call: dict[str, Any]) -> str:
    arguments = call["function"].get("arguments")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # not JSON: compared as written
    return json.dumps([call["function"]["name"], parsed], sort_keys=True)


def _ids(theirs: list[dict[str, Any]], mine: list[dict[str, Any]]) -> dict[str, str]:
    """Each original call's id -> the id of the target's call that matches it."""
    free = list(mine)
    renamed = {}
    for call in theirs:
        match = next(c for c in free if _call_key(c) == _call_key(call))
        free.remove(match)
        renamed[call["id"]] = match["id"]
    return renamed
