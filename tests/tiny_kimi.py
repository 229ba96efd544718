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
