"""A tiny Kimi-K2.5-shaped target, built offline, for the tests.

Kimi-K2.5 is a multimodal wrapper (``KimiK25ForConditionalGeneration``,
``model_type: kimi_k25``) around a DeepseekV3-style language model -- MoE
layers after ``first_k_dense_replace`` dense ones, and multi-head latent
attention (MLA: ``q_lora_rank``, ``kv_lora_rank``, rope and no-rope head
parts). Its ``config.json`` keeps the language model's shape in
``text_config`` (``model_type: kimi_k2``) beside a ``vision_config``, and its
safetensors name the language model's weights ``language_model.*`` beside
``vision_tower.*`` and ``mm_projector.*``.

This builds the same layout at toy size from transformers' own
``DeepseekV3ForCausalLM``, so the extract and train stages meet the real
model's config and weight names without ``trust_remote_code`` or a download.
The vision tower is a couple of small random tensors: the stages must skip it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from remote.eagle3.target import LANGUAGE_PREFIX
from remote.demo.tiny_model import write_index

ARCHITECTURE = "KimiK25ForConditionalGeneration"


def text_config(vocab_size: int, hidden_size: int, layers: int) -> dict:
    """A DeepseekV3 text config with every MLA and MoE feature on, at toy size."""
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        moe_intermediate_size=hidden_size // 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,  # layer 0 dense, the rest MoE, like Kimi's 1 of 61
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        initializer_range=0.3,
        dtype="float32",
    )
    values = config.to_dict()
    # NOTE: Kimi's own text model_type; loaders must map it to deepseek_v3.
    values["model_type"] = "kimi_k2"
    values["architectures"] = ["DeepseekV3ForCausalLM"]
    return values


def build_kimi_model(path: str | Path, vocab_size: int, hidden_size: int = 64, layers: int = 4, seed: int = 0) -> Path:
    """Save a seeded random Kimi-K2.5-shaped model (config.json, model.safetensors and its index) into `path`."""
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    text = text_config(vocab_size, hidden_size, layers)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**text, "model_type": "deepseek_v3"})).to(torch.float32).eval()
    state = {LANGUAGE_PREFIX + name: t.detach().contiguous() for name, t in model.state_dict().items()}
    # A stand-in vision tower: its names end like the language model's, so a reader must skip it.
    state["vision_tower.patch_embed.embed_tokens.weight"] = torch.randn(8, 16)
    state["mm_projector.proj.0.weight"] = torch.randn(hidden_size, 16)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_index(path)
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {"model_type": "moonvit", "hidden_size": 16, "patch_size": 14},
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


#: Kimi-K2.5's quantization config (compressed-tensors pack-quantized INT4, group 32, symmetric, routed experts
#: only), as its checkpoint ships it; the ignore list as vLLM's tests quote Kimi-K2.6's, the same family's.
QUANTIZATION_CONFIG = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"},
    }},
    "format": "pack-quantized",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<fused>gate_up_proj|down_proj)$")


def _scheme():
    from compressed_tensors.quantization import QuantizationScheme

    group = QUANTIZATION_CONFIG["config_groups"]["group_0"]
    return QuantizationScheme(targets=group["targets"], weights=group["weights"])


def compress_int4(weight) -> dict:
    """{weight_packed, weight_scale, weight_shape} of one expert's projection, by compressed-tensors' own
    qparams and pack-quantized compressor (scales in bfloat16, as Kimi-K2.5 stores them)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = _scheme()
    groups = weight.reshape(weight.shape[0], -1, scheme.weights.group_size)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
    return PackedQuantizationCompressor.compress({"weight": weight.contiguous(), "weight_scale": scale.to(torch.bfloat16)}, scheme)


def per_expert(name: str, fused, intermediate: int) -> dict:
    """transformers' fused expert tensor as Kimi-K2.5's checkpoint names it: one INT4 tensor set per expert."""
    match = EXPERT.match(name)
    out = {}
    for expert in range(fused.shape[0]):
        if match["fused"] == "gate_up_proj":  # transformers' gate_up is [gate; up] along the output dim
            parts = {"gate_proj": fused[expert, :intermediate], "up_proj": fused[expert, intermediate:]}
        else:
            parts = {"down_proj": fused[expert]}
        for proj, weight in parts.items():
            for key, tensor in compress_int4(weight).items():
                out[f"{match['prefix']}.{expert}.{proj}.{key}"] = tensor
    return out


def build_kimi_int4_model(path: str | Path, vocab_size: int, placement: str = "text", hidden_size: int = 64,
                          layers: int = 4, seed: int = 0) -> Path:
    """A tiny target in Kimi-K2.5's real on-disk format: one tensor set per routed expert, those INT4
    (compressed-tensors pack-quantized), everything else bfloat16, and `quantization_config` inside
    ``text_config`` (`placement` "text") or at the wrapper's top level ("top")."""
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    text = {**text_config(vocab_size, hidden_size, layers), "dtype": "bfloat16"}
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**text, "model_type": "deepseek_v3"})).eval()
    state = {}
    for name, tensor in model.state_dict().items():
        if EXPERT.match(name):
            state.update(per_expert(LANGUAGE_PREFIX + name, tensor.float(), text["moe_intermediate_size"]))
        else:
            state[LANGUAGE_PREFIX + name] = tensor.to(torch.bfloat16).contiguous()
    state["vision_tower.patch_embed.proj.weight"] = torch.randn(8, 16).to(torch.bfloat16)
    state["mm_projector.proj.0.weight"] = torch.randn(hidden_size, 16).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_index(path)
    config = {"architectures": [ARCHITECTURE], "model_type": "kimi_k25", "text_config": text,
              "vision_config": {"model_type": "moonvit", "hidden_size": 16, "patch_size": 14}, "tie_word_embeddings": False}
    (config if placement == "top" else text)["quantization_config"] = QUANTIZATION_CONFIG
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def reference_model(path: str | Path):
    """The float32 reference for an INT4 target: its safetensors read and dequantized by compressed-tensors'
    decompressor, outside transformers' loader, into a DeepseekV3ForCausalLM loaded strictly (no key left out)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from safetensors.torch import load_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    text = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
    stored = {k.removeprefix(LANGUAGE_PREFIX): v for k, v in load_file(str(path / "model.safetensors")).items()
              if k.startswith(LANGUAGE_PREFIX)}
    dense: dict = {}
    for name in sorted(k for k in stored if k.endswith(".weight_packed")):
        module = name.removesuffix(".weight_packed")
        parts = {key: stored.pop(f"{module}.{key}") for key in ("weight_packed", "weight_scale", "weight_shape")}
        dense[module] = PackedQuantizationCompressor.decompress(parts, _scheme())["weight"].float()
    state = {k: v.float() for k, v in stored.items()}
    for layer in range(text["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        if f"{prefix}.0.gate_proj" in dense:
            count = text["n_routed_experts"]
            state[f"{prefix}.gate_up_proj"] = torch.stack(
                [torch.cat([dense[f"{prefix}.{e}.gate_proj"], dense[f"{prefix}.{e}.up_proj"]]) for e in range(count)])
            state[f"{prefix}.down_proj"] = torch.stack([dense[f"{prefix}.{e}.down_proj"] for e in range(count)])
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**text, "model_type": "deepseek_v3", "dtype": "float32"}))
    model.load_state_dict(state, strict=True)
    return model.to(torch.float32).eval()
