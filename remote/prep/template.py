"""The target's chat template, and where in its output the assistant turns are.

Kimi's template has no ``{% generation %}`` markers, so the spans are derived
from the template itself. Two probe renders tell what opens an assistant turn
(the generation prompt: what ``add_generation_prompt`` appends) and what closes
it (what follows an assistant message's content). A conversation is then
rendered once and cut at those markers; each cut is checked against the
message it should hold. When the check fails (a template that renders turns
differently in context, a message that contains a marker) the spans are found
the slow way, by rendering the conversation's prefixes, and when that fails too
the record is skipped with a reason: a wrong mask is worse than a lost record.

A span runs from just after the turn's opening marker to the end of its
closing marker, so it holds what the target generated for that turn:
reasoning, content, tool calls and the end-of-turn token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from remote.prep.errors import PrepError
from remote.prep.normalise import Skip

PROBE_USER = "aerie probe question 7f3a"
PROBE_ANSWER = "aerie probe answer 9c1e"


@dataclass(frozen=True)
class Markers:
    """What opens and closes an assistant turn, as the template renders them."""

    opening: str
    closing: str


class ChatTemplate:
    """Renders conversations with a tokenizer's chat template and finds the assistant spans."""

    def __init__(self, tokenizer: Any) -> None:
        template = tokenizer.chat_template
        if isinstance(template, dict):  # named templates: the default one is for chat
            template = template.get("default")
        if not template:
            raise PrepError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self._compiled = _compile(template)
        # The template may refer to bos_token and friends, as apply_chat_template allows.
        self._extra = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self.markers = self._probe()

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None, generation_prompt: bool = False) -> str:
        try:
            return self._compiled.render(
                messages=messages, tools=tools, documents=None, add_generation_prompt=generation_prompt, **self._extra
            )
        except Exception as exc:  # the template's own raise_exception, or a field it cannot read
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise Skip(f"chat template error: {first_line[:80]}") from None

    def render_with_spans(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the (start, end) character span of each assistant turn."""
        text = self.render(messages, tools)
        spans = self._spans_by_markers(text, messages) if self.markers else None
        if spans is None:
            spans = self._spans_by_prefixes(text, messages, tools)
        return text, spans

    def _probe(self) -> Markers | None:
        user = [{"role": "user", "content": PROBE_USER}]
        try:
            bare = self.render(user)
            prompted = self.render(user, generation_prompt=True)
            answered = self.render(user + [{"role": "assistant", "content": PROBE_ANSWER}])
        except Skip as skip:
            raise PrepError(f"the chat template fails on a one-question conversation: {skip.reason}") from None
        opening = prompted[len(bare) :] if prompted.startswith(bare) else ""
        at = answered.rfind(PROBE_ANSWER)
        closing = answered[at + len(PROBE_ANSWER) :].rstrip() if at >= 0 else ""
        if not opening or not closing or answered.rfind(opening, 0, at) < 0:
            return None  # every record then takes the prefix way
        return Markers(opening, closing)

    def _spans_by_markers(self, text: str, messages: list[dict[str, Any]]) -> list[tuple[int, int]] | None:
        """Cut `text` at the markers; None unless each cut holds its message."""
        opening, closing = self.markers.opening, self.markers.closing
        answers = [m for m in messages if m["role"] == "assistant"]
        if text.count(opening) != len(answers):
            return None
        spans, at = [], 0
        for message in answers:
            start = text.find(opening, at) + len(opening)
            end = text.find(closing, start)
            if end < 0:
                return None
            at = end + len(closing)
            if not _holds(text[start:at], message) or opening in text[start:at]:
                return None
            spans.append((start, at))
        return spans

    def _spans_by_prefixes(
        self, text: str, messages: list[dict[str, Any]], tools: list[dict] | None
    ) -> list[tuple[int, int]]:
        """Each assistant turn as the difference of two prefix renders (slow, but needs no markers)."""
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i], tools, generation_prompt=True)
            through = self.render(messages[: i + 1], tools).rstrip()
            if not (through.startswith(before) and text.startswith(through)) or not _holds(through[len(before) :], message):
                raise Skip("assistant turn not found in the chat template's output")
            spans.append((len(before), len(through)))
        return spans


def _holds(span: str, message: dict[str, Any]) -> bool:
    """Whether `span` plausibly renders `message`: its text, or else its first tool call's name."""
    content = message["content"].strip()
    if content:
        return content in span
    calls = message.get("tool_calls") or []
    return not calls or calls[0]["function"]["name"] in span


def _compile(template: str) -> Any:
    # NOTE: transformers' own compiler, so the template sees the same globals and
    # filters (raise_exception, tojson, strftime_now) as under apply_chat_template;
    # calling the compiled template directly skips per-call copying that costs
    # a third of the render time.
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template)
