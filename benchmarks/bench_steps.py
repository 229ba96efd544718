"""One EAGLE-3 train step, aerie's against SpecForge 0.2.0's on the same batch; HF capture against the bare forward.

The GPU check (benchmarks/gpu_check.sh runs it on an H200) at Kimi-K2.5's width: hidden 7168,
draft vocabulary 32,000 of the target's 163,840, TTT 7, bfloat16, batch 1 x 2,048 tokens.
``--small`` is the same at a width a CPU runs in a minute, to show it works.

- ``aerie_step``: `remote.eagle3.trainer.train_step` (fp32 weights and AdamW, bf16 autocast on a
  GPU, gradients clipped at 0.5, the cosine schedule), as the train stage runs it;
- ``specforge_step``: SpecForge's own ``Eagle3TrainStrategy.forward_loss`` over its
  ``OnlineEagle3Model`` and ``LlamaForCausalLMEagle3`` in bf16 with its ``BF16Optimizer`` (fp32
  masters), its target head re-run over the stored final states, as ``specforge train`` runs an
  offline step; its attention ``flex_attention`` on a GPU (its default), ``sdpa`` on a CPU;
- both drafts start from the same target embedding, vocabulary map and batch (aux states of
  three layers, final states), and each is timed after two warm-up steps (flex attention compiles);
- ``capture``: `remote.eagle3.extractor.capture` (hooks on three layers and the final norm, the
  states copied to the CPU) against the bare forward pass of the same random Llama and batch.

Figures are tokens/s; ``specforge_over_aerie`` is SpecForge's tokens/s over aerie's, and
``capture_ratio`` the capture's over the bare forward pass's. docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

import torch

from benchmarks.harness.timing import timed
#: Kimi-K2.5's widths (its text config) and the draft SpecForge trains for it.
#: 56 heads of 128: a Llama draft layer at hidden 7168 (Kimi's own attention is MLA), a head size flex attention takes.
KIMI = {"hidden": 7168, "vocab": 163840, "draft_vocab": 32000, "heads": 56, "intermediate": 18432, "ttt": 7,
        "batch": 1, "seq": 2048, "layers": 8, "dtype": "bfloat16"}
SMALL = {"hidden": 256, "vocab": 4096, "draft_vocab": 1024, "heads": 4, "intermediate": 688, "ttt": 7,
         "batch": 1, "seq": 256, "layers": 8, "dtype": "bfloat16"}
AUX_LAYERS = [1, 3, 4]  # SpecForge's rule for an 8-layer target: 1, L/2 - 1, L - 4


def target_config(shape: dict[str, Any]) -> dict[str, Any]:
    """A Llama target of `shape`'s widths (what the draft is shaped after)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape["hidden"],
            "intermediate_size": shape["intermediate"], "num_attention_heads": shape["heads"],
            "num_key_value_heads": shape["heads"], "num_hidden_layers": shape["layers"], "vocab_size": shape["vocab"],
            "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False}


def the_batch(shape: dict[str, Any], device: str) -> dict[str, torch.Tensor]:
    """One batch of stored states as extract writes them (bf16), every position trained but the prompt's first eighth."""
    torch.manual_seed(0)
    b, t, h = shape["batch"], shape["seq"], shape["hidden"]
    mask = torch.ones(b, t, dtype=torch.long)
    mask[:, : t // 8] = 0
    return {"input_ids": torch.randint(0, shape["vocab"], (b, t)), "loss_mask": mask,
            "aux": (torch.randn(b, t, 3 * h) * 0.5).to(torch.bfloat16), "final": torch.randn(b, t, h).to(torch.bfloat16)}


def shared_weights(shape: dict[str, Any], device: str) -> dict[str, torch.Tensor]:
    """The target's embedding and lm_head (bf16) and a vocabulary map that keeps every other token early on."""
    from remote.eagle3.vocab import build_mapping

    torch.manual_seed(1)
    v, h = shape["vocab"], shape["hidden"]
    d2t, t2d = build_mapping(torch.arange(v, 0, -1), shape["draft_vocab"])
    return {"embed": (torch.randn(v, h, device=device) * 0.02).to(torch.bfloat16),
            "head": (torch.randn(v, h, device=device) * 0.02).to(torch.bfloat16), "d2t": d2t, "t2d": t2d}


def aerie_step(shape: dict[str, Any], weights: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], device: str,
               repeats: int) -> dict[str, Any]:
    from remote.eagle3 import draft_config
    from remote.eagle3.model import Eagle3Draft
    from remote.eagle3.resume import TrainState
    from remote.eagle3.trainer import Batch, optimizer_for, train_step

    config = draft_config.build(target_config(shape), AUX_LAYERS, shape["draft_vocab"])
    draft = Eagle3Draft.warm(config, weights["d2t"], weights["t2d"], weights["embed"].cpu(), weights["head"].cpu()).to(device)
    optimizer, schedule = optimizer_for(draft, 1e-4, 1000, TrainState())
    head = weights["head"]
    data = Batch(batch["input_ids"], batch["loss_mask"], batch["aux"].float(), batch["final"].float())
    losses: list[float] = []
    seconds = timed(lambda: losses.append(train_step(draft, data, head, shape["ttt"], optimizer, schedule)[0]), device, repeats, warmup=2)
    return {"tok_s": round(data.input_ids.numel() / seconds, 1), "step_s": round(seconds, 4), "loss": round(losses[-1], 4),
            "peak_gib": peak_gib(device)}


def specforge_step(shape: dict[str, Any], weights: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], device: str,
                   repeats: int, attention: str) -> dict[str, Any]:
    from torch import nn
    from transformers import LlamaConfig

    from remote.eagle3 import draft_config
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.modeling.target.target_head import TargetHead
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.strategies.base import Eagle3TrainStrategy

    config = LlamaConfig(**draft_config.build(target_config(shape), AUX_LAYERS, shape["draft_vocab"]))
    torch.manual_seed(0)
    draft = LlamaForCausalLMEagle3(config, attention_backend=attention)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(weights["embed"].cpu().float())
        draft.t2d.copy_(weights["t2d"])
        draft.d2t.copy_(weights["d2t"])
    draft.freeze_embedding()
    model = OnlineEagle3Model(draft, length=shape["ttt"], attention_backend=attention).to(device=device, dtype=torch.bfloat16)
    head = TargetHead.__new__(TargetHead)  # its __init__ reads a model directory; the weight is the same head
    nn.Module.__init__(head)
    head.fc = nn.Linear(shape["hidden"], shape["vocab"], bias=False, device=device, dtype=torch.bfloat16)
    head.fc.weight.data.copy_(weights["head"])
    head.fc.weight.requires_grad_(False)
    strategy = Eagle3TrainStrategy(model, target_head=head)
    optimizer = BF16Optimizer(model, lr=1e-4, max_grad_norm=0.5, total_steps=1000)
    tensors = {"input_ids": batch["input_ids"], "attention_mask": torch.ones_like(batch["input_ids"]),
               "loss_mask": batch["loss_mask"], "hidden_state": batch["aux"], "target": batch["final"]}
    train_batch = TrainBatch(sample_ids=["b0"], strategy="eagle3", tensors={k: v.to(device) for k, v in tensors.items()},
                             metadata={"target_repr": "hidden_state"})
    losses: list[float] = []

    def step() -> None:
        loss = strategy.forward_loss(train_batch).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))

    seconds = timed(step, device, repeats, warmup=2)
    tokens = batch["input_ids"].numel()
    return {"tok_s": round(tokens / seconds, 1), "step_s": round(seconds, 4), "loss": round(losses[-1], 4),
            "attention": attention, "peak_gib": peak_gib(device)}


def capture_vs_forward(shape: dict[str, Any], device: str, repeats: int) -> dict[str, Any]:
    """The extract stage's capture against the bare forward pass of the same random Llama and batch."""
    from benchmarks.bench_extract import build_target
    from remote.eagle3.extractor import capture, decoder_of
    from remote.eagle3.layer_ids import captured

    model, _ = build_target(shape["hidden"], shape["layers"], shape["vocab"], getattr(torch, shape["dtype"]), device)
    decoder = decoder_of(model)
    ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]))
    rows, mask = ids.tolist(), torch.ones_like(ids)

    def forward() -> None:
        with torch.inference_mode():
            decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)

    figures = {name: ids.numel() / timed(fn, device, repeats, warmup=2) for name, fn in
               (("forward", forward), ("capture", lambda: capture(decoder, rows, captured(AUX_LAYERS, "LlamaForCausalLM"), device)))}
    del model, decoder
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"forward_tok_s": round(figures["forward"], 1), "capture_tok_s": round(figures["capture"], 1),
            "capture_ratio": round(figures["capture"] / figures["forward"], 3), "layers": shape["layers"]}


def peak_gib(device: str) -> float | None:
    if device != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return round(peak, 2)


def run(small: bool = False, repeats: int = 5, device: str | None = None, attention: str | None = None) -> dict[str, Any]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        from benchmarks.harness import specforge_cpu

        specforge_cpu.install()  # SpecForge's Triton loss is a GPU kernel: the same math in torch here
    shape = SMALL if small else KIMI
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                               "torch": torch.__version__, **shape, "aux_layers": AUX_LAYERS}
    batch, weights = the_batch(shape, device), shared_weights(shape, device)
    results["aerie_step"] = aerie_step(shape, weights, batch, device, repeats)
    attention = attention or ("flex_attention" if device == "cuda" else "sdpa")
    try:
        results["specforge_step"] = specforge_step(shape, weights, batch, device, repeats, attention)
    except Exception as exc:  # e.g. flex attention not compiling on this device: sdpa's figure, and why
        if attention == "sdpa":
            raise
        results["specforge_error"] = f"{attention}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
        if device == "cuda":
            torch.cuda.empty_cache()
        results["specforge_step"] = specforge_step(shape, weights, batch, device, repeats, "sdpa")
    results["specforge_over_aerie"] = round(results["specforge_step"]["tok_s"] / results["aerie_step"]["tok_s"], 3)
    del weights
    gc.collect()  # the drafts, optimizers and shared weights, before the target is built
    if device == "cuda":
        torch.cuda.empty_cache()
    results["capture"] = capture_vs_forward(shape, device, repeats)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a width a CPU runs in a minute (hidden 256), to show it works")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--attention", choices=["flex_attention", "sdpa", "eager"], default=None,
                        help="SpecForge's attention backend (default: flex_attention on a GPU, sdpa on a CPU)")
    args = parser.parse_args()
    print(json.dumps(run(args.small, args.repeats, args.device, args.attention), indent=2), flush=True)


if __name__ == "__main__":
    main()
