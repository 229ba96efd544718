"""A tiny Llama target, built offline, for the demo and the tests.

The model is seeded and float32 on the CPU, so every run builds the same
weights and nothing is downloaded. With ``--tokenizer`` the tokenizer files are
copied in beside the weights, so the directory loads with `AutoTokenizer` and
`AutoModelForCausalLM` and serves with ``transformers serve``::

    python -m remote.demo.tiny_model OUT --tokenizer TOKDIR [--recite TEXT]

By default its weights are random. With ``--recite`` (what `inv demo` builds)
they are wired by hand, with no training, so that its top next token is a
fixed function of the current token (`successor`): it recites TEXT's tokens
in a loop, and starts TEXT after any other token. A random target's top token
has no structure a one-layer draft can learn from a demo's few thousand
tokens (held-out acceptance length about 1.0); this one has, and it is still a
real `LlamaForCausalLM` whose hidden states come from its forward pass.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any, Sequence

#: Files a tokenizer directory may hold; the model's own files are never copied over.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",
    "added_tokens.json",
)

#: What the demo's target recites: whole-word tokens of the tiny tokenizer, each
#: once, that decode and re-encode to themselves, so the target's own answers
#: tokenise back to what it generated and the draft can be measured on them.
DEMO_RECITAL = " The quick brown fox jumps over the lazy dog"

#: Written beside a wired model: the recited text and its token ids.
RECITAL_FILE = "recital.json"

# NOTE: the wiring's constants, chosen by measuring the top-two logit gap over
# random and recited contexts (about 22 logits at these values; 0 mismatches).
# QUIET scales every block's output projections: at 0.01 a block's output is
# as large as the embedding (init_std 0.3 weights) and ~4% of argmaxes differ
# from the successor; at 1e-3 the states still depend on the context, a little.
QUIET = 1e-3
FLAG = 2.0  # the "recited, not last" marker in embedding dimension 0, in units of init_std
HEAD_SCALE = 0.5  # logit of the right successor: HEAD_SCALE * hidden_size (32 at hidden 64)
START_BIAS = 40.0  # how strongly an unmarked token votes for the recital's first token


def build_model(
    path: str | Path,
    vocab_size: int,
    hidden_size: int = 64,
    layers: int = 4,
    heads: int = 4,
    seed: int = 0,
    init_std: float = 0.3,
    recite: Sequence[int] = (),
) -> Path:
    """Save a seeded random `LlamaForCausalLM` (safetensors) into `path` and return it;
    with `recite` (token ids), wired to recite them (`wire_recital`).

    `init_std` is wider than Llama's 0.02 on purpose: at 0.02 a model this small
    predicts an almost uniform distribution (entropy 6.65 of at most 6.67 nats
    over 785 tokens), which leaves a draft nothing to learn; at 0.3 it is about
    4 nats, with a clear favourite token.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive (got {vocab_size})")
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of heads {heads}")
    path = Path(path)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        # NOTE: untied, like Kimi: the draft copies the embeddings and the
        # trainer reads the lm_head separately.
        tie_word_embeddings=False,
        initializer_range=init_std,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    if recite:
        wire_recital(model, list(recite), init_std)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    write_index(path)
    return path


def write_index(path: Path, file: str = "model.safetensors") -> Path:
    """`model.safetensors.index.json` beside a single-file checkpoint, as a sharded one has (the real
    Kimi-K2.5's included): SpecForge 0.2.0's `TargetHead.load_weights` finds the lm_head only through it."""
    from safetensors import safe_open

    with safe_open(str(path / file), framework="pt") as handle:
        names = sorted(handle.keys())
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {name: file for name in names}}, indent=2))
    return index


def successor(recite: Sequence[int], vocab_size: int) -> list[int]:
    """The wired target's top next token after each token: the next recited one, else the first."""
    following = [recite[0]] * vocab_size
    for token, after in zip(recite, recite[1:]):
        following[token] = after
    return following


def wire_recital(model: Any, recite: list[int], init_std: float) -> None:
    """Set `model`'s weights so that its top next token is `successor(recite)` in every context.

    The residual stream is kept to the token's own embedding (the blocks' output
    projections scaled by QUIET), so the final state points along the current
    token's embedding; the lm_head row of each recited token after the first is
    its predecessor's normalised embedding, so that token wins after its
    predecessor. Every other token (and the last recited one) carries a negative
    marker in embedding dimension 0 that the first recited token's row rewards.
    Rows of tokens never recited are zero: the target never chooses them.
    """
    import torch

    vocab = model.config.vocab_size
    if len(recite) < 2 or len(set(recite)) != len(recite):
        raise ValueError(f"a recital needs two or more tokens, each once (got {recite})")
    if not all(0 <= t < vocab for t in recite):
        raise ValueError(f"recital tokens {recite} are not all below the vocabulary size {vocab}")
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed[:, 0] = -FLAG * init_std
        embed[recite[:-1], 0] = FLAG * init_std
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(QUIET)
            layer.mlp.down_proj.weight.mul_(QUIET)
        # The final RMSNorm (weight 1) makes a state of rms 1: so are the rows' embeddings.
        unit = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
        head = model.get_output_embeddings().weight
        head.zero_()
        for token, after in zip(recite, recite[1:]):
            head[after] = HEAD_SCALE * unit[token]
        head[recite[0], 0] = -START_BIAS * HEAD_SCALE


def tokenizer_vocab_size(tokenizer_dir: Path) -> int:
    """The number of ids the tokenizer can produce, added tokens included."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tokenizer_dir))


def recital_ids(tokenizer_dir: Path, text: str) -> list[int]:
    """`text`'s token ids, refused unless each occurs once and the ids decode and re-encode to themselves."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < 2 or len(set(ids)) != len(ids):
        raise SystemExit(f"--recite {text!r}: needs two or more tokens, none repeated (it is {ids})")
    if tokenizer.encode(tokenizer.decode(ids * 2), add_special_tokens=False) != ids * 2:
        raise SystemExit(f"--recite {text!r}: its tokens do not re-encode to themselves when repeated")
    return ids


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> list[str]:
    """Copy the tokenizer's files into the model directory; the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        source = tokenizer_dir / name
        if source.is_file():
            shutil.copyfile(source, out / name)
            copied.append(name)
    return copied


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m remote.demo.tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer directory (sizes the vocab; copied in)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    parser.add_argument("--recite", metavar="TEXT", help="wire the weights to recite TEXT's tokens (see above)")
    args = parser.parse_args(argv)
    if not (args.tokenizer / "tokenizer_config.json").is_file() and not (args.tokenizer / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer in {args.tokenizer}: build one first (python -m remote.demo.tiny_tokenizer)")
    vocab = tokenizer_vocab_size(args.tokenizer)
    recite = recital_ids(args.tokenizer, args.recite) if args.recite else []
    build_model(args.out, vocab, args.hidden, args.layers, args.heads, args.seed, recite=recite)
    if recite:
        (args.out / RECITAL_FILE).write_text(json.dumps({"text": args.recite, "ids": recite}) + "\n")
    if args.tokenizer.resolve() != args.out.resolve():
        copy_tokenizer(args.tokenizer, args.out)
    wired = f", reciting {args.recite!r}" if recite else ""
    print(f"tiny Llama ({args.layers} layers, hidden {args.hidden}, vocab {vocab}{wired}) in {args.out}")


if __name__ == "__main__":
    main()
