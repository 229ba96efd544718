"""The records are what the target saw and wrote, for a template without generation markers (the tiny one).

The same checks run against Kimi-K2.5's real tokenizer in test_prep_kimi.py.
"""

from __future__ import annotations

import re

import pytest

from remote.prep.template import ChatTemplate
from tests.prep_fixtures import (  # noqa: F401
    FAITHFUL_ROWS, IMAGE_ROW, assistant_turns, check_records, masked_runs, prepare, read_rows, tiny_tokenizer,
    tiny_tokenizer_dir,
)

NATIVE_FIXTURES = [
    "sharegpt.jsonl",
    "openthoughts.jsonl",
    "openai_tools.jsonl",
    "ultrachat.jsonl",
    "agent_trajectory.jsonl",
    "swe_agent.jsonl",
    "json_text_fields.jsonl",
]


def test_the_tiny_template_has_no_generation_markers_and_behaves_like_kimis(tiny_tokenizer):
    assert not re.search(r"\{%-?\s*generation", tiny_tokenizer.chat_template)
    template = ChatTemplate(tiny_tokenizer)
    assert template.opening == "<|im_assistant|>assistant<|im_middle|><think>"
    assert template.turns_alone and template.renders_call_ids
    assert ChatTemplate(tiny_tokenizer, {"thinking": False}).opening == "<|im_assistant|>assistant<|im_middle|><think></think>"


@pytest.mark.parametrize("fixture", NATIVE_FIXTURES)
def test_every_record_is_the_servers_context_and_the_turns_it_learns(tiny_tokenizer, fixture):
    rows = read_rows(fixture)
    prepared = prepare(tiny_tokenizer, rows)
    assert prepared.summary.kept == len(rows), prepared.summary.skip_reasons
    learned = check_records(tiny_tokenizer, prepared)
    for record in prepared.records:
        if "#" not in record.id:  # the record of the row's last turn holds the whole conversation it learns
            assert learned[record.id] == assistant_turns(record.conversations), record.id


@pytest.mark.parametrize("case", sorted(FAITHFUL_ROWS))
def test_every_case_learns_every_assistant_turn_once(tiny_tokenizer, case):
    prepared = prepare(tiny_tokenizer, [FAITHFUL_ROWS[case]])
    assert prepared.summary.kept == 1, prepared.summary.skip_reasons
    [(row_id, turns)] = check_records(tiny_tokenizer, prepared).items()
    whole = next(r for r in prepared.records if r.id == row_id)
    assert turns == assistant_turns(whole.conversations)


def test_a_turn_whose_reasoning_a_later_context_strips_gets_a_record_of_its_own(tiny_tokenizer):
    prepared = prepare(tiny_tokenizer, [FAITHFUL_ROWS["multi_turn_reasoning"]])
    assert [r.id for r in prepared.records] == ["m#2", "m#4", "m"]
    runs = [masked_runs(tiny_tokenizer, t.input_ids, t.loss_mask) for t in prepared.tokens]
    assert runs == [
        ["old thoughts about the first</think>First answer.<|im_end|>"],
        ["thoughts about the second</think>Second answer.<|im_end|>"],
        ["new thoughts</think>Third answer.<|im_end|>"],
    ]
    # The last record's context is the server's: earlier reasoning stripped, as Kimi's template does.
    assert "old thoughts" not in tiny_tokenizer.decode(prepared.tokens[2].input_ids.tolist())
    summary = prepared.summary
    assert (summary.kept, summary.records, summary.assistant_turns, summary.turns_expanded) == (1, 3, 3, 2)
    assert summary.reasoning_tokens == sum(int(t.reasoning_mask.sum()) for t in prepared.tokens) > 0


def test_with_reasoning_preserve_a_row_is_one_record_whose_context_keeps_earlier_reasoning(tiny_tokenizer):
    prepared = prepare(tiny_tokenizer, [FAITHFUL_ROWS["multi_turn_reasoning"]], reasoning="preserve")
    assert [r.id for r in prepared.records] == ["m"]
    assert len(masked_runs(tiny_tokenizer, prepared.tokens[0].input_ids, prepared.tokens[0].loss_mask)) == 3
    assert prepared.summary.turns_expanded == 0


def test_an_agents_chain_of_tool_calls_is_one_record(tiny_tokenizer):
    prepared = prepare(tiny_tokenizer, [FAITHFUL_ROWS["tools_with_call_ids"]])
    # The first answer has no tool call, so the later context strips the calls' reasoning before it.
    assert [r.id for r in prepared.records] == ["t#4", "t"]
    assert [len(masked_runs(tiny_tokenizer, t.input_ids, t.loss_mask)) for t in prepared.tokens] == [2, 2]


def test_call_ids_become_kimis_and_the_results_answer_them(tiny_tokenizer):
    record = prepare(tiny_tokenizer, [FAITHFUL_ROWS["tools_with_call_ids"]]).records[-1]
    calls = [c["id"] for m in record.conversations for c in m.get("tool_calls") or []]
    assert calls == ["functions.get_weather:0", "functions.get_weather:1", "functions.get_weather:2"]
    results = [m["tool_call_id"] for m in record.conversations if m["role"] == "tool"]
    assert results == ["functions.get_weather:1", "functions.get_weather:0", "functions.get_weather:2"]


def test_inline_thinking_is_learned_as_reasoning(tiny_tokenizer):
    prepared = prepare(tiny_tokenizer, [FAITHFUL_ROWS["inline_thinking"]])
    assert [m.get("reasoning_content") for m in prepared.records[-1].conversations if m["role"] == "assistant"] == [
        "The capital of France is Paris.", "It is Rome, of course."]
    runs = [run for t in prepared.tokens for run in masked_runs(tiny_tokenizer, t.input_ids, t.loss_mask)]
    assert runs == ["The capital of France is Paris.</think>Paris.<|im_end|>", "It is Rome, of course.</think>Rome.<|im_end|>"]


def test_an_image_part_skips_the_row_with_a_reason(tiny_tokenizer):
    prepared = prepare(tiny_tokenizer, [IMAGE_ROW])
    assert prepared.summary.skip_reasons == {"image in the row (content part 'image_url')": 1}


def test_every_assistant_turn_of_a_long_agent_trajectory_is_masked(tiny_tokenizer):
    row = read_rows("agent_trajectory.jsonl")[0]
    tokens = prepare(tiny_tokenizer, [row]).tokens[0]
    runs = masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask)
    assert len(runs) == 3
    assert all("<function=" in run for run in runs)
    assert "OBSERVATION" not in "".join(runs)


def test_an_answer_that_contains_the_closing_marker_is_still_masked_whole(tiny_tokenizer):
    row = {"messages": [{"role": "user", "content": "Quote it."}, {"role": "assistant", "content": "It ends with <|im_end|> here."}]}
    tokens = prepare(tiny_tokenizer, [row]).tokens[0]
    assert masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask) == ["</think>It ends with <|im_end|> here.<|im_end|>"]


def test_overlong_records_are_truncated_and_counted(tiny_tokenizer):
    rows = read_rows("agent_trajectory.jsonl")
    prepared = prepare(tiny_tokenizer, rows, max_length=150)
    assert prepared.summary.kept == 2
    assert prepared.summary.truncated == 2
    assert [len(t.input_ids) for t in prepared.tokens] == [150, 150]
    assert all(len(t.loss_mask) == 150 and t.truncated for t in prepared.tokens)


def test_overlong_records_are_dropped_with_a_reason_when_configured(tiny_tokenizer):
    rows = read_rows("sharegpt.jsonl")
    prepared = prepare(tiny_tokenizer, rows, max_length=100, overlong="drop")
    lengths = [len(t.input_ids) for t in prepared.tokens]
    assert all(n <= 100 for n in lengths)
    assert prepared.summary.skip_reasons == {"longer than max_length (100 tokens)": len(rows) - len(lengths)}
    assert len(lengths) < len(rows)


def test_truncation_that_leaves_no_assistant_token_skips_the_record(tiny_tokenizer):
    row = {"messages": [{"role": "system", "content": "word " * 300}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    prepared = prepare(tiny_tokenizer, [row], max_length=50)
    assert prepared.summary.kept == 0
    assert prepared.summary.skip_reasons == {"no assistant tokens within max_length (50)": 1}


def test_a_template_error_skips_the_row_with_the_templates_message(tiny_tokenizer):
    # The normaliser only produces known roles, so make the template itself refuse one.
    from remote.prep.preparer import Preparer
    from remote.prep.prep_settings import Target
    from tests.settings import prep_settings

    preparer = Preparer("native", "T", Target(), prep_settings(), tiny_tokenizer)
    with pytest.raises(Exception) as caught:
        preparer.template.render([{"role": "critic", "content": "x"}])
    assert getattr(caught.value, "reason", "") == "chat template error: unknown role critic"


def test_a_boundary_inside_a_token_skips_the_record_rather_than_guess(tiny_tokenizer):
    from remote.prep.sequences import Sequence
    from remote.prep.tokenise import Encoder

    text = "<|im_user|>user<|im_middle|>hello world<|im_end|>"
    inside = text.index("world") + 2
    [result] = Encoder(tiny_tokenizer, 4096).encode([Sequence([], text, [(inside, len(text))])])
    assert getattr(result, "reason", None) == "a turn boundary falls inside a token"


def test_a_template_that_changes_the_content_it_renders_gets_no_shortcut_and_still_exact_records(tiny_tokenizer_dir):
    from remote.prep.prep_settings import Target

    tokenizer = Target(str(tiny_tokenizer_dir)).load()
    tokenizer.chat_template = tokenizer.chat_template.replace("{{ message.content or '' }}", "{{ (message.content or '') | trim }}")
    template = ChatTemplate(tokenizer)
    assert template.turns_alone and template._formats is None  # a plain turn is rendered, never assembled
    rows = [FAITHFUL_ROWS["multi_turn_reasoning"], {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  padded  "}]}]
    prepared = prepare(tokenizer, rows)
    assert prepared.summary.kept == 2
    check_records(tokenizer, prepared)


def test_a_template_whose_contexts_are_not_prefixes_of_each_other_has_every_turn_checked_by_rendering(tiny_tokenizer_dir):
    from remote.prep.prep_settings import Target

    tokenizer = Target(str(tiny_tokenizer_dir)).load()
    # Tool results before the last plain answer are elided, as Kimi elides reasoning: a later
    # context is then no continuation of an earlier one even without any reasoning.
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "## Return of {{ message.tool_call_id }}\n{{ message.content }}",
        "## Return of {{ message.tool_call_id }}\n{{ message.content if loop.index0 > ns.last_plain else '(old)' }}")
    template = ChatTemplate(tokenizer)
    assert template.turns_alone and not template.prefix_stable
    row = {"id": "x", "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                                                             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "snow"},
        {"role": "assistant", "content": "It snows."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."}]}
    prepared = prepare(tokenizer, [row] + read_rows("agent_trajectory.jsonl"))
    assert prepared.summary.kept == 3
    check_records(tokenizer, prepared)
    # The answer that saw the whole result needs its own record; the call is learned in the last.
    assert [r.id for r in prepared.records][:2] == ["x#3", "x"]


def test_kimi_shaped_templates_are_prefix_stable_so_an_agent_trajectory_is_one_record(tiny_tokenizer):
    assert ChatTemplate(tiny_tokenizer).prefix_stable
    rows = read_rows("agent_trajectory.jsonl")
    prepared = prepare(tiny_tokenizer, rows)
    assert prepared.summary.records == len(rows) and prepared.summary.turns_expanded == 0
