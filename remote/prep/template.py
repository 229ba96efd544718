"""The target's chat template, through the tokenizer's own `apply_chat_template`.

Every render goes through ``tokenizer.apply_chat_template(..., tokenize=False)``,
so a tokenizer's Python override takes part as it does when the target serves
(Kimi-K2.5's declares tools TypeScript-style and defaults ``thinking`` on), with
the ``chat_template_kwargs`` the server was given (e.g. ``thinking: false``).

What the target wrote for one assistant turn (its reasoning, content, tool calls
and end-of-turn token) is read off the template too: the turn rendered alone,
its reasoning kept (``preserve_thinking``), less the generation prompt. Two
probes at start check that this is exactly what the template renders for that
turn in a conversation; where it is not, each turn is taken as the difference
of two renders of the conversation instead (slower, same result).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import dataclass
from typing import Any

from remote.prep.errors import PrepError
from remote.prep.normalise import Skip

PROBE_USER = {"role": "user", "content": "aerie probe question 7f3a"}
PROBE_ANSWER = {"role": "assistant", "content": "aerie probe answer 9c1e", "reasoning_content": "aerie probe reasoning 4b2d"}
PROBE_CALL = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "aerie probe reasoning 5e8a",
    "tool_calls": [{"id": "aerie_probe_id_3c7b", "type": "function",
                    "function": {"name": "aerie_probe_function_6d1f", "arguments": "{}"}}],
}
#: Marker values that find a plain turn's format, and values it must hold for (`ChatTemplate._formatted`).
FORMAT_REASONING, FORMAT_CONTENT = "aerie format reasoning 2f9c", "aerie format content 8a3e"
AWKWARD_VALUES = [
    ("  spaced reasoning \n", " spaced answer  "),
    ("{{ braces }} {% raw %} <|im_end|> </think> <think>", "<|im_assistant|>assistant<|im_middle|> {x}\n\n"),
    ("", "only an answer"),
    ("", ""),
    ("reasoning only", ""),
    ("é 世界\r\n", "☃"),
]
PLAIN_TURN_KEYS = {"role", "content", "reasoning_content"}
FORMAT_CHECK_EVERY = 64
#: What keeps every turn's reasoning in a render (Kimi's name for it; other templates ignore it).
KEEP_REASONING = {"preserve_thinking": True}


@dataclass(frozen=True)
class Turn:
    """One assistant turn as the target generated it, and where its reasoning is in that text."""

    text: str
    #: (start, end) of the reasoning within `text`; None when the turn has none.
    reasoning: tuple[int, int] | None


class ChatTemplate:
    """Renders conversations the way the target's server does."""

    def __init__(self, tokenizer: Any, kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise PrepError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.tokenizer = tokenizer
        #: The server's `chat_template_kwargs` (e.g. ``{"thinking": False}``).
        self.kwargs = dict(kwargs or {})
        try:
            bare = self.render([PROBE_USER])
            prompted = self.render([PROBE_USER], generation_prompt=True)
        except Skip as skip:
            raise PrepError(f"the chat template fails on a one-question conversation: {skip.reason}") from None
        if not prompted.startswith(bare) or prompted == bare:
            raise PrepError("the chat template's generation prompt does not extend the conversation it follows")
        #: What `add_generation_prompt` appends: the context ends with it, the turn follows it.
        self.opening = prompted[len(bare):]
        self.turns_alone = self._probe_turns_alone()
        self._direct = self._probe_direct() if self.turns_alone else None
        self._formats = self._probe_formats() if self.turns_alone else None
        self._format_uses = 0
        #: Whether the template renders a call's id in place of its function's name (Kimi's ids).
        self.renders_call_ids = self._probe_call_ids()
        #: Whether, without reasoning, each turn's context is the start of every later one's.
        self.prefix_stable = self._probe_prefix_stable()

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None, generation_prompt: bool = False,
               **extra: Any) -> str:
        try:
            # NOTE: Kimi's tokenizer prints "Failed to convert tools to TypeScript style" on every render
            # whose tools its converter refuses (several renders a row): at 88,000 rows that buried the
            # log's last line, which inv status shows. Prep counts those rows (tool_declarations: json).
            with contextlib.redirect_stdout(io.StringIO()) if tools else contextlib.nullcontext():
                return self.tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt,
                    **{**self.kwargs, **extra}
                )
        except Exception as exc:  # the template's own raise_exception, or a field it cannot read
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise Skip(f"chat template error: {first_line[:80]}") from None

    def context(self, messages: list[dict[str, Any]], tools: list[dict] | None, keep_reasoning: bool = False) -> str:
        """What the server renders when the target is asked for the turn after `messages`."""
        return self.render(messages, tools, generation_prompt=True, **(KEEP_REASONING if keep_reasoning else {}))

    def turn(self, conversation: list[dict[str, Any]], index: int, tools: list[dict] | None) -> Turn:
        """What the target generated for ``conversation[index]``, reasoning included."""
        message = conversation[index]
        text = self._formatted(message)
        if text is None and self.turns_alone:
            text = self._rendered_alone(message)
        elif text is None:
            before = self.render(conversation[:index], tools, generation_prompt=True, **KEEP_REASONING)
            text = self._after_opening(self.render(conversation[: index + 1], tools, **KEEP_REASONING), before)
        reasoning = message.get("reasoning_content") or ""
        if not reasoning:
            return Turn(text, None)
        at = text.find(reasoning)
        if at < 0:
            # NOTE: loud rather than a record that silently lacks the reasoning the row holds.
            raise Skip("the chat template drops this turn's reasoning (thinking off?)")
        return Turn(text, (at, at + len(reasoning)))

    @staticmethod
    def _after_opening(rendered: str, opening: str) -> str:
        if not rendered.startswith(opening):
            raise Skip("the chat template renders an assistant turn differently from its generation prompt")
        return rendered[len(opening):]

    def _probe_turns_alone(self) -> bool:
        """Whether a turn rendered alone is exactly what the template renders for it in context."""
        try:
            for answer in (PROBE_ANSWER, PROBE_CALL):
                whole = self.render([PROBE_USER, answer], **KEEP_REASONING)
                context = self.render([PROBE_USER], generation_prompt=True, **KEEP_REASONING)
                alone = self._after_opening(self.render([answer], **KEEP_REASONING), self.opening)
                if whole != context + alone:
                    return False
        except Skip:
            return False
        return True

    def _formatted(self, message: dict[str, Any]) -> str | None:
        """A plain turn (content and reasoning only) put into the template's own text around them,
        or None where that is not known to be what the template renders.

        NOTE: rendering a lone turn costs as much as the rest of prep for a two-turn row. The text
        around a plain turn's reasoning and content is read off the template with marker values
        and checked at start against real renders of awkward values (spaces at the ends, braces,
        special-token strings, newlines); one turn in `FORMAT_CHECK_EVERY` is still rendered and
        compared, and a difference turns formats off for the rest of the run.
        """
        if self._formats is None or message.get("tool_calls") or not set(message) <= PLAIN_TURN_KEYS:
            return None
        reasoning = message.get("reasoning_content") or ""
        before, between, after = self._formats[bool(reasoning)]
        text = before + reasoning + between + message["content"] + after
        self._format_uses += 1
        if self._format_uses % FORMAT_CHECK_EVERY == 1 and text != self._rendered_alone(message):
            print("prep: WARNING: a turn rendered by the chat template differs from its format; "
                  "every later turn is rendered (slower)", file=sys.stderr)
            self._formats = None
            return None
        return text

    def _rendered_alone(self, message: dict[str, Any]) -> str:
        alone = self._direct_render([message]) if self._direct is not None else self.render([message], **KEEP_REASONING)
        return self._after_opening(alone, self.opening)

    def _probe_formats(self) -> dict[bool, tuple[str, str, str]] | None:
        """The text before, between and after a plain turn's reasoning and content, with and without
        reasoning, when it holds for every awkward probe value; else None."""
        formats: dict[bool, tuple[str, str, str]] = {}
        try:
            for with_reasoning in (True, False):
                marker = {"role": "assistant", "content": FORMAT_CONTENT}
                if with_reasoning:
                    marker["reasoning_content"] = FORMAT_REASONING
                text = self._rendered_alone(marker)
                r = text.find(FORMAT_REASONING) if with_reasoning else 0
                head = text[:r] if with_reasoning else ""
                rest = text[r + len(FORMAT_REASONING):] if with_reasoning else text
                c = rest.find(FORMAT_CONTENT)
                if c < 0 or (with_reasoning and r < 0):
                    return None
                formats[with_reasoning] = (head, rest[:c], rest[c + len(FORMAT_CONTENT):])
            for reasoning, content in AWKWARD_VALUES:
                message = {"role": "assistant", "content": content, **({"reasoning_content": reasoning} if reasoning else {})}
                before, between, after = formats[bool(reasoning)]
                if before + reasoning + between + content + after != self._rendered_alone(message):
                    return None
        except Skip:
            return None
        return formats

    def _direct_render(self, messages: list[dict[str, Any]]) -> str:
        try:
            return self._direct.render(messages=messages, tools=None, add_generation_prompt=False,
                                       **{**self._special, **self.kwargs, **KEEP_REASONING})
        except Exception as exc:
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise Skip(f"chat template error: {first_line[:80]}") from None

    def _probe_direct(self) -> Any:
        """The compiled template, when rendering a lone turn with it directly (a third of the cost of
        `apply_chat_template`, whose per-call work is for tools and documents, which a lone turn has
        none of) gives the same text as `apply_chat_template` on the probes; else None."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            self._direct = _compile_jinja_template(self.tokenizer.chat_template)
            self._special = {k: v for k, v in self.tokenizer.special_tokens_map.items() if isinstance(v, str)}
            for answer in (PROBE_ANSWER, PROBE_CALL, {"role": "assistant", "content": "aerie <|im_end|> probe"}):
                if self._direct_render([answer]) != self.render([answer], **KEEP_REASONING):
                    return None
        except Exception:  # a template transformers compiles differently, a private API moved: the sure way
            return None
        return self._direct

    def _probe_prefix_stable(self) -> bool:
        """Whether the contexts of a reasoning-free conversation's turns (system, plain answers,
        a tool call and its result) each start the next: then a row without reasoning needs one
        context render per record, not one per turn (`remote.prep.sequences`)."""
        conversation = [{"role": "system", "content": "aerie probe system"}, PROBE_USER,
                        {"role": "assistant", "content": "aerie probe answer one"}, PROBE_USER,
                        {**PROBE_CALL, "reasoning_content": ""},
                        {"role": "tool", "tool_call_id": PROBE_CALL["tool_calls"][0]["id"], "content": "aerie probe result"},
                        {"role": "assistant", "content": "aerie probe answer two"}, PROBE_USER]
        try:
            contexts = [self.context(conversation[:i], None) for i, m in enumerate(conversation) if m["role"] == "assistant"]
            last = self.context(conversation, None)
        except Skip:
            return False
        return all(last.startswith(context) for context in contexts)

    def _probe_call_ids(self) -> bool:
        try:
            text = self.render([PROBE_USER, PROBE_CALL])
        except Skip:
            return False
        call = PROBE_CALL["tool_calls"][0]
        return call["id"] in text and call["function"]["name"] not in text


def tool_declaration(text: str, tools: list[dict[str, Any]]) -> str:
    """How the context `text` declares `tools`: ``typescript`` (Kimi's ``type NAME = (_: …) => any;``,
    what its server declares for tools a client sends), ``json`` (the schemas as JSON: most templates'
    way, and Kimi's fallback when its converter fails on a schema), or ``other`` (declared some other
    way, or not at all)."""
    names = [json.dumps(tool["function"]["name"], ensure_ascii=False) for tool in tools]
    if any(f'"name":{name}' in text or f'"name": {name}' in text for name in names):
        return "json"
    if all(f"type {tool['function']['name']} = (" in text for tool in tools):
        return "typescript"
    return "other"
