"""Prep against Kimi-K2.5's real tokenizer: every record checked against its own template and encoding.

The tokenizer is ../shared/kimi-k2.5-tokenizer (slow, tiktoken, no offsets, its own
`apply_chat_template` with a TypeScript tool declaration). Without it the tests
fail in CI and are skipped elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from remote.prep.template import ChatTemplate
from tests.prep_fixtures import (
    kimi_tokenizer,
    FAITHFUL_ROWS, IMAGE_ROW, REPO, assistant_turns, check_records, masked_runs, prepare, read_rows,
)

NATIVE_FIXTURES = ["sharegpt.jsonl", "openthoughts.jsonl", "openai_tools.jsonl", "ultrachat.jsonl",
                   "agent_trajectory.jsonl", "swe_agent.jsonl", "json_text_fields.jsonl"]
SAMPLES = REPO / "inventories" / "samples"


@pytest.fixture(scope="module")
def kimi() -> Any:
    return kimi_tokenizer()


def test_kimis_template_is_probed_as_kimi_behaves(kimi):
    template = ChatTemplate(kimi)
    assert template.opening == "<|im_assistant|>assistant<|im_middle|><think>"
    assert template.turns_alone and template.renders_call_ids


@pytest.mark.parametrize("case", sorted(FAITHFUL_ROWS))
def test_every_record_is_kimis_own_rendering_and_encoding_and_learns_every_turn_once(kimi, case):
    prepared = prepare(kimi, [FAITHFUL_ROWS[case]])
    assert prepared.summary.kept == 1, prepared.summary.skip_reasons
    [(row_id, turns)] = check_records(kimi, prepared).items()
    whole = next(r for r in prepared.records if r.id == row_id)
    assert turns == assistant_turns(whole.conversations)
    assert prepared.summary.encoding.mismatches == 0 and prepared.summary.encoding.checked >= 1


@pytest.mark.parametrize("fixture", NATIVE_FIXTURES)
def test_every_fixture_row_is_kept_and_checked_record_by_record(kimi, fixture):
    rows = read_rows(fixture)
    prepared = prepare(kimi, rows)
    assert prepared.summary.kept == len(rows), prepared.summary.skip_reasons
    learned = check_records(kimi, prepared)
    assert sorted(learned) == sorted({r.id.split("#")[0] for r in prepared.records})


def test_every_reasoning_token_of_a_multi_turn_row_is_learned(kimi):
    prepared = prepare(kimi, [FAITHFUL_ROWS["multi_turn_reasoning"]])
    runs = [run for t in prepared.tokens for run in masked_runs(kimi, t.input_ids, t.loss_mask)]
    assert runs == [
        "old thoughts about the first</think>First answer.<|im_end|>",
        "thoughts about the second</think>Second answer.<|im_end|>",
        "new thoughts</think>Third answer.<|im_end|>",
    ]
    reasoning = sum(len(kimi.encode(t)) for t in ("old thoughts about the first", "thoughts about the second", "new thoughts"))
    assert prepared.summary.reasoning_tokens == reasoning
    assert prepared.summary.loss_tokens == sum(len(kimi.encode(run)) for run in runs)


def test_tools_are_declared_typescript_style_and_calls_carry_kimis_ids(kimi):
    prepared = prepare(kimi, [FAITHFUL_ROWS["tools_with_call_ids"]])
    text = kimi.decode(prepared.tokens[-1].input_ids.tolist())
    assert "<|im_system|>tool_declare<|im_middle|># Tools" in text and "type get_weather = (_: {" in text
    assert "functions.get_weather:2<|tool_call_argument_begin|>" in text and "call_a1" not in text and "call_c3" not in text
    assert "## Return of functions.get_weather:2\nsunny" in text


def test_thinking_off_renders_contexts_as_a_server_with_thinking_false(kimi):
    row = {"id": "q", "messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
    prepared = prepare(kimi, [row], chat_template_kwargs={"thinking": False})
    check_records(kimi, prepared, thinking=False)
    assert kimi.decode(prepared.tokens[0].input_ids.tolist()).endswith(
        "<|im_assistant|>assistant<|im_middle|><think></think>Hello.<|im_end|>")
    assert masked_runs(kimi, prepared.tokens[0].input_ids, prepared.tokens[0].loss_mask) == ["Hello.<|im_end|>"]


def test_the_samples_we_keep_give_every_record_with_its_reasoning_learned(kimi):
    for path in sorted(SAMPLES.glob("*.jsonl")):
        if path.stem.startswith("prompts"):
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        prepared = prepare(kimi, rows)
        assert prepared.summary.kept == len(rows), (path.name, prepared.summary.skip_reasons)
        check_records(kimi, prepared)
        masked: dict[str, str] = {}
        for record, tokens in zip(prepared.records, prepared.tokens):
            row = record.id.split("#")[0]
            masked[row] = masked.get(row, "") + "".join(masked_runs(kimi, tokens.input_ids, tokens.loss_mask))
        for record in prepared.records:
            for turn in record.conversations:
                if turn["role"] == "assistant":
                    assert (turn.get("reasoning_content") or "") in masked[record.id.split("#")[0]], path.name
                    assert turn["content"] in masked[record.id.split("#")[0]], path.name


def test_the_token_byte_mask_agrees_with_the_piecewise_mask(kimi):
    from remote.prep.sequences import sequences
    from remote.prep.tokenise import Encoder

    template = ChatTemplate(kimi)
    encoder = Encoder(kimi, 1 << 20)
    prepared = prepare(kimi, list(FAITHFUL_ROWS.values()))
    for record, tokens in zip(prepared.records, prepared.tokens):
        for sequence in sequences(template, record.conversations, record.tools):
            if sequence.text == kimi.decode(tokens.input_ids.tolist()):
                by_pieces = encoder._masked_by_pieces(sequence, tokens.input_ids, with_reasoning=True)
                assert by_pieces.loss_mask.tolist() == tokens.loss_mask.tolist()
                assert by_pieces.reasoning_mask.tolist() == tokens.reasoning_mask.tolist()


def test_an_image_part_is_skipped_with_a_reason(kimi):
    assert prepare(kimi, [IMAGE_ROW]).summary.skip_reasons == {"image in the row (content part 'image_url')": 1}
