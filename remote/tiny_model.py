"""A tiny random Llama target, built offline, for the demo and the tests.

The model is seeded and float32 on the CPU, so every run builds the same
weights and nothing is downloaded. With ``--tokenizer`` the tokenizer files are
copied in beside the weights, so the directory loads with `AutoTokenizer` and
`AutoModelForCausalLM` and serves with ``transformers serve``::

    python -m remote.tiny_model OUT --tokenizer TOKDIR
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

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


def build_model(
    path: str | Path,
    vocab_size: int,
    hidden_size: int = 64,
    layers: int = 4,
    heads: int = 4,
    seed: int = 0,
    init_std: float = 0.3,
) -> Path:
    """Save a seeded random `LlamaForCausalLM` (safetensors) into `path` and return it.

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
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def tokenizer_vocab_size(tokenizer_dir: Path) -> int:
    """The number of ids the tokenizer can produce, added tokens included."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tokenizer_dir))


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
    parser = argparse.ArgumentParser(prog="python -m remote.tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    parser.add_argument("--tokenizer", type=Path, required=True, help="tokenizer directory (sizes the vocab; copied in)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    args = parser.parse_args(argv)
    if not (args.tokenizer / "tokenizer_config.json").is_file() and not (args.tokenizer / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer in {args.tokenizer}: build one first (python -m remote.tiny_tokenizer)")
    vocab = tokenizer_vocab_size(args.tokenizer)
    build_model(args.out, vocab, args.hidden, args.layers, args.heads, args.seed)
    if args.tokenizer.resolve() != args.out.resolve():
        copy_tokenizer(args.tokenizer, args.out)
    print(f"tiny Llama ({args.layers} layers, hidden {args.hidden}, vocab {vocab}) in {args.out}")


if __name__ == "__main__":
    main()
