"""Training sequences: what the target saw and wrote, for every assistant turn of a row.

The target generated each assistant turn after a context its server rendered:
``context(messages before the turn)`` with the generation prompt. Kimi's
template strips the reasoning of every assistant turn up to the last one
without tool calls, so one render of a whole row would hide most reasoning from
the loss; and training a turn on a context the target never saw teaches the
draft the wrong thing. So a sequence is one turn's context followed by that
turn, and it also trains every earlier turn whose own context and generation
appear, unchanged, at the start of it (a chat without reasoning, an agent's
chain of tool calls): a row gives one sequence when nothing is stripped, and one
more for each turn whose reasoning a later context strips ("turns expanded").

With ``stages.prep.reasoning: preserve`` contexts keep every earlier turn's
reasoning instead (``preserve_thinking``): one sequence per row, but contexts
the target's server never rendered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote.prep.normalise import says_something
from remote.prep.template import ChatTemplate, Turn

Span = tuple[int, int]


@dataclass
class Sequence:
    """One training record: its text, the spans it learns, and the messages it renders."""

    #: The messages up to and including the sequence's last turn.
    conversation: list[dict[str, Any]]
    text: str
    #: Character spans of the learned turns (reasoning, content, calls, end of turn).
    spans: list[Span] = field(default_factory=list)
    #: Character spans of the reasoning inside `spans`.
    reasoning: list[Span] = field(default_factory=list)


def sequences(template: ChatTemplate, conversation: list[dict[str, Any]], tools: list[dict] | None,
              keep_reasoning: bool = False) -> list[Sequence]:
    """The sequences that learn every assistant turn of `conversation` once, in turn order; raises `Skip`."""
    learned = [i for i, m in enumerate(conversation) if m["role"] == "assistant" and says_something(m)]
    turns = {i: template.turn(conversation, i, tools) for i in learned}
    contexts: dict[int, str] = {}

    def context(i: int) -> str:
        if i not in contexts:
            contexts[i] = template.context(conversation[:i], tools, keep_reasoning)
        return contexts[i]

    out: list[Sequence] = []
    pending = list(learned)
    while pending:
        last = pending.pop()
        text = context(last) + turns[last].text
        sequence = Sequence(conversation[: last + 1], text)
        covered = [last]
        for i in reversed(pending):
            # The cheap test first: a turn whose text is not there at all needs no render.
            if turns[i].text in text and text.startswith(context(i) + turns[i].text):
                covered.append(i)
        pending = [i for i in pending if i not in covered]
        for i in sorted(covered):
            _learn(sequence, len(context(i)), turns[i])
        out.append(sequence)
    return out[::-1]


def _learn(sequence: Sequence, start: int, turn: Turn) -> None:
    sequence.spans.append((start, start + len(turn.text)))
    if turn.reasoning:
        sequence.reasoning.append((start + turn.reasoning[0], start + turn.reasoning[1]))

