"""Layer ids mean what the real SGLang serves: its own ``set_eagle3_layers_to_capture``, per architecture.

The pinned SGLang wheel's model classes are imported on the CPU, in a child process
(tests/sglang_real.py), and their ``set_eagle3_layers_to_capture`` is called on a stand-in holding only
what it reads. What it captures -- the inputs of decoder layers, HF's
``hidden_states[j]`` -- is compared with `remote.eagle3.layer_ids` and with the
states aerie's extractor keeps from a tiny real model of each architecture.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from remote.eagle3 import StageInputError
from remote.eagle3 import layer_ids
from remote.eagle3.extractor import capture, decoder_of, load_target
from tests import sglang_real
from tests.sglang_real import sglang

__all__ = ["sglang"]  # a fixture used below

N = 6  # decoder layers of the tiny targets below
ARCHITECTURES = sorted(layer_ids.RULES)
# Every increasing triple of ids from -1 to N: the valid ones and each way to be out of range.
TRIPLES = [list(t) for t in itertools.combinations(range(-1, N + 1), 3)]


@pytest.mark.e2e  # the real SGLang, in a process of its own
def test_the_installed_sglang_is_the_pinned_one(sglang) -> None:
    assert sglang.call("version") == sglang_real.PINNED == layer_ids.SGLANG_CHECKED


def test_the_stand_in_models_cover_every_architecture_aerie_supports() -> None:
    assert sorted(sglang_real.MODELS) == ARCHITECTURES


@pytest.mark.e2e  # the real SGLang, in a process of its own
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_aerie_captures_the_layers_sglangs_own_code_captures(sglang, arch: str) -> None:
    for ids in TRIPLES:
        served = sglang.call("captures", arch, ids, N)
        # Beyond the last layer SGLang captures fewer states than the draft reads (or fails to start); a
        # negative id (Llama's -1 would be the embedding output) is no layer number: both refused before work.
        if served is not None and all(0 <= j < N for j in served) and min(ids) >= 0:
            assert layer_ids.captured(ids, arch) == served, ids
            layer_ids.validate_layers(ids, N, arch)
        else:
            with pytest.raises(StageInputError, match="out of range"):
                layer_ids.validate_layers(ids, N, arch)


@pytest.mark.e2e  # the real SGLang, in a process of its own
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_draft_without_ids_captures_sglangs_default_layers(sglang, arch: str) -> None:
    assert layer_ids.server_default(arch, 61) == sglang.call("captures", arch, None, 61)


@pytest.mark.e2e  # the real SGLang, in a process of its own
def test_kimi_and_llama_read_the_same_ids_one_layer_apart(sglang) -> None:
    # The user's ids on Kimi-K2.5: the inputs of layers 2, 30, 58 -- not their outputs.
    assert sglang.call("captures", "KimiK25ForConditionalGeneration", [2, 30, 58], 61) == [2, 30, 58]
    assert layer_ids.captured([2, 30, 58], "KimiK25ForConditionalGeneration") == [2, 30, 58]
    assert layer_ids.captured([2, 30, 58], "LlamaForCausalLM") == [3, 31, 59]
    # DeepSeek's one exception: a first id of 1 shifts every id.
    assert layer_ids.captured([1, 30, 58], "DeepseekV3ForCausalLM") == [2, 31, 59]


def test_ids_out_of_order_are_refused_since_sglang_concatenates_in_layer_order() -> None:
    with pytest.raises(StageInputError, match=r"increasing order \(\[2, 30, 58\]\)"):
        layer_ids.validate_layers([30, 2, 58], 61, "KimiK25ForConditionalGeneration")


def test_an_architecture_not_checked_against_sglang_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"]}))
    with pytest.raises(StageInputError, match=r"GptOssForCausalLM is not one whose layer ids aerie has checked"):
        layer_ids.rule(layer_ids.target_architecture(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(StageInputError, match="has no architectures list"):
        layer_ids.target_architecture(tmp_path)


def test_the_ids_valid_range_is_named_per_architecture() -> None:
    with pytest.raises(StageInputError, match=r"\[5\] out of range for a 6-layer LlamaForCausalLM target.*0\.\.4"):
        layer_ids.validate_layers([3, 4, 5], N, "LlamaForCausalLM")
    layer_ids.validate_layers([3, 4, 5], N, "DeepseekV3ForCausalLM")  # the input of the last layer
    layer_ids.validate_layers([0, 1, 2], N, "DeepseekV3ForCausalLM")  # 0: the embedding output
    with pytest.raises(StageInputError, match=r"\[5\] out of range .*first id is 1.*0\.\.4"):
        layer_ids.validate_layers([1, 2, 5], N, "DeepseekV3ForCausalLM")


# -- what extract stores, on tiny real models of each architecture ---------------------------------------


def build_tiny(arch: str, path: Path) -> Path:
    """A seeded random `arch` of N layers at toy size, saved like a downloaded model."""
    import transformers

    from tests.tiny_kimi import build_kimi_model

    if arch == "KimiK25ForConditionalGeneration":
        return build_kimi_model(path, 128, layers=N)
    kind = arch.removesuffix("ForCausalLM")
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=N, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=False)
    extra = {
        "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16),
        "Qwen3Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
        "DeepseekV2": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                           first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1),
    }
    extra["DeepseekV3"] = extra["DeepseekV2"]
    if kind.startswith("Deepseek"):
        common["num_key_value_heads"] = 4  # MLA: one latent shared by every head
    torch.manual_seed(0)
    config = getattr(transformers, f"{kind}Config")(**common, **extra.get(kind, {}))
    getattr(transformers, arch)(config).save_pretrained(path)
    return path


def reference_states(model_dir: Path, ids: list[int]) -> list[torch.Tensor]:
    """HF ``output_hidden_states`` of the language model, the way a user would check them."""
    model = load_target(model_dir, "float32", False, "cpu")
    with torch.no_grad():
        return list(model.model(torch.tensor([ids]), output_hidden_states=True).hidden_states)


@pytest.mark.e2e
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_extract_keeps_the_hf_hidden_states_sglang_feeds_the_draft(sglang, arch: str, tmp_path: Path) -> None:
    target = build_tiny(arch, tmp_path / arch)
    assert layer_ids.target_architecture(target) == arch  # from the saved config, as extract reads it
    tokens = [5, 17, 3, 99, 42, 8, 8, 61]
    states = reference_states(target, tokens)
    decoder = decoder_of(load_target(target, "float32", False, "cpu"))
    for ids in ([1, 2, 3], [2, 3, 4]):
        served = sglang.call("captures", arch, ids, N)
        (aux, _), = capture(decoder, [tokens], layer_ids.captured(ids, arch), "cpu")
        torch.testing.assert_close(aux, torch.cat([states[j][0] for j in served], -1), rtol=1e-4, atol=1e-5)
