"""A Kimi-K2.5-shaped target through extract and train: multimodal wrapper, MLA, MoE, hooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from remote.eagle3.extractor import capture, decoder_of, load_target
from remote.eagle3.shards import ShardStore, load_sample
from tests.pipeline_fixtures import (
    TINY_LAYERS,
    kimi_target,
    make_records,
    run_stage,
    stage_env,
    text_vocab_size,
    tiny_target,
    write_prep,
)

__all__ = ["kimi_target", "tiny_target"]  # fixtures used below

RECORDS = 6


@pytest.fixture(scope="module")
def kimi_extracted(kimi_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("kimi-root")
    records = make_records(RECORDS, text_vocab_size(kimi_target))
    write_prep(root / "data" / "A1", records)
    settings = {"layers": TINY_LAYERS, "dtype": "float32", "batch_size": 2, "shard_size": 4}
    env = stage_env(root, "extract", settings, {"target": {"model": str(kimi_target)}})
    result = run_stage("extract", env)
    assert result.returncode == 0, result.stderr
    return {"root": root, "env": env, "records": records}


def test_the_kimi_shaped_target_loads_as_its_language_model_without_the_vision_tower(kimi_target: Path) -> None:
    from safetensors import safe_open

    model = load_target(kimi_target, "float32", False, "cpu")
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert type(model.model.layers[1].mlp).__name__ == "DeepseekV3MoE"  # MoE after the dense first layer
    assert not any("vision" in name for name, _ in model.named_parameters())
    # The weights are the file's (prefix stripped), not a fresh random init.
    with safe_open(str(kimi_target / "model.safetensors"), framework="pt") as weights:
        stored = weights.get_tensor("language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight")
    assert torch.equal(model.model.layers[1].self_attn.kv_a_proj_with_mqa.weight, stored)


def test_kimi_states_stored_by_extract_equal_a_direct_forward_pass(kimi_extracted: dict, kimi_target: Path) -> None:
    model = load_target(kimi_target, "float32", False, "cpu")
    files = ShardStore(Path(kimi_extracted["env"]["AERIE_OUTPUT"])).sample_files()
    assert len(files) == RECORDS
    for path, record in zip(files, kimi_extracted["records"]):
        sample = load_sample(path)
        with torch.no_grad():
            states = model.model(torch.tensor([record["input_ids"]]), output_hidden_states=True).hidden_states
        # DeepseekV3 in SGLang: id i is the input of layer i -- [0, 1, 2] starts at the embedding output.
        torch.testing.assert_close(sample["aux_hidden_state"], torch.cat([states[i] for i in TINY_LAYERS], -1), rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(sample["hidden_state"], states[-1], rtol=1e-3, atol=1e-4)


@pytest.fixture(scope="module")
def kimi6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-layer Kimi-shaped target: room for ids [2, 3, 4] and for [1, 2, 3] (inputs of layers 2..4)."""
    from tests.tiny_kimi import build_kimi_model

    return build_kimi_model(tmp_path_factory.mktemp("kimi6"), 128, layers=6)


@pytest.mark.parametrize(("layers", "states_at"), [([2, 3, 4], [2, 3, 4]), ([1, 2, 3], [2, 3, 4])])
def test_extract_stores_for_kimi_the_hidden_states_sglang_serves(
        kimi6: Path, tmp_path: Path, layers: list[int], states_at: list[int]) -> None:
    """SGLang's DeepseekV3 (Kimi-K2.5 hands it the call) captures the input of layer id, HF hidden_states[id],
    unless the first id is 1: then hidden_states[id + 1]. Held against SGLang's own code in test_layer_ids."""
    records = make_records(4, 128)
    write_prep(tmp_path / "data" / "A1", records)
    settings = {"layers": layers, "dtype": "float32", "batch_size": 2, "shard_size": 4}
    env = stage_env(tmp_path, "extract", settings, {"target": {"model": str(kimi6)}})

    result = run_stage("extract", env)

    assert result.returncode == 0, result.stderr
    output = Path(env["AERIE_OUTPUT"])
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["hidden_states"] == states_at and manifest["architecture"] == "KimiK25ForConditionalGeneration"
    assert "input of decoder layer i = HF hidden_states[i]" in manifest["layer_convention"]
    model = load_target(kimi6, "float32", False, "cpu")
    for path, record in zip(ShardStore(output).sample_files(), records):
        with torch.no_grad():
            states = model.model(torch.tensor([record["input_ids"]]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(load_sample(path)["aux_hidden_state"], torch.cat([states[j] for j in states_at], -1),
                                   rtol=1e-3, atol=1e-4)


def test_train_makes_a_draft_for_the_kimi_shaped_target(kimi_extracted: dict, kimi_target: Path) -> None:
    settings = {"draft_vocab_size": 100, "epochs": 1, "batch_size": 2, "learning_rate": 3e-3, "ttt_steps": 2}
    env = stage_env(kimi_extracted["root"], "train", settings, {"target": {"model": str(kimi_target)}})
    result = run_stage("train", env)
    assert result.returncode == 0, result.stderr
    config = json.loads((Path(env["AERIE_OUTPUT"]) / "draft" / "config.json").read_text())
    assert config["target_hidden_size"] == 64 and config["vocab_size"] == text_vocab_size(kimi_target)
    assert config["head_dim"] == 16  # hidden / heads: MLA's head_dim (its rope part) is not a Llama head's width
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == TINY_LAYERS


def test_capture_never_asks_for_every_layer_s_hidden_states(tiny_target: Path) -> None:
    model = load_target(tiny_target, "float32", False, "cpu")
    decoder = decoder_of(model)
    asked: list[dict] = []
    handle = decoder.register_forward_pre_hook(lambda module, args, kwargs: asked.append(kwargs), with_kwargs=True)
    try:
        (aux, final), = capture(decoder, [[5, 6, 7, 8]], [1, 2, 3], "cpu")
    finally:
        handle.remove()
    assert not asked[0].get("output_hidden_states")
    assert aux.shape == (4, 3 * 64) and final.shape == (4, 64)
    # The hooks are removed afterwards: a plain forward keeps nothing.
    assert not decoder.layers[1]._forward_pre_hooks and not decoder.norm._forward_hooks
