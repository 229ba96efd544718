"""Rows of the shapes public hub datasets hold, written here: tool-call families, content parts with
their text under `value`, tool schemas with Arrow's nulls, and images however they arrive.

The normalise checks need nothing; the record checks run against Kimi-K2.5's real tokenizer
(`../shared/kimi-k2.5-tokenizer`, skipped where it is absent, as in test_prep_kimi.py).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from remote.prep.normalise import Skip, normalise
from remote.prep.template import tool_declaration
from remote.prep.tools import normalise_tools, without_nulls
from tests.prep_fixtures import (
    kimi_tokenizer,
    AGENT_WITH_THOUGHTS, ARROW_TOOL_ROWS, GLAIVE_TOOLS, IMAGE_ROWS, LLAVA_TEXT_ROW, assistant_turns,
    check_records, masked_runs, prepare, sample_rows, through_arrow,
)

FAMILIES = ["glaive_toolcall", "reasoning_tool_parts"]


@pytest.fixture(scope="module")
def kimi() -> Any:
    return kimi_tokenizer()


# -- ShareGPT-style tool calling (LLaMA-Factory's glaive conversion) --------------------------


def test_a_function_call_turn_becomes_the_assistants_tool_call_and_the_observation_its_result():
    record = normalise(sample_rows("glaive_toolcall")[0], 0)
    assert record.format == "sharegpt_tools"
    user, call, result, answer = record.conversations[:4]
    assert user == {"role": "user", "content": "Hi, I need to know the exchange rate from USD to EUR."}
    assert call == {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1_0", "type": "function",
        "function": {"name": "get_exchange_rate", "arguments": '{"base_currency": "USD", "target_currency": "EUR"}'}}]}
    assert result == {"role": "tool", "content": '{"exchange_rate": 0.85}'}
    assert answer == {"role": "assistant", "content": "The current exchange rate from USD to EUR is 0.85."}


def test_the_tools_json_text_of_bare_schemas_is_parsed_and_wrapped_as_a_client_sends_them():
    record = normalise(sample_rows("glaive_toolcall")[0], 0)
    assert record.tools == [{"type": "function", "function": GLAIVE_TOOLS[0]}]


def test_a_function_call_turn_holding_a_list_gives_parallel_calls():
    record = normalise(sample_rows("glaive_toolcall")[1], 1)
    calls = record.conversations[1]["tool_calls"]
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("call_1_0", {"country": "United States"}), ("call_1_1", {"country": "Japan"})]


def test_words_then_a_function_call_turn_are_one_generation():
    row = {"conversations": [
        {"from": "human", "value": "Rate USD to EUR?"},
        {"from": "gpt", "value": "Let me check."},
        {"from": "function_call", "value": '{"name": "get_exchange_rate", "arguments": {"base_currency": "USD"}}'},
        {"from": "function_call", "value": '{"name": "get_exchange_rate", "arguments": {"base_currency": "EUR"}}'},
        {"from": "observation", "value": "0.85"}, {"from": "observation", "value": "1.18"},
        {"from": "gpt", "value": "0.85."}]}
    turns = normalise(row, 0).conversations
    assert [t["role"] for t in turns] == ["user", "assistant", "tool", "tool", "assistant"]
    assert turns[1]["content"] == "Let me check."
    assert [c["id"] for c in turns[1]["tool_calls"]] == ["call_2_0", "call_3_0"]


@pytest.mark.parametrize("tag", ["function_call", "tool_call", "Function_Call"])
def test_every_spelling_of_the_call_tag_is_a_tool_call(tag):
    row = {"conversations": [{"from": "human", "value": "q"},
                             {"from": tag, "value": '{"name": "f", "arguments": "{}"}'}, {"from": "observation", "value": "r"},
                             {"from": "gpt", "value": "a"}]}
    assert normalise(row, 0).conversations[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize("value", ["get_rate(USD)", "[]", "7", None])
def test_a_function_call_turn_that_is_not_the_json_of_a_call_is_a_named_skip(value):
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": value}]}
    with pytest.raises(Skip, match=r"^a 'function_call' turn is not the JSON of a tool call$"):
        normalise(row, 0)


def test_llama_factory_role_tags_on_openai_messages_give_the_same_calls_and_results():
    row = {"messages": [{"role": "user", "content": "q"},
                        {"role": "function_call", "content": '{"name": "f", "arguments": {"x": 1}}'},
                        {"role": "observation", "content": "r"}, {"role": "assistant", "content": "a"}]}
    record = normalise(row, 0)
    assert record.format == "openai_tools"
    assert [t["role"] for t in record.conversations] == ["user", "assistant", "tool", "assistant"]
    assert record.conversations[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_a_function_call_turn_whose_value_is_already_an_object_is_read_too():
    row = {"conversations": [{"from": "human", "value": "q"},
                             {"from": "function_call", "value": {"name": "f", "arguments": {"x": 1}}}]}
    assert normalise(row, 0).conversations[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


# -- content parts ------------------------------------------------------------------------------


def test_parts_with_their_text_under_value_give_text_reasoning_and_tool_calls():
    record = normalise(sample_rows("reasoning_tool_parts")[0], 0)
    system, user, call, result, answer = record.conversations
    assert system == {"role": "system", "content": "You are a helpful assistant with tools."}
    assert user["content"] == "Should I take an umbrella in Paris today?"
    assert call == {"role": "assistant", "content": "",
                    "reasoning_content": "The user asks about rain in Paris; I need the current weather.",
                    "tool_calls": [{"id": "call_2_0", "type": "function", "function": {
                        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]}
    assert result == {"role": "tool", "content": '{"sky": "rain", "temp_c": 14}'}
    assert answer == {"role": "assistant", "content": "Yes: it is raining in Paris (14°C). Take an umbrella.",
                      "reasoning_content": "It is raining, 14C: yes, an umbrella."}


@pytest.mark.parametrize("key", ["text", "value", "content"])
def test_a_text_part_is_read_whichever_key_holds_its_text(key):
    row = {"messages": [{"role": "user", "content": [{"type": "text", key: "hi"}]},
                        {"role": "assistant", "content": [{"type": "output_text", key: "hello"}]}]}
    assert [t["content"] for t in normalise(row, 0).conversations] == ["hi", "hello"]


def test_thinking_and_refusal_parts_under_their_own_keys_are_reasoning_and_words():
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Not allowed."}, {"type": "refusal", "refusal": "I can't help with that."}]}]}
    assert normalise(row, 0).conversations[1] == {"role": "assistant", "content": "I can't help with that.",
                                                  "reasoning_content": "Not allowed."}


@pytest.mark.parametrize(("part", "reason"), [
    ({"type": "citation", "value": "[1]"}, "content part of type 'citation' not understood (keys: type, value)"),
    ({"type": "text", "data": "hi", "text": None}, "content part of type 'text' has no text under text, value, content (keys: data, type)"),
    ({"type": "tool_call", "value": "lookup(x)"}, "content part of type 'tool_call' is not JSON (keys: type, value)"),
])
def test_a_part_aerie_does_not_understand_is_skipped_naming_its_type_and_keys(part, reason):
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [part]}]}
    with pytest.raises(Skip) as caught:
        normalise(row, 0)
    assert caught.value.reason == reason


def test_a_tool_call_part_in_a_user_turn_is_a_named_skip():
    row = {"messages": [{"role": "user", "content": [{"type": "tool_call", "value": '{"name": "f"}'}]},
                        {"role": "assistant", "content": "a"}]}
    with pytest.raises(Skip, match=r"^a reasoning or tool-call content part in a user turn$"):
        normalise(row, 0)


# -- tool schemas ------------------------------------------------------------------------------


def test_nulls_are_removed_at_every_depth_and_list_items_are_kept():
    schema = {"type": "object", "enum": None, "properties": {"a": {"type": "string", "items": None}, "b": None},
              "anyOf": [{"type": "null", "default": None}, None]}
    assert without_nulls(schema) == {"type": "object", "properties": {"a": {"type": "string"}},
                                     "anyOf": [{"type": "null"}, None]}


def test_arrow_unified_tool_schemas_lose_the_other_tools_keys_and_calls_their_null_arguments():
    rows = through_arrow(ARROW_TOOL_ROWS)
    assert rows[0]["tools"][0]["function"]["parameters"]["properties"]["query"] is None  # what Arrow made
    for raw, row in zip(ARROW_TOOL_ROWS, rows):
        record = normalise(row, 0)
        assert record.tools == raw["tools"]
        call = record.conversations[1]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"]) == raw["messages"][1]["tool_calls"][0]["function"]["arguments"]


def test_through_arrow_bare_and_wrapped_schemas_in_one_dataset_both_become_a_clients():
    bare = {**GLAIVE_TOOLS[0]}
    wrapped = ARROW_TOOL_ROWS[1]["tools"][0]
    rows = through_arrow([{"tools": [bare]}, {"tools": [wrapped]}])
    assert rows[0]["tools"][0]["function"] is None and rows[1]["tools"][0]["name"] is None  # what Arrow made
    assert [normalise_tools(row["tools"]) for row in rows] == [[{"type": "function", "function": bare}], [wrapped]]


@pytest.mark.parametrize(("tools", "expected"), [
    ('{"name": "f", "parameters": {"type": "object"}}', [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    (['{"name": "f"}'], [{"type": "function", "function": {"name": "f"}}]),
    ([{"type": "function", "name": "f", "parameters": '{"type": "object", "x": null}'}],
     [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    ("", None), ([], None), (None, None),
])
def test_tools_in_any_shape_a_row_holds_them_become_a_clients(tools, expected):
    assert normalise_tools(tools) == expected


@pytest.mark.parametrize(("tools", "reason"), [
    ("[{oops", "field 'tools' is text but not JSON"),
    (7, "field 'tools' is int, not a list of tools"),
    ([{"description": "no name"}], "tool 0 of 'tools' has no name"),
    ([{"name": "f"}, "nope"], "tool 1 of 'tools' is text but not JSON"),
    ([{"name": "f", "parameters": ["a"]}], "parameters of tool 'f' are not a JSON schema object"),
    ([{"type": "retrieval"}], "tool 0 of 'tools' is of type 'retrieval', not a function"),
])
def test_a_tool_that_cannot_be_read_is_a_skip_reason(tools, reason):
    with pytest.raises(Skip) as caught:
        normalise_tools(tools)
    assert caught.value.reason == reason


def test_the_declaration_is_told_apart_typescript_json_or_other():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tool_declaration('namespace functions {\ntype f = (_: {}) => any;\n}', tools) == "typescript"
    assert tool_declaration('[{"function":{"name":"f"},"type":"function"}]', tools) == "json"
    assert tool_declaration('{"name": "f"}', tools) == "json"
    assert tool_declaration("You may call f.", tools) == "other"


# -- images and fields prep does not use ---------------------------------------------------------


@pytest.mark.parametrize("case", sorted(IMAGE_ROWS))
def test_an_image_row_is_skipped_with_a_reason_however_the_image_arrives(case):
    row, reason = IMAGE_ROWS[case]
    for kind in ("native", "prompts"):
        with pytest.raises(Skip) as caught:
            normalise(row, 0, kind=kind)
        assert caught.value.reason == reason


def test_a_text_row_of_a_llava_mix_and_empty_media_fields_from_arrow_are_kept():
    assert normalise(LLAVA_TEXT_ROW, 0).format == "sharegpt"
    [_, arrow_text] = through_arrow([{**LLAVA_TEXT_ROW, "images": ["a.jpg"]}, {**LLAVA_TEXT_ROW, "images": []}])
    assert normalise(arrow_text, 1).conversations[1]["content"].startswith("Use `items[::-1]`")


def test_fields_of_a_turn_prep_does_not_use_are_counted_by_name():
    record = normalise(AGENT_WITH_THOUGHTS, 0)
    assert record.dropped == Counter({"thoughts": 3, "actions": 2})  # an empty list holds nothing
    assert "thoughts" not in json.dumps(record.to_json())


def test_through_arrow_absent_fields_are_none_and_not_counted_as_dropped():
    rows = through_arrow([AGENT_WITH_THOUGHTS, {"id": "x", "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}])
    assert normalise(rows[1], 1).dropped == Counter()
    assert normalise(rows[0], 0).dropped == Counter({"thoughts": 3, "actions": 2})


def test_swe_agent_items_count_their_mask_and_cutoff_date_and_still_map():
    row = {"instance_id": "i", "trajectory": [
        {"role": "system", "text": None, "system_prompt": "You are an agent.", "mask": True, "cutoff_date": "2024-01-01"},
        {"role": "user", "text": "Fix it.", "system_prompt": None, "mask": True},
        {"role": "ai", "text": "Done.", "system_prompt": None, "mask": False}]}
    record = normalise(row, 0)
    assert [t["role"] for t in record.conversations] == ["system", "user", "assistant"]
    assert record.dropped == Counter({"mask": 3, "cutoff_date": 1})


def test_messages_beside_prompt_and_output_in_another_models_tokens_are_what_is_read():
    row = {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "output": "Hello<|im_end|>",
           "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello"}]}
    record = normalise(row, 0)
    assert record.conversations == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert record.dropped == Counter()


def test_a_prompt_response_pair_is_a_user_and_an_assistant_turn():
    record = normalise({"prompt": "Name a prime.", "response": "Seven."}, 0)
    assert (record.format, record.conversations) == ("prompt", [
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}])


# -- against Kimi-K2.5's real tokenizer --------------------------------------------------------


def _client_declaration(kimi: Any, tools: list[dict]) -> str:
    """The tool declaration Kimi's server renders for `tools` sent by a client."""
    text = kimi.apply_chat_template([{"role": "user", "content": "x"}], tools=tools, tokenize=False)
    return text[: text.index("<|im_user|>")]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_learns_every_assistant_turn_its_reasoning_and_its_calls_as_kimi_serves_them(kimi, family):
    rows = sample_rows(family)
    prepared = prepare(kimi, rows)
    assert prepared.summary.kept == len(rows), prepared.summary.skip_reasons
    learned = check_records(kimi, prepared)
    masked = {}
    for record, tokens in zip(prepared.records, prepared.tokens):
        masked.setdefault(record.id.split("#")[0], []).extend(masked_runs(kimi, tokens.input_ids, tokens.loss_mask))
    for record in prepared.records:
        row_id = record.id.split("#")[0]
        if record.id != row_id:
            continue
        assert learned[row_id] == assistant_turns(record.conversations)
        calls = [c for t in record.conversations for c in t.get("tool_calls") or []]
        for index, call in enumerate(calls):
            name = call["function"]["name"]
            assert call["id"] == f"functions.{name}:{index}"
            assert any(f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
                       f"{call['function']['arguments']}<|tool_call_end|>" in run for run in masked[row_id])
        for turn in record.conversations:
            if turn["role"] == "assistant" and turn.get("reasoning_content"):
                assert any(turn["reasoning_content"] + "</think>" in run for run in masked[row_id])
        text = kimi.decode(prepared.tokens[prepared.records.index(record)].input_ids.tolist())
        assert text.startswith(_client_declaration(kimi, record.tools)) and "type " in text
    assert prepared.summary.tool_declarations == {"typescript": len(rows)}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_through_arrow_gives_the_same_records_and_tokens(kimi, family):
    rows = sample_rows(family)
    direct, arrow = prepare(kimi, rows), prepare(kimi, through_arrow(rows))
    assert [r.to_json() for r in arrow.records] == [r.to_json() for r in direct.records]
    assert [t.input_ids.tolist() for t in arrow.tokens] == [t.input_ids.tolist() for t in direct.tokens]
    assert [t.loss_mask.tolist() for t in arrow.tokens] == [t.loss_mask.tolist() for t in direct.tokens]
    assert arrow.summary.dropped_fields == direct.summary.dropped_fields


def test_every_observation_answers_its_call_by_kimis_id(kimi):
    prepared = prepare(kimi, [sample_rows("glaive_toolcall")[1]])
    text = kimi.decode(prepared.tokens[0].input_ids.tolist())
    assert "## Return of functions.get_news_headlines:0\n" in text and "## Return of functions.get_news_headlines:1\n" in text


def test_arrow_unified_schemas_are_declared_typescript_style_as_the_client_sent_them(kimi):
    rows = through_arrow(ARROW_TOOL_ROWS)
    # The premise: as Arrow left them, Kimi's converter fails and the nulls are declared as JSON.
    assert '"query":null' in _client_declaration(kimi, rows[0]["tools"])
    prepared = prepare(kimi, rows)
    assert prepared.summary.kept == 2 and prepared.summary.tool_declarations == {"typescript": 2}
    check_records(kimi, prepared)
    for raw, record, tokens in zip(ARROW_TOOL_ROWS, prepared.records, prepared.tokens):
        assert kimi.decode(tokens.input_ids.tolist()).startswith(_client_declaration(kimi, raw["tools"]))


def test_tools_kimis_converter_refuses_even_from_a_client_are_declared_as_json_and_counted_so(kimi, capsys):
    # An enum whose values are not of its declared type: Kimi's own server declares these as JSON too.
    tool = {"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "enum": ["a"]}}}}
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": [tool]}
    prepared = prepare(kimi, [row] * 3)
    assert prepared.summary.tool_declarations == {"json": 3}
    # Counted, not printed: the tokenizer's own line on every render would bury the log's last line.
    assert "Failed to convert tools" not in capsys.readouterr().out
    assert kimi.decode(prepared.tokens[0].input_ids.tolist()).startswith(
        _client_declaration(kimi, [{"type": "function", "function": tool}]))


def test_image_rows_are_skipped_with_their_reasons_and_text_rows_beside_them_kept(kimi):
    rows = [row for row, _ in IMAGE_ROWS.values()] + [LLAVA_TEXT_ROW]
    prepared = prepare(kimi, rows)
    assert prepared.summary.kept == 1
    assert prepared.summary.skip_reasons == Counter(reason for _, reason in IMAGE_ROWS.values())


def test_dropped_fields_are_counted_in_the_summary_beside_the_records(kimi):
    prepared = prepare(kimi, [AGENT_WITH_THOUGHTS])
    assert prepared.summary.counts()["dropped_fields"] == {"thoughts": 3, "actions": 2}
    assert check_records(kimi, prepared) == {"web-17": [2, 4, 6]}
