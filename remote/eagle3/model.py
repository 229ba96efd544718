"""The EAGLE-3 draft model, in plain torch, with SGLang's parameter names.

One Llama decoder layer whose attention reads ``concat(input_layernorm(embeds),
hidden_norm(hidden))`` (2H wide), as in SGLang's ``llama_eagle3.py``::

    fused    = fc(concat(aux states))              # 3H -> H, first step only
    x        = concat(input_layernorm(embed(token)), hidden_norm(h))
    h        = self_attn(x) + h
    h        = mlp(post_attention_layernorm(h)) + h  # passed on to the next step
    logits   = lm_head(norm(h))                    # over the draft vocabulary

The module tree is named so that ``state_dict()`` keys are the names SGLang's
``LlamaForCausalLMEagle3.load_weights`` looks up: ``fc.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``norm.weight``, ``lm_head.weight``, and the buffers ``d2t`` / ``t2d``.
The embeddings are a frozen copy of the target's; SGLang shares the target's
own at load time, so checkpoints leave them out.

Training-time test: step ``k`` of an unrolled chain feeds the previous step's
``h`` back in, at positions shifted by ``k``; its attention sees the real
prefix (step 0's keys, causally) plus, at the same position only, the keys of
steps ``1..k`` -- what the draft sees when it decodes ``k`` tokens ahead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    """Llama's rotary embedding (rotate-half layout, as SGLang's llama uses)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None], emb.sin()[:, None]  # (B, 1, T, D)


class Attention(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads") or self.heads
        self.head_dim = config.get("head_dim") or hidden // self.heads
        # NOTE: 2H in: the embedding and the hidden state side by side.
        self.q_proj = nn.Linear(2 * hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        cache.append((k, v))
        out = ttt_attention(q, cache, self.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


def ttt_attention(q: torch.Tensor, cache: KVCache, head_dim: int) -> torch.Tensor:
    """Causal attention over step 0's keys plus each later step's key at the same position."""
    scale = head_dim**-0.5
    k0, v0 = cache[0]
    length = q.shape[-2]
    scores = (q @ k0.transpose(-1, -2)) * scale
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    diagonal = [((q * k).sum(-1, keepdim=True) * scale) for k, _ in cache[1:]]
    weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    out = weights[..., :length] @ v0
    for j, (_, v) in enumerate(cache[1:]):
        out = out + weights[..., length + j : length + j + 1] * v
    return out


class DecoderLayer(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(config)
        self.mlp = MLP(hidden, config["intermediate_size"])

    def forward(self, embeds, hidden, cos, sin, cache: KVCache) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = self.self_attn(x, cos, sin, cache) + hidden
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden


class Eagle3Draft(nn.Module):
    """The draft: fc, one decoder layer, norm, a reduced-vocabulary lm_head."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = dict(config)
        hidden = config["hidden_size"]
        target_hidden = config.get("target_hidden_size") or hidden
        aux = len((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
        self.embed_tokens = nn.Embedding(config["vocab_size"], hidden)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(aux * target_hidden, hidden, bias=False)
        self.midlayer = DecoderLayer(config)
        self.norm = RMSNorm(hidden, config.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(hidden, config["draft_vocab_size"], bias=False)
        head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
        self.rotary = Rotary(head_dim, float(config.get("rope_theta") or 10000.0))
        self.register_buffer("d2t", torch.zeros(config["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config["vocab_size"], dtype=torch.bool))

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's concatenated aux states, fused to the draft's width."""
        return self.fc(aux)

    def step(
        self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: (hidden for the next step, logits over the draft vocabulary)."""
        cos, sin = self.rotary(positions)
        hidden = self.midlayer(self.embed_tokens(input_ids), hidden, cos.to(hidden.dtype), sin.to(hidden.dtype), cache)
        return hidden, self.lm_head(self.norm(hidden))

    def forward(self, input_ids: torch.Tensor, aux: torch.Tensor, steps: int = 1) -> list[torch.Tensor]:
        """Logits of `steps` unrolled training-time-test steps; step k reads token t + k + 1 at position t."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
        hidden, cache, logits = self.project(aux), [], []
        for k in range(steps):
            hidden, out = self.step(shift_left(input_ids, k + 1), hidden, positions + k, cache)
            logits.append(out)
        return logits

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft ids (SGLang's ``hot_token_id = d2t + arange``)."""
        return draft_ids + self.d2t[draft_ids]

    @classmethod
    def warm(cls, config: dict[str, Any], d2t: torch.Tensor, t2d: torch.Tensor, embed: torch.Tensor,
             head: torch.Tensor) -> "Eagle3Draft":
        """A new draft with the target's embedding, the vocabulary map and, as a warm start, the
        target's lm_head rows for the kept tokens."""
        # NOTE: seeded, so a rerun (and a resumed run) starts from the same draft, on either route.
        torch.manual_seed(0)
        draft = cls(config)
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(embed.float())
            draft.d2t.copy_(d2t)
            draft.t2d.copy_(t2d)
            draft.lm_head.weight.copy_(head.float()[t2d])
        return draft


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, n:] padded with zeros back to x's length."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat([x[:, n:], pad], dim=1)
