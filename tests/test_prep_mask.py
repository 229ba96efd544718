"""The loss mask covers exactly what the assistant turns render, for a template without generation markers."""

from __future__ import annotations

import re

import pytest

from remote.prep.template import ChatTemplate, Markers
from tests.prep_fixtures import expected_turns, masked_runs, prepare, read_rows, tiny_tokenizer, tiny_tokenizer_dir  # noqa: F401

NATIVE_FIXTURES = [
    "sharegpt.jsonl",
    "openthoughts.jsonl",
    "openai_tools.jsonl",
    "ultrachat.jsonl",
    "agent_trajectory.jsonl",
    "swe_agent.jsonl",
    "json_text_fields.jsonl",
]


def test_the_tiny_template_has_no_generation_markers_and_its_turn_markers_are_found(tiny_tokenizer):
    assert not re.search(r"\{%-?\s*generation", tiny_tokenizer.chat_template)
    assert ChatTemplate(tiny_tokenizer).markers == Markers("<|im_assistant|>assistant<|im_middle|>", "<|im_end|>")


@pytest.mark.parametrize("fixture", NATIVE_FIXTURES)
def test_masked_tokens_decode_to_exactly_the_assistant_turns(tiny_tokenizer, fixture):
    rows = read_rows(fixture)
    prepared = prepare(tiny_tokenizer, rows)
    assert prepared.summary.kept == len(rows), prepared.summary.skip_reasons
    for record, tokens in zip(prepared.records, prepared.tokens):
        assert masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask) == expected_turns(record.conversations)


@pytest.mark.parametrize("fixture", NATIVE_FIXTURES)
def test_nothing_of_system_user_or_tool_turns_is_masked(tiny_tokenizer, fixture):
    prepared = prepare(tiny_tokenizer, read_rows(fixture))
    for record, tokens in zip(prepared.records, prepared.tokens):
        masked = "".join(masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask))
        assert "<|im_user|>" not in masked and "<|im_system|>" not in masked
        for turn in record.conversations:
            if turn["role"] != "assistant" and len(turn["content"]) > 20:
                assert turn["content"] not in masked


def test_tokens_are_those_of_the_tokenizers_own_chat_template(tiny_tokenizer):
    row = read_rows("openai_tools.jsonl")[0]
    prepared = prepare(tiny_tokenizer, [row])
    record = prepared.records[0]
    expected = tiny_tokenizer.apply_chat_template(record.conversations, tools=record.tools, tokenize=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert prepared.tokens[0].input_ids.tolist() == list(expected)


def test_every_assistant_turn_of_a_long_agent_trajectory_is_masked(tiny_tokenizer):
    row = read_rows("agent_trajectory.jsonl")[0]
    tokens = prepare(tiny_tokenizer, [row]).tokens[0]
    runs = masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask)
    assert len(runs) == 3
    assert all("<function=" in run for run in runs)
    assert "OBSERVATION" not in "".join(runs)


def test_reasoning_the_template_drops_from_earlier_turns_is_not_in_the_mask(tiny_tokenizer):
    row = {
        "messages": [
            {"role": "user", "content": "First question?"},
            {"role": "assistant", "content": "First answer.", "reasoning_content": "old thoughts"},
            {"role": "user", "content": "Second question?"},
            {"role": "assistant", "content": "Second answer.", "reasoning_content": "new thoughts"},
        ]
    }
    tokens = prepare(tiny_tokenizer, [row]).tokens[0]
    assert masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask) == [
        "First answer.<|im_end|>",
        "<think>new thoughts</think>Second answer.<|im_end|>",
    ]


def test_an_answer_that_contains_the_closing_marker_is_still_masked_whole(tiny_tokenizer):
    row = {"messages": [{"role": "user", "content": "Quote it."}, {"role": "assistant", "content": "It ends with <|im_end|> here."}]}
    tokens = prepare(tiny_tokenizer, [row]).tokens[0]
    assert masked_runs(tiny_tokenizer, tokens.input_ids, tokens.loss_mask) == ["It ends with <|im_end|> here.<|im_end|>"]


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
    from remote.prep.pipeline import Preparer
    from remote.prep.settings import Target
    from tests.settings import prep_settings

    preparer = Preparer("native", "T", Target(), prep_settings(), tiny_tokenizer)
    with pytest.raises(Exception) as caught:
        preparer.template.render([{"role": "critic", "content": "x"}])
    assert getattr(caught.value, "reason", "") == "chat template error: unknown role critic"


def test_a_tokenizer_without_offsets_is_encoded_piecewise_to_the_same_tokens_and_mask(tiny_tokenizer):
    # Kimi's tiktoken tokenizer (trust_remote_code) may have no Rust backend, hence no char_to_token.
    from remote.prep.tokenise import Encoder

    rows = read_rows("openai_tools.jsonl") + read_rows("agent_trajectory.jsonl")
    fast = prepare(tiny_tokenizer, rows)
    preparer_template = ChatTemplate(tiny_tokenizer)
    rendered = [preparer_template.render_with_spans(r.conversations, r.tools) for r in fast.records]
    encoder = Encoder(tiny_tokenizer, max_length=4096)
    encoder._backend = None
    piecewise = encoder.encode([text for text, _ in rendered], [spans for _, spans in rendered])
    for a, b in zip(fast.tokens, piecewise):
        assert a.input_ids.tolist() == b.input_ids.tolist()
        assert a.loss_mask.tolist() == b.loss_mask.tolist()
