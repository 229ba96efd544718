"""Every dataset family normalises to the expected conversation; what cannot be mapped is named."""

from __future__ import annotations

import pytest

from remote.prep.normalise import Skip, normalise
from tests.prep_fixtures import read_rows


def test_sharegpt_maps_human_and_gpt_to_user_and_assistant():
    record = normalise(read_rows("sharegpt.jsonl")[0], 0)
    assert record.format == "sharegpt"
    assert record.id == "sg-1"
    assert [t["role"] for t in record.conversations] == ["user", "assistant", "user", "assistant"]
    assert record.conversations[3]["content"].startswith("Tuples are slightly faster")


def test_magpie_row_takes_its_id_from_uuid_and_ignores_extra_fields():
    record = normalise(read_rows("sharegpt.jsonl")[2], 2)
    assert record.id == "magpie-7c1d"
    assert record.to_json().keys() == {"id", "conversations"}


def test_openthoughts_top_level_system_becomes_the_first_turn_and_user_from_is_understood():
    row = read_rows("openthoughts.jsonl")[0]
    record = normalise(row, 0)
    assert record.format == "openthoughts"
    assert [t["role"] for t in record.conversations] == ["system", "user", "assistant"]
    assert record.conversations[0]["content"] == row["system"]
    assert "\\boxed{5050}" in record.conversations[2]["content"]


def test_openai_tool_calls_keep_their_shape_with_arguments_as_json_text():
    record = normalise(read_rows("openai_tools.jsonl")[0], 0)
    assert record.format == "openai_tools"
    assert record.tools[0]["function"]["name"] == "get_weather"
    user, call, result = record.conversations[1], record.conversations[2], record.conversations[3]
    assert user == {"role": "user", "content": "What is the weather in Paris right now?"}
    assert call["reasoning_content"] == "The user wants current weather; call get_weather."
    assert call["tool_calls"] == [
        {
            "id": "functions.get_weather:0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert result == {
        "role": "tool",
        "content": '{"temp_c": 21, "sky": "sunny"}',
        "tool_call_id": "functions.get_weather:0",
        "name": "get_weather",
    }


def test_assistant_turn_with_only_tool_calls_gets_empty_content():
    record = normalise(read_rows("openai_tools.jsonl")[1], 1)
    assert record.conversations[1]["content"] == ""
    assert [c["function"]["arguments"] for c in record.conversations[1]["tool_calls"]] == [
        '{"city": "Oslo"}',
        '{"city": "Rome"}',
    ]


def test_ultrachat_takes_its_id_from_prompt_id():
    record = normalise(read_rows("ultrachat.jsonl")[0], 0)
    assert record.format == "ultrachat"
    assert record.id == "5a1f0c9e2b"
    assert [t["role"] for t in record.conversations] == ["user", "assistant", "user", "assistant"]


def test_agent_trajectory_ending_on_an_observation_keeps_every_action_and_drops_the_last_observation():
    row = read_rows("agent_trajectory.jsonl")[0]
    record = normalise(row, 0)
    assert record.format == "agent_trajectory"
    assert record.id == "astropy__astropy-12907"
    assert [t["role"] for t in record.conversations] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert record.conversations == [
        {"role": m["role"], "content": m["content"]} for m in row["messages"][:-1]
    ]


def test_swe_agent_system_item_with_text_none_uses_its_system_prompt_and_ai_is_the_assistant():
    record = normalise(read_rows("swe_agent.jsonl")[0], 0)
    assert record.format == "swe_agent"
    roles = [t["role"] for t in record.conversations]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert record.conversations[0]["content"].startswith("SETTING: You are an autonomous programmer")
    assert record.conversations[-1]["content"] == "```\nsubmit\n```"


def test_fields_holding_json_text_are_parsed_including_tool_calls_and_tools():
    rows = read_rows("json_text_fields.jsonl")
    assert [normalise(r, i).format for i, r in enumerate(rows)] == [
        "openai+json_text",
        "sharegpt+json_text",
        "openai_tools+json_text",
    ]
    record = normalise(rows[2], 2)
    assert record.tools[0]["function"]["name"] == "get_weather"
    assert record.conversations[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lima"}'


def test_alpaca_instruction_and_input_make_the_user_turn_and_output_the_assistant_turn():
    record = normalise(read_rows("prompts_alpaca.jsonl")[1], 1)
    assert record.format == "alpaca"
    assert record.conversations == [
        {"role": "user", "content": "Translate the sentence into French.\n\nThe cat sleeps on the sofa."},
        {"role": "assistant", "content": "Le chat dort sur le canapé."},
    ]


@pytest.mark.parametrize(
    ("fixture", "index", "expected"),
    [
        ("prompts_alpaca.jsonl", 2, [{"role": "user", "content": "Classify the sentiment of this review.\n\nThe battery died after two days."}]),
        ("prompts_question.jsonl", 0, [{"role": "user", "content": "What is the boiling point of water at sea level in Fahrenheit?"}]),
        ("prompts_problem.jsonl", 1, [{"role": "user", "content": "How many positive divisors does 36 have?"}]),
        (
            "prompts_prompt.jsonl",
            0,
            [{"role": "system", "content": "You are a playful poet."}, {"role": "user", "content": "Write a limerick about a cat who learns to code."}],
        ),
        ("prompts_prompt.jsonl", 1, [{"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}]),
    ],
)
def test_prompt_only_families_give_system_and_user(fixture, index, expected):
    assert normalise(read_rows(fixture)[index], index, kind="prompts").conversations == expected


def test_agent_trajectory_as_a_prompt_is_the_system_prompt_and_the_issue():
    row = read_rows("agent_trajectory.jsonl")[1]
    record = normalise(row, 0, kind="prompts")
    assert record.conversations == [row["messages"][0], row["messages"][1]]
    assert record.tools is None


def test_swe_agent_as_a_prompt_skips_the_empty_system_text():
    record = normalise(read_rows("swe_agent.jsonl")[0], 0, kind="prompts")
    assert [t["role"] for t in record.conversations] == ["system", "user"]
    assert record.conversations[1]["content"].startswith("We're currently solving")


def test_a_prompt_only_row_has_no_assistant_turn_for_native():
    with pytest.raises(Skip, match="^no assistant turn$"):
        normalise(read_rows("prompts_question.jsonl")[1], 1)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"conversations": [{"from": "narrator", "value": "x"}]}, "unknown role 'narrator'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"text": "just text"}, "no conversations field (keys: text)"),
        ({"messages": [{"content": "who am I"}]}, "turn without a role"),
        ({"messages": "[not json"}, "field 'messages' is text but not JSON"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "image in the row (content part 'image_url')"),
        ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"arguments": "{}"}}]}]}, "tool call without a name"),
        ([1, 2], "row is not an object (list)"),
    ],
)
def test_rows_nothing_maps_are_skipped_with_a_named_reason(row, reason):
    with pytest.raises(Skip) as caught:
        normalise(row, 0)
    assert caught.value.reason == reason


def test_roles_are_matched_whatever_their_case():
    record = normalise({"conversations": [{"from": "Human", "value": "a"}, {"from": "GPT", "value": "b"}]}, 0)
    assert [t["role"] for t in record.conversations] == ["user", "assistant"]


def test_rows_from_arrow_with_none_for_absent_columns_are_read_as_absent():
    row = {
        "id": None,
        "conversations": None,
        "messages": [
            {"role": "user", "content": "hi", "tool_calls": None, "from": None, "value": None},
            {"role": "assistant", "content": "hello", "tool_calls": None, "reasoning_content": None},
        ],
        "system": None,
        "tools": None,
    }
    record = normalise(row, 7, dataset="A1")
    assert record.id == "A1-7"
    assert record.conversations == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_records_in_specforge_layout_as_the_infer_stage_writes_them_are_read_back_unchanged():
    record = {
        "id": "p-1",
        "conversations": [
            {"role": "user", "content": "Why is the sky blue?"},
            {"role": "assistant", "content": "Rayleigh scattering.", "reasoning_content": "short answer"},
        ],
    }
    normalised = normalise(record, 0)
    assert normalised.format == "specforge"
    assert normalised.to_json() == record


@pytest.mark.parametrize(
    ("content", "reasoning", "answer"),
    [
        ("<think>Paris is the capital.</think>Paris.", "Paris is the capital.", "Paris."),
        ("\n<think>\nstep one\n</think>\n\nDone.", "\nstep one\n", "\n\nDone."),
        ("It is Rome.</think>Rome.", "It is Rome.", "Rome."),  # Kimi's prompt opened <think> already
        ("<think></think>Only an answer.", None, "Only an answer."),
    ],
)
def test_inline_reasoning_in_the_content_is_split_into_reasoning_and_the_answer_as_written(content, reasoning, answer):
    record = normalise({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]}, 0)
    turn = record.conversations[1]
    assert (turn.get("reasoning_content"), turn["content"]) == (reasoning, answer)


@pytest.mark.parametrize("content", ["Use <think> tags like this.", "A <think> in the middle, then </think> later."])
def test_content_that_only_mentions_the_tags_is_left_as_written(content):
    record = normalise({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]}, 0)
    assert record.conversations[1] == {"role": "assistant", "content": content}


def test_a_reasoning_field_wins_over_tags_in_the_content():
    turn = {"role": "assistant", "content": "<think>x</think>y", "reasoning_content": "given"}
    record = normalise({"messages": [{"role": "user", "content": "q"}, turn]}, 0)
    assert record.conversations[1] == turn


def test_a_multi_turn_prompt_row_keeps_every_user_turn_and_none_of_the_original_answers():
    from tests.regeneration_rows import five_turns

    record = normalise(five_turns(), 0, kind="prompts")
    assert record.conversations == [{"role": "system", "content": "You are terse."}] + [
        {"role": "user", "content": f"question {k}"} for k in range(1, 6)]


def test_an_agent_prompt_row_keeps_its_tools_its_original_calls_and_their_results_for_infer_to_match():
    from remote.prep.prompt_turns import ask_points
    from tests.regeneration_rows import WEATHER, agent

    record = normalise(agent("a", "Lima"), 0, kind="prompts")
    assert record.tools == WEATHER
    assert [t["role"] for t in record.conversations] == ["user", "assistant", "tool", "user"]
    assert record.conversations[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "orig_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}]}
    assert ask_points(record.conversations) == [0, 2, 3]


def test_an_agent_whose_actions_are_written_in_its_text_is_asked_its_first_turn_and_the_rest_counted():
    row = read_rows("agent_trajectory.jsonl")[1]
    record = normalise(row, 0, kind="prompts")
    users = sum(t["role"] == "user" and bool(t["content"].strip()) for t in row["messages"])
    assert [t["role"] for t in record.conversations] == ["system", "user"]
    assert record.left_out == users - 1 > 0
