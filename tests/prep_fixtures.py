"""Fixtures and helpers of the prep tests: the tiny Kimi-style tokenizer, built once per session.

Import the fixtures into a test module (``from tests.prep_fixtures import tiny_tokenizer``)
so pytest finds them there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from remote.prep.preparer import Prepared, Preparer
from remote.prep.prep_settings import Target
from remote.demo.tiny_tokenizer import build_tokenizer
from tests.helpers.session import built_once
from tests.needs import need
from tests.settings import prep_settings

FIXTURES = Path(__file__).parent / "fixtures" / "prep"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(request, lambda: build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer")))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path) -> Any:
    return Target(str(tiny_tokenizer_dir)).load()


def read_rows(name: str) -> list[Any]:
    """The rows of a JSONL fixture, parsed (a broken line would fail the test, on purpose)."""
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def prepare(tokenizer: Any, rows: list[Any], kind: str = "native", **settings: Any) -> Prepared:
    """One batch through prep, in this process."""
    preparer = Preparer(kind, "T", Target(), prep_settings(**settings), tokenizer)
    return preparer.process(list(enumerate(rows)))


def masked_runs(tokenizer: Any, input_ids: Any, loss_mask: Any) -> list[str]:
    """The decoded text of each run of masked tokens, in order."""
    runs, current = [], []
    for token, masked in zip(input_ids.tolist(), loss_mask.tolist()):
        if masked:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run, skip_special_tokens=False) for run in runs]


KIMI_DIR = REPO.parent / "shared" / "kimi-k2.5-tokenizer"


def kimi_tokenizer() -> Any:
    """Kimi-K2.5's real tokenizer (shared/), loaded as prep loads it; the test skips where it is absent."""
    def require() -> None:
        import tiktoken  # noqa: F401  (Kimi's tokenizer imports it)

        if not (KIMI_DIR / "tiktoken.model").is_file():
            raise FileNotFoundError(f"Kimi-K2.5's tokenizer is not at {KIMI_DIR}")

    need(require, (ImportError, FileNotFoundError), "Kimi-K2.5's tokenizer and tiktoken")
    return Target(str(KIMI_DIR), trust_remote_code=True).load()

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

#: Rows for the record-by-record checks, one per case the issue names (name -> row).
FAITHFUL_ROWS: dict[str, dict[str, Any]] = {
    "reasoning": {"id": "r", "messages": [
        {"role": "user", "content": "What is 17 * 3?"},
        {"role": "assistant", "content": "51.", "reasoning_content": "17 * 3 = 51, since 17 * 2 = 34 and 34 + 17 = 51."}]},
    "inline_thinking": {"id": "i", "conversations": [
        {"from": "human", "value": "Capital of France?"},
        {"from": "gpt", "value": "<think>The capital of France is Paris.</think>Paris."},
        {"from": "human", "value": "And of Italy?"},
        {"from": "gpt", "value": "It is Rome, of course.</think>Rome."}]},
    "multi_turn_reasoning": {"id": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "First answer.", "reasoning_content": "old thoughts about the first"},
        {"role": "user", "content": "Second question?"},
        {"role": "assistant", "content": "Second answer.", "reasoning_content": "thoughts about the second"},
        {"role": "user", "content": "Third question?"},
        {"role": "assistant", "content": "Third answer.", "reasoning_content": "new thoughts"}]},
    "tools_with_call_ids": {"id": "t", "tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Compare Oslo and Rome, then tell me about Paris."},
        {"role": "assistant", "content": "", "reasoning_content": "Two cities: two calls.", "tool_calls": [
            {"id": "call_a1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "call_b2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "call_b2", "content": "clear, 19C"},
        {"role": "tool", "tool_call_id": "call_a1", "content": "snow, 4C"},
        {"role": "assistant", "content": "Oslo is snowy, Rome clear.", "reasoning_content": "Both answered."},
        {"role": "user", "content": "And Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "One more call.", "tool_calls": [
            {"id": "call_c3", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "content": "sunny, 21C"},
        {"role": "assistant", "content": "Paris is sunny.", "reasoning_content": "Done."}]},
    "agent_ending_on_observation": {"id": "a", "messages": [
        {"role": "system", "content": "Call a tool by writing <function=NAME>...</function>."},
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "<function=bash>pytest -x</function>", "reasoning_content": "Run the tests first."},
        {"role": "user", "content": "OBSERVATION: 1 failed"},
        {"role": "assistant", "content": "<function=bash>sed -i s/a/b/ f.py</function>", "reasoning_content": "The bug is in f.py."},
        {"role": "user", "content": "OBSERVATION: done"}]},
    "special_token_strings": {"id": "s", "messages": [
        {"role": "user", "content": "What does <|im_end|> mean in <|im_assistant|>assistant<|im_middle|><think>?"},
        {"role": "assistant", "content": "It ends a turn: <|im_end|> is special.", "reasoning_content": "Explain <|im_end|> and </think>."}]},
}
#: A row with an image: kept out with a reason (the draft is text-only).
IMAGE_ROW = {"id": "img", "messages": [
    {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]},
    {"role": "assistant", "content": "A cat."}]}


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, prompt: bool, **kwargs: Any) -> str:
    """The tokenizer's own `apply_chat_template`, called the way a server calls it."""
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=prompt, **kwargs)


def own_ids(tokenizer: Any, text: str) -> list[int]:
    """The tokenizer's own encoding of `text` (what `apply_chat_template(tokenize=True)` gives)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def generated(tokenizer: Any, conversation: list[dict[str, Any]], index: int, tools: Any, **kwargs: Any) -> str:
    """What the target wrote for turn `index`: the difference of two in-context renders that keep reasoning."""
    before = render(tokenizer, conversation[:index], tools, True, preserve_thinking=True, **kwargs)
    through = render(tokenizer, conversation[: index + 1], tools, False, preserve_thinking=True, **kwargs)
    assert through.startswith(before)
    return through[len(before):]


def check_records(tokenizer: Any, prepared: Prepared, **kwargs: Any) -> dict[str, list[int]]:
    """Check every record against the tokenizer's own template and encoding; the turns each row learned.

    For each record: its ids are the own encoding of (the context the server renders for its last
    turn + that turn as generated); every masked run is some turn's generated text, right after the
    context the server rendered for that turn; nothing else is masked. Across a row's records every
    assistant turn is learned exactly once.
    """
    learned: dict[str, list[int]] = {}
    for record, tokens in zip(prepared.records, prepared.tokens):
        conversation, tools = record.conversations, record.tools
        last = len(conversation) - 1
        text = render(tokenizer, conversation[:last], tools, True, **kwargs) + generated(tokenizer, conversation, last, tools, **kwargs)
        ids = tokens.input_ids.tolist()
        assert ids == own_ids(tokenizer, text), record.id
        contexts = {render(tokenizer, conversation[:i], tools, True, **kwargs): i
                    for i, m in enumerate(conversation) if m["role"] == "assistant"}
        mask = tokens.loss_mask.tolist()
        starts = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
        for start in starts:
            end = next((k for k in range(start, len(mask)) if not mask[k]), len(mask))
            before = tokenizer.decode(ids[:start], skip_special_tokens=False)
            assert before in contexts, f"{record.id}: a masked run does not follow a context the server rendered"
            turn = contexts[before]
            assert tokenizer.decode(ids[start:end], skip_special_tokens=False) == generated(tokenizer, conversation, turn, tools, **kwargs)
            learned.setdefault(record.id.split("#")[0], []).append(turn)
    return {row: sorted(turns) for row, turns in learned.items()}


def assistant_turns(conversation: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(conversation) if m["role"] == "assistant"]


# -- rows of the shapes hub datasets hold, written here (nothing is downloaded) ---------------

#: Image rows, one per way an image arrives; each is skipped with the reason given.
IMAGE_ROWS: dict[str, tuple[dict[str, Any], str]] = {
    "llava": ({"id": "000000033471", "image": "000000033471.jpg", "conversations": [
        {"from": "human", "value": "<image>\nWhat are the colors of the bus in the image?"},
        {"from": "gpt", "value": "The bus in the image is white and red."},
        {"from": "human", "value": "What feature can be seen on the back of the bus?"},
        {"from": "gpt", "value": "The back of the bus features an advertisement."}]},
        "image in the row (field 'image')"),
    "llama_factory_mllm": ({"messages": [
        {"role": "user", "content": "<image>Who are they?"},
        {"role": "assistant", "content": "They're Kane and Gretzka from Bayern Munich."}],
        "images": ["mllm_demo_data/1.jpg"]},
        "image in the row (field 'images')"),
    "placeholder_only": ({"id": "GCC_train_002582585", "conversations": [
        {"from": "human", "value": "Provide a brief description of the given image.\n<image>"},
        {"from": "gpt", "value": "olive oil is a healthy ingredient used liberally ."}]},
        "image in the row (<image> in a user turn)"),
    "value_parts": ({"messages": [
        {"role": "user", "content": [{"type": "image_url", "value": "demo/1.jpg"}, {"type": "text", "value": "Who is this?"}],
         "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "text", "value": "A footballer."}], "loss_weight": 1.0}]},
        "image in the row (content part 'image_url')"),
    "video_field": ({"messages": [
        {"role": "user", "content": "<video>What is she doing?"},
        {"role": "assistant", "content": "She is cooking."}], "videos": ["demo/1.mp4"]},
        "video in the row (field 'videos')"),
}
#: A text-only row of a LLaVA mix: kept (no image field, no placeholder).
LLAVA_TEXT_ROW = {"id": "i6IyJda_0", "model": "", "conversations": [
    {"from": "human", "value": "How do I reverse a list in Python?"},
    {"from": "gpt", "value": "Use `items[::-1]` for a copy, or `items.reverse()` in place."}]}

#: A web agent's turns with fields prep does not use: counted, never lost silently.
AGENT_WITH_THOUGHTS = {"id": "web-17", "messages": [
    {"role": "system", "content": "You are a web agent. Answer with one action per turn."},
    {"role": "user", "content": "Find the cheapest flight from Oslo to Rome on May 3."},
    {"role": "assistant", "content": "type [12] Oslo", "thoughts": "The origin box is element 12.",
     "actions": [{"type": "type", "element": 12, "text": "Oslo"}]},
    {"role": "user", "content": "OBSERVATION: the origin box shows Oslo"},
    {"role": "assistant", "content": "click [31]", "thoughts": "Search.", "actions": [{"type": "click", "element": 31}]},
    {"role": "user", "content": "OBSERVATION: 3 results, the first at $120"},
    {"role": "assistant", "content": "stop [$120]", "thoughts": "The first result is the cheapest.", "actions": []}]}

GLAIVE_TOOLS = [{"name": "get_exchange_rate", "description": "Get the exchange rate between two currencies",
                 "parameters": {"type": "object", "properties": {
                     "base_currency": {"type": "string", "description": "The currency to convert from"},
                     "target_currency": {"type": "string", "description": "The currency to convert to"}},
                     "required": ["base_currency", "target_currency"]}}]
#: OpenAI-shaped rows whose tools differ, as a client sent them: through Arrow each tool gets the
#: other tools' keys as null (and each call's arguments the other calls' argument names).
ARROW_TOOL_ROWS = [
    {"id": "ar-1", "tools": [WEATHER_TOOL | {"function": {**WEATHER_TOOL["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}],
     "messages": [
         {"role": "user", "content": "Weather in Oslo?"},
         {"role": "assistant", "content": "", "reasoning_content": "Call get_weather.", "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "snow, -3C"},
         {"role": "assistant", "content": "Snowing, -3C.", "reasoning_content": "Answer."}]},
    {"id": "ar-2", "tools": [{"type": "function", "function": {"name": "web_search", "description": "Search the web",
                                                               "parameters": {"type": "object", "properties": {
                                                                   "query": {"type": "string"},
                                                                   "max_results": {"type": "integer", "minimum": 1}},
                                                                   "required": ["query"]}}}],
     "messages": [
         {"role": "user", "content": "Who wrote Dune?"},
         {"role": "assistant", "content": "", "reasoning_content": "Search it.", "tool_calls": [
             {"id": "call_9", "type": "function", "function": {"name": "web_search", "arguments": {"query": "Dune author", "max_results": 2}}}]},
         {"role": "tool", "tool_call_id": "call_9", "content": "Frank Herbert"},
         {"role": "assistant", "content": "Frank Herbert.", "reasoning_content": "Found."}]},
]


def through_arrow(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` as a hub dataset gives them: through `datasets.Dataset.from_list`, nested dicts unified."""
    import datasets

    return list(datasets.Dataset.from_list(rows))


def sample_rows(name: str) -> list[dict[str, Any]]:
    """The rows of inventories/samples/NAME.jsonl."""
    path = REPO / "inventories" / "samples" / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
