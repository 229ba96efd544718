"""Tokenize trains a regenerated turn on the ids the target's server generated, where infer kept them:
Kimi-K2.5's real tokenizer and chat template (skipped where they are absent, as in test_prep_kimi.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from remote.prep.server_ids import runs
from tests.prep_fixtures import kimi_tokenizer, masked_runs, prepare


@pytest.fixture(scope="module")
def kimi() -> Any:
    return kimi_tokenizer()


def record(answer: dict[str, Any]) -> dict[str, Any]:
    """A record as infer writes it: the prompt, then the target's answer (with its ids, where kept)."""
    return {"id": "r", "conversations": [{"role": "user", "content": "Say hello."},
                                         {"role": "assistant", **answer}],
            "regenerated": {"turns": 1, "finish_reasons": ["stop"], "ended": None, "dropped": 0}}


def encode(kimi: Any, text: str) -> list[int]:
    return kimi.encode(text, add_special_tokens=False) if text else []


def generated(kimi: Any, reasoning: str, content: str, split_at: int | None = None, end: bool = True) -> list[int]:
    """The ids a target could generate for the turn; `split_at` cuts the answer's text into two encodings,
    as a sampled tokenisation may differ from the tokenizer's merges."""
    if split_at is None:
        words = encode(kimi, content)
    else:
        words = encode(kimi, content[:split_at]) + encode(kimi, content[split_at:])
    close, im_end = kimi.convert_tokens_to_ids(["</think>", "<|im_end|>"])
    return encode(kimi, reasoning) + [close] + words + ([im_end] if end else [])


def test_a_turn_whose_server_ids_differ_from_its_re_encoding_trains_on_the_server_ids(kimi):
    server = generated(kimi, "Greeting asked.", "Hello there, friend!", split_at=9)
    assert server != generated(kimi, "Greeting asked.", "Hello there, friend!"), "the split is a tokenisation of its own"
    prepared = prepare(kimi, [record({"content": "Hello there, friend!", "reasoning_content": "Greeting asked.",
                                      "output_ids": server})])

    [tokens] = prepared.tokens
    [(a, b)] = runs(tokens.loss_mask)
    assert tokens.input_ids[a:b].tolist() == server
    assert masked_runs(kimi, tokens.input_ids, tokens.loss_mask) == ["Greeting asked.</think>Hello there, friend!<|im_end|>"]
    assert int(tokens.reasoning_mask.sum()) == len(encode(kimi, "Greeting asked."))
    stats = prepared.summary.encoding.server_ids
    assert (stats.turns, stats.turns_differing, stats.records_differing, stats.turns_unusable) == (1, 1, 1, 0)


def test_server_ids_without_the_end_token_get_the_turns_own_and_equal_ids_change_nothing(kimi):
    same = prepare(kimi, [record({"content": "Hello.", "output_ids": generated(kimi, "", "Hello.", end=False)})])
    plain = prepare(kimi, [record({"content": "Hello."})])
    assert same.tokens[0].input_ids.tolist() == plain.tokens[0].input_ids.tolist()
    stats = same.summary.encoding.server_ids
    assert (stats.turns, stats.turns_differing, stats.records_differing) == (1, 0, 0)


def test_server_ids_that_render_other_text_are_counted_and_the_texts_tokens_kept(kimi):
    other = generated(kimi, "", "Goodbye.")
    prepared = prepare(kimi, [record({"content": "Hello.", "output_ids": other})])
    plain = prepare(kimi, [record({"content": "Hello."})])
    assert np.array_equal(prepared.tokens[0].input_ids, plain.tokens[0].input_ids)
    assert prepared.summary.encoding.server_ids.turns_unusable == 1
