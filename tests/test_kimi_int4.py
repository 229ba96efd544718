"""The HF engine on Kimi-K2.5's real on-disk format: per-expert INT4 tensors (compressed-tensors' own
compressor), bfloat16 elsewhere, the quantization config inside text_config or at the wrapper's top level."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from remote.eagle3 import StageInputError
from remote.eagle3.extractor import language_config, load_target
from remote.eagle3.target import read_target
from remote.eagle3.shards import ShardStore, load_sample
from tests.pipeline_fixtures import TINY_LAYERS, make_records, run_stage, stage_env, write_prep
from tests.tiny_kimi import build_kimi_int4_model, reference_model

pytestmark = pytest.mark.e2e  # each test builds or loads a real model, most run the extract stage

VOCAB = 128
RECORDS = 5


@pytest.fixture(scope="module", params=["text", "top"])
def int4_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_kimi_int4_model(tmp_path_factory.mktemp(f"kimi-int4-{request.param}"), VOCAB, placement=request.param)


def _extract(root: Path, target: Path, dtype: str = "float32") -> tuple[dict, list[dict]]:
    records = make_records(RECORDS, VOCAB)
    write_prep(root / "data" / "A1", records)
    settings = {"layers": TINY_LAYERS, "dtype": dtype, "batch_size": 2, "shard_size": 3}
    env = stage_env(root, "extract", settings, {"target": {"model": str(target)}})
    return env, records


def test_the_checkpoint_holds_one_int4_tensor_set_per_routed_expert(int4_target: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(int4_target / "model.safetensors"), framework="pt") as weights:
        names = set(weights.keys())
        packed = weights.get_slice("language_model.model.layers.1.mlp.experts.7.up_proj.weight_packed")
        scale = weights.get_slice("language_model.model.layers.1.mlp.experts.7.up_proj.weight_scale")
        assert (packed.get_dtype(), scale.get_dtype()) == ("I32", "BF16")
        assert packed.get_shape() == [32, 64 // 8] and scale.get_shape() == [32, 64 // 32]
        assert weights.get_slice("language_model.model.layers.1.self_attn.q_a_proj.weight").get_dtype() == "BF16"
    assert not any(name.endswith("gate_up_proj") or name.endswith("experts.down_proj") for name in names)
    config = json.loads((int4_target / "config.json").read_text())
    inside = config["text_config"].get("quantization_config") or config.get("quantization_config")
    assert inside["format"] == "pack-quantized" and inside["config_groups"]["group_0"]["weights"]["group_size"] == 32


def test_extract_stores_the_states_of_a_float_forward_of_the_dequantized_weights(int4_target: Path, tmp_path: Path) -> None:
    env, records = _extract(tmp_path, int4_target)

    result = run_stage("extract", env)

    assert result.returncode == 0, result.stderr
    reference = reference_model(int4_target)
    files = ShardStore(Path(env["AERIE_OUTPUT"])).sample_files()
    assert len(files) == RECORDS
    for path, record in zip(files, records):
        sample = load_sample(path)
        with torch.no_grad():
            states = reference.model(torch.tensor([record["input_ids"]]), output_hidden_states=True).hidden_states
        assert sample["aux_hidden_state"].dtype == torch.float32
        # DeepseekV3 in SGLang: id i captures the input of layer i, HF hidden_states[i].
        torch.testing.assert_close(sample["aux_hidden_state"], torch.cat([states[i] for i in TINY_LAYERS], -1), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sample["hidden_state"], states[-1], rtol=1e-4, atol=1e-5)


def test_dequantized_experts_are_converted_to_the_dtype_the_settings_name(int4_target: Path) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        model = load_target(int4_target, str(dtype).removeprefix("torch."), False, "cpu")
        dtypes = {name: p.dtype for name, p in model.named_parameters()}
        assert dtypes["model.layers.1.mlp.experts.gate_up_proj"] == dtype
        assert dtypes["model.layers.1.self_attn.q_a_proj.weight"] == dtype
        # the router alone stays float32: DeepseekV3's own _keep_in_fp32_modules, as in any load of it
        assert {n for n, d in dtypes.items() if d != dtype} <= {n for n in dtypes if ".mlp.gate." in n}


def test_the_load_that_misses_the_quantization_config_is_refused_naming_the_expert_keys(int4_target: Path) -> None:
    """What transformers does with no quantization config in the config it builds from (the top-level placement
    before aerie honoured it): the experts are MISSING and initialised at random, the packed tensors unused."""
    from transformers import AutoModelForCausalLM

    from remote.eagle3 import load_report

    text = language_config(read_target(int4_target))
    text.quantization_config = None
    del text.quantization_config
    _, info = AutoModelForCausalLM.from_pretrained(int4_target, config=text, key_mapping={r"^language_model\.": ""},
                                                   dtype=torch.float32, output_loading_info=True)
    with pytest.raises(StageInputError) as refused:
        load_report.check_complete(info, int4_target, wrapper=True)
    message = str(refused.value)
    assert "\n" not in message and "model.layers.1.mlp.experts.down_proj" in message
    assert "would be random" in message and "weight_packed" in message


def test_extract_refuses_a_checkpoint_missing_one_expert_s_tensors(int4_target: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = Path(shutil.copytree(int4_target, tmp_path / "broken"))
    state = load_file(str(broken / "model.safetensors"))
    gone = [k for k in state if ".layers.2.mlp.experts.5." in k]
    save_file({k: v for k, v in state.items() if k not in gone}, str(broken / "model.safetensors"), metadata={"format": "pt"})
    env, _ = _extract(tmp_path / "root", broken)

    result = run_stage("extract", env)

    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "did not load whole" in last and "Traceback" not in result.stderr
    assert not ShardStore(Path(env["AERIE_OUTPUT"])).sample_files()


def test_a_dense_weight_beside_a_packed_expert_is_refused_before_loading(int4_target: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    extra = Path(shutil.copytree(int4_target, tmp_path / "extra"))
    state = load_file(str(extra / "model.safetensors"))
    state["language_model.model.layers.1.mlp.experts.0.gate_proj.weight"] = torch.zeros(32, 64, dtype=torch.bfloat16)
    save_file(state, str(extra / "model.safetensors"), metadata={"format": "pt"})

    with pytest.raises(StageInputError, match=r"would not be loaded: .*layers\.1\.mlp\.experts\.0\.gate_proj\.weight$"):
        load_target(extra, "float32", False, "cpu")


def test_a_wrapper_s_vision_tower_is_the_one_part_left_unread(int4_target: Path) -> None:
    model = load_target(int4_target, "float32", False, "cpu")
    assert not any("vision" in name or "mm_projector" in name for name, _ in model.named_parameters())
