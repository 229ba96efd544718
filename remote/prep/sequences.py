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
    #: Per span, the ids the target's server generated for that turn, where infer kept them (else None).
    generated: list[list[int] | None] = field(default_factory=list)


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
        starts = {last: len(context(last))}
        found: dict[int, int] = {}
        if pending and template.prefix_stable and not any(m.get("reasoning_content") for m in conversation[:last]):
            found = _found_in_order(template, text, pending, turns, context)
            starts.update(found)
        if not found:
            for i in reversed(pending):
                # The cheap test first: a turn whose text is not there at all needs no render.
                if turns[i].text in text and text.startswith(context(i) + turns[i].text):
                    starts[i] = len(context(i))
        pending = [i for i in pending if i not in starts]
        for i in sorted(starts):
            _learn(sequence, starts[i], turns[i])
            sequence.generated.append(conversation[i].get("output_ids"))
        out.append(sequence)
    return out[::-1]


def _found_in_order(template: ChatTemplate, text: str, pending: list[int], turns: dict[int, Turn],
                    context: Any) -> dict[int, int]:
    """Where each earlier turn starts in `text`, found by searching, for a row without reasoning.

    NOTE: checking each turn's context by rendering it costs a render per turn, quadratic in an
    agent trajectory's length (8x the plain loop at 40 turns). Without reasoning there is nothing
    for Kimi's template to strip, and the template was probed to render each turn's context as the
    start of the next (`ChatTemplate.prefix_stable`), so each turn is found after the generation
    prompt, in order; the first and the last found are still checked by rendering their contexts.
    """
    starts: dict[int, int] = {}
    at = 0
    for i in pending:
        found = text.find(template.opening + turns[i].text, at)
        if found < 0:
            return {}
        starts[i] = found + len(template.opening)
        at = starts[i] + len(turns[i].text)
    for i in {pending[0], pending[-1]}:
        if context(i) != text[: starts[i]]:
            return {}  # the probe did not hold for this row: every turn is checked by rendering
    return starts


def _learn(sequence: Sequence, start: int, turn: Turn) -> None:
    sequence.spans.append((start, start + len(turn.text)))
    if turn.reasoning:
        sequence.reasoning.append((start + turn.reasoning[0], start + turn.reasoning[1]))

