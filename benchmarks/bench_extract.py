"""Extraction and draft-training throughput, against a bare forward pass of the same model and batch.

``run()`` builds a random Llama in memory (nothing is downloaded), then times:

- ``forward``: the base model on the batch, no hidden states returned (the floor);
- ``capture``: what the extract stage does per batch -- ``output_hidden_states``,
  the aux layers concatenated, the final state, all copied to the CPU;
- ``extract``: ``capture`` plus writing each record as a SpecForge ``.ckpt``;
- ``train_step``: one TTT training step of the EAGLE-3 draft on the same batch;
- ``memory``: the peak resident memory a capture adds, in a fresh process each,
  for the stage's hooks and for ``output_hidden_states`` (what extract did
  before), on a deeper model where keeping every layer's states shows.

Figures are tokens/s; ``*_ratio`` is tokens/s over the bare forward's. The
default is the tiny CPU model; on a GPU: ``--hidden 4096 --dtype bfloat16``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.timing import timed
from remote.eagle3 import draft_config
from remote.eagle3.extractor import capture, decoder_of, sample
from remote.eagle3.layer_ids import captured
from remote.eagle3.model import Eagle3Draft
from remote.eagle3.prep_input import Record
from remote.eagle3.trainer import Batch, autocast, ttt_loss
from remote.eagle3.vocab import build_mapping


def build_target(hidden: int, layers: int, vocab: int, dtype: torch.dtype, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden // 128) if hidden >= 1024 else 4
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.6875) // 64 * 64 or 2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval(), config


def run(hidden: int = 64, layers: int = 4, vocab: int = 785, dtype: str = "float32", batch: int = 4, seq: int = 256,
        ttt_steps: int = 7, draft_vocab: int = 256, repeats: int = 5, device: str | None = None) -> dict[str, Any]:  # fmt: skip
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = getattr(torch, dtype)
    model, config = build_target(hidden, layers, vocab, torch_dtype, device)
    decoder = decoder_of(model)
    # SpecForge's default ids for deep targets; the only three a 4-layer target has otherwise.
    aux_layers = [1, layers // 2 - 1, layers - 4] if layers >= 8 else [0, 1, 2]
    ids = torch.randint(0, vocab, (batch, seq))
    rows = ids.tolist()
    mask = torch.ones_like(ids)
    tokens = batch * seq

    def forward() -> None:
        with torch.inference_mode():
            decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)

    def grab() -> list:
        return capture(decoder, rows, captured(aux_layers, "LlamaForCausalLM"), device)

    workdir = Path(tempfile.mkdtemp(prefix="bench-extract-"))

    def extract() -> None:
        for n, (aux, final) in enumerate(grab()):
            record = Record(f"r{n}", rows[n], [1] * seq)
            torch.save(sample(record, aux, final), workdir / f"data_{n}.ckpt")

    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "hidden": hidden, "layers": layers, "vocab": vocab, "dtype": dtype, "batch": batch, "seq": seq,
        "aux_layers": aux_layers, "threads": torch.get_num_threads(),
    }  # fmt: skip
    for name, fn in (("forward", forward), ("capture", grab), ("extract", extract)):
        results[f"{name}_tok_s"] = round(tokens / timed(fn, device, repeats), 1)
    results["capture_ratio"] = round(results["capture_tok_s"] / results["forward_tok_s"], 3)
    results["extract_ratio"] = round(results["extract_tok_s"] / results["forward_tok_s"], 3)
    results.update(train_step(model, config, grab(), rows, aux_layers, ttt_steps, min(draft_vocab, vocab), device, repeats))
    results["train_step_ratio"] = round(results["train_step_tok_s"] / results["forward_tok_s"], 3)
    results["memory"] = memory()
    return results


def all_states_capture(decoder, batch: list[list[int]], layers: list[int]) -> list[tuple[Any, Any]]:
    """The baseline: every layer's states kept (``output_hidden_states``), three of them used."""
    ids = torch.tensor(batch)
    with torch.inference_mode():
        states = decoder(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
    aux = torch.cat([states[i + 1] for i in layers], dim=-1)
    return [(aux[row], states[-1][row]) for row in range(len(batch))]


def peak_capture_mib(method: str, hidden: int, layers: int, batch: int, seq: int) -> float:
    """In this (fresh) process: MiB the capture adds to the peak resident set, over the model's own."""
    model, _ = build_target(hidden, layers, 1024, torch.float32, "cpu")
    decoder = decoder_of(model)
    rows = torch.randint(0, 1024, (batch, seq)).tolist()
    aux_layers = [1, layers // 2 - 1, layers - 4]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if method == "hooks":
        kept = capture(decoder, rows, captured(aux_layers, "LlamaForCausalLM"), "cpu")
    else:
        kept = all_states_capture(decoder, rows, aux_layers)
    assert len(kept) == batch
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # ru_maxrss is in KiB on Linux


def memory(hidden: int = 512, layers: int = 32, batch: int = 4, seq: int = 1024) -> dict[str, Any]:
    """Peak memory added by the hooks' capture and by output_hidden_states, each in a fresh process."""
    figures: dict[str, Any] = {"hidden": hidden, "layers": layers, "batch": batch, "seq": seq}
    for method in ("hooks", "all_states"):
        code = f"from benchmarks.bench_extract import peak_capture_mib as p; print(p({method!r}, {hidden}, {layers}, {batch}, {seq}))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        figures[f"{method}_peak_mib"] = round(float(out.stdout.strip().splitlines()[-1]), 1)
    # What one layer's states for the batch weigh, to read the figures against.
    figures["states_per_layer_mib"] = round(batch * seq * hidden * 4 / 2**20, 1)
    figures["saved_mib"] = round(figures["all_states_peak_mib"] - figures["hooks_peak_mib"], 1)
    return figures


def train_step(model, config, captured, rows, aux_layers, ttt_steps, draft_vocab, device, repeats) -> dict[str, Any]:
    """Tokens/s of one draft training step (forward, backward, AdamW) on the captured batch."""
    draft = Eagle3Draft(draft_config.build(config.to_dict(), aux_layers, draft_vocab)).to(device)
    _, t2d = build_mapping(torch.arange(config.vocab_size, 0, -1), draft_vocab)
    draft.t2d.copy_(t2d.to(device))
    head = model.lm_head.weight.detach()
    batch = Batch(
        input_ids=torch.tensor(rows, device=device),
        loss_mask=torch.ones(len(rows), len(rows[0]), dtype=torch.long, device=device),
        aux=torch.stack([a for a, _ in captured]).to(device, torch.float32),
        final=torch.stack([f for _, f in captured]).to(device, torch.float32),
    )
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        with autocast(torch.device(device)):
            loss, _ = ttt_loss(draft, batch, head, ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = timed(step, device, max(1, repeats // 2))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"ttt_steps": ttt_steps, "draft_vocab": draft_vocab, "train_step_tok_s": round(batch.input_ids.numel() / seconds, 1),
            "train_step_s": round(seconds, 4), "peak_gpu_gib": None if peak is None else round(peak, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=785)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--draft-vocab", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-only", action="store_true", help="only the capture's peak memory, hooks vs output_hidden_states")
    args = parser.parse_args()
    if args.memory_only:
        print(json.dumps(memory(), indent=2))
        return
    print(json.dumps(run(args.hidden, args.layers, args.vocab, args.dtype, args.batch, args.seq, args.ttt_steps, args.draft_vocab, args.repeats), indent=2))


if __name__ == "__main__":
    main()
