"""A target with Kimi-K2.5's real config, tensor names, dtypes and shapes -- headers over sparse files, no data.

For sizing and refusals only: each of the 64 safetensors files declares its tensors in its header
and is then extended to its full size with a hole (`truncate`), so the checkpoint reads as ~595 GB
while holding a few MB on disk. Any read of a weight returns zeros; nothing here can be run.

Reconstructed from public sources, not copied from the checkpoint: the text config is Kimi-K2's
DeepseekV3 shape (61 layers, hidden 7168, 384 routed experts of 2048, 8 per token, 1 shared, MLA
with q_lora 1536 / kv_lora 512, vocab 163,840) as TensorRT-LLM's and vLLM's Kimi-K2.5 test
configs spell it; the quantization config is pack-quantized INT4, group 32, symmetric, experts only
(`tests.tiny_kimi.QUANTIZATION_CONFIG`), inside ``text_config``. The language model's tensor names are
the checkpoint's (``language_model.model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight_packed``
...); the vision tower's (MoonViT, 27 blocks of 1152) follow vLLM's KimiK25VisionConfig defaults
with approximate names. The shard split is by layer, not the real one's.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.tiny_kimi import ARCHITECTURE, QUANTIZATION_CONFIG

TEXT_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 262144, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128,
    "vocab_size": 163840,
}
VISION_CONFIG = {
    "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64, "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed", "num_attention_heads": 16, "num_hidden_layers": 27, "hidden_size": 1152,
    "intermediate_size": 4304, "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger", "mm_hidden_size": 1152,
    "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
}
BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}


def config(placement: str = "text") -> dict:
    text = dict(TEXT_CONFIG)
    wrapper = {"architectures": [ARCHITECTURE], "model_type": "kimi_k25", "bos_token_id": 163584,
               "eos_token_id": 163585, "pad_token_id": 163839, "media_placeholder_token_id": 163605,
               "tie_word_embeddings": False, "use_unified_vision_chunk": True, "text_config": text,
               "vision_config": dict(VISION_CONFIG)}
    (wrapper if placement == "top" else text)["quantization_config"] = QUANTIZATION_CONFIG
    return wrapper


def expert_tensors(prefix: str, rows: int, columns: int) -> dict[str, tuple[str, list[int]]]:
    """One INT4 projection as compressed-tensors stores it: 8 values per int32, a bfloat16 scale per 32."""
    return {f"{prefix}.weight_packed": ("I32", [rows, columns // 8]),
            f"{prefix}.weight_scale": ("BF16", [rows, columns // 32]),
            f"{prefix}.weight_shape": ("I64", [2])}


def layer_tensors(layer: int) -> dict[str, tuple[str, list[int]]]:
    c = TEXT_CONFIG
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    p = f"language_model.model.layers.{layer}"
    out = {f"{p}.input_layernorm.weight": ("BF16", [hidden]), f"{p}.post_attention_layernorm.weight": ("BF16", [hidden]),
           f"{p}.self_attn.q_a_proj.weight": ("BF16", [c["q_lora_rank"], hidden]),
           f"{p}.self_attn.q_a_layernorm.weight": ("BF16", [c["q_lora_rank"]]),
           f"{p}.self_attn.q_b_proj.weight": ("BF16", [heads * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]), c["q_lora_rank"]]),
           f"{p}.self_attn.kv_a_proj_with_mqa.weight": ("BF16", [c["kv_lora_rank"] + c["qk_rope_head_dim"], hidden]),
           f"{p}.self_attn.kv_a_layernorm.weight": ("BF16", [c["kv_lora_rank"]]),
           f"{p}.self_attn.kv_b_proj.weight": ("BF16", [heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]]),
           f"{p}.self_attn.o_proj.weight": ("BF16", [hidden, heads * c["v_head_dim"]])}
    if layer < c["first_k_dense_replace"]:
        inner = c["intermediate_size"]
        out.update({f"{p}.mlp.gate_proj.weight": ("BF16", [inner, hidden]), f"{p}.mlp.up_proj.weight": ("BF16", [inner, hidden]),
                    f"{p}.mlp.down_proj.weight": ("BF16", [hidden, inner])})
        return out
    inner, experts = c["moe_intermediate_size"], c["n_routed_experts"]
    shared = inner * c["n_shared_experts"]
    out.update({f"{p}.mlp.gate.weight": ("BF16", [experts, hidden]), f"{p}.mlp.gate.e_score_correction_bias": ("F32", [experts]),
                f"{p}.mlp.shared_experts.gate_proj.weight": ("BF16", [shared, hidden]),
                f"{p}.mlp.shared_experts.up_proj.weight": ("BF16", [shared, hidden]),
                f"{p}.mlp.shared_experts.down_proj.weight": ("BF16", [hidden, shared])})
    for e in range(experts):
        out.update(expert_tensors(f"{p}.mlp.experts.{e}.gate_proj", inner, hidden))
        out.update(expert_tensors(f"{p}.mlp.experts.{e}.up_proj", inner, hidden))
        out.update(expert_tensors(f"{p}.mlp.experts.{e}.down_proj", hidden, inner))
    return out


def vision_tensors() -> dict[str, tuple[str, list[int]]]:
    v = VISION_CONFIG
    width, inner, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    out = {"vision_tower.patch_embed.proj.weight": ("BF16", [width, 3, patch, patch]),
           "vision_tower.patch_embed.proj.bias": ("BF16", [width]),
           "vision_tower.patch_embed.pos_emb.weight": ("BF16", [v["init_pos_emb_height"], v["init_pos_emb_width"], width])}
    for block in range(v["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{block}"
        for name, shape in (("norm0", [width]), ("norm1", [width]), ("wqkv", [3 * width, width]), ("wo", [width, width]),
                            ("mlp.fc0", [inner, width]), ("mlp.fc1", [width, inner])):
            out[f"{b}.{name}.weight"] = ("BF16", shape)
            out[f"{b}.{name}.bias"] = ("BF16", shape[:1])
    merged = width * v["merge_kernel_size"][0] * v["merge_kernel_size"][1]
    out.update({"vision_tower.encoder.final_layernorm.weight": ("BF16", [width]),
                "mm_projector.pre_norm.weight": ("BF16", [width]), "mm_projector.pre_norm.bias": ("BF16", [width]),
                "mm_projector.proj.0.weight": ("BF16", [merged, merged]), "mm_projector.proj.0.bias": ("BF16", [merged]),
                "mm_projector.proj.2.weight": ("BF16", [TEXT_CONFIG["hidden_size"], merged]),
                "mm_projector.proj.2.bias": ("BF16", [TEXT_CONFIG["hidden_size"]])})
    return out


def shards() -> list[dict[str, tuple[str, list[int]]]]:
    """64 files: one per decoder layer, then the embedding and final norm, the lm_head, the vision tower."""
    c = TEXT_CONFIG
    hidden, vocab = c["hidden_size"], c["vocab_size"]
    files = [layer_tensors(layer) for layer in range(c["num_hidden_layers"])]
    files.append({"language_model.model.embed_tokens.weight": ("BF16", [vocab, hidden]),
                  "language_model.model.norm.weight": ("BF16", [hidden])})
    files.append({"language_model.lm_head.weight": ("BF16", [vocab, hidden])})
    files.append(vision_tensors())
    return files


def write_sparse(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header declares `tensors` and whose data is a hole of the right size."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        size = BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        handle.truncate(8 + len(encoded) + offset)


def build_kimi_k25_headers(path: str | Path, placement: str = "text") -> Path:
    """Write the Kimi-K2.5-shaped checkpoint (config.json, 64 sparse safetensors, their index) into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    files = shards()
    weight_map = {}
    for number, tensors in enumerate(files, 1):
        name = f"model-{number:05d}-of-{len(files):06d}.safetensors"
        write_sparse(path / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config(placement), indent=2))
    return path
