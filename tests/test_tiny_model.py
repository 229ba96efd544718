"""The demo's wired tiny target: its top next token is the successor function it claims.

`inv demo` builds it with `--recite` so that its draft has something to learn
(a random target's next token has no structure a one-layer draft can pick up
from a demo's data); these tests hold the wiring to its promise on contexts
the demo sees (a chat prompt, its own answers, other text) and on random ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from remote.demo import tiny_model, tiny_tokenizer
from tests.pipeline_fixtures import demo_target  # noqa: F401 — a fixture


def load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()


def test_the_wired_targets_top_token_is_the_successor_of_the_current_token_in_any_context(demo_target: Path) -> None:
    import torch

    tokenizer, model = load(demo_target)
    recite = tokenizer.encode(tiny_model.DEMO_RECITAL, add_special_tokens=False)
    following = torch.tensor(tiny_model.successor(recite, len(tokenizer)))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, tokenize=False)
    texts = [prompt + tiny_model.DEMO_RECITAL * 3,
             tiny_tokenizer.TRAINING_TEXT,  # other text, where most tokens are not recited
             "The lazy dog jumps over the quick brown fox. the the The dog dog"]
    contexts = [torch.tensor([tokenizer.encode(text, add_special_tokens=False)]) for text in texts]
    generator = torch.Generator().manual_seed(0)
    contexts += [torch.randint(0, len(tokenizer), (1, 256), generator=generator) for _ in range(4)]
    with torch.no_grad():
        for ids in contexts:
            top = model(ids).logits[0].argmax(-1)
            assert torch.equal(top, following[ids[0]]), tokenizer.decode(ids[0][top != following[ids[0]]])


def test_the_wired_targets_greedy_answer_recites_and_tokenises_back_to_itself(demo_target: Path) -> None:
    import torch

    tokenizer, model = load(demo_target)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    answer = out[0, prompt["input_ids"].shape[1]:].tolist()
    text = tokenizer.decode(answer)
    assert text == (tiny_model.DEMO_RECITAL * 3)[: len(text)] and len(answer) == 20, text
    # What infer's answer becomes in the pipeline: text, tokenised again by prep.
    assert tokenizer.encode(text, add_special_tokens=False) == answer


def test_a_recital_that_repeats_a_token_is_refused(demo_target: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="none repeated"):
        tiny_model.main([str(tmp_path / "out"), "--tokenizer", str(demo_target), "--recite", " the lazy the"])
    assert not (tmp_path / "out").exists()
