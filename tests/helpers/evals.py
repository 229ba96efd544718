"""`inv eval` against SGLang's stand-in (tests/stages/sglang_standin.py): the inventory, the drafts it measures,
and the journal of what each server was asked."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.harness.checkout import Bench
from tests.stages import sglang_standin


STANDIN = Path(sglang_standin.__file__)


TOKENS = 40


#: The stand-in's time per token. `inv eval` times passes of the prompts, one request at a time: at 40 tokens a
#: request takes 1.2 s without a draft, long enough that a loaded machine's stalls (a few hundred ms) stay within
#: the tests' tolerance of a speed-up, a fifth.
TOKEN_SECONDS = 0.03


DRAFT_COST = 0.2


GRID = [{"num_steps": 1, "topk": 1, "num_draft_tokens": 2}, {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        {"num_steps": 3, "topk": 4, "num_draft_tokens": 12}]


PROMPTS = ["Give three tips for staying healthy.", "Translate: the cat sleeps.", "Name a prime.", "Why is the sky blue?"]


def eval_inventory(bench: Bench, tmp_path: Path, port: int, accept: float, grid: list[dict] = GRID,
                   token_seconds: float = TOKEN_SECONDS, drafts: dict[str, float] | None = None) -> dict:
    """train's draft, and `drafts` named with their stand-in accept chance (else the default: train's alone)."""
    draft = tmp_path / "root" / "data" / "draft" / "train" / "draft"
    write_draft(draft)
    named = {name: str(write_draft(tmp_path / "drafts" / name, chance)) for name, chance in (drafts or {}).items()}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    settings = {
        "launcher": f"{{python}} {STANDIN}", "model": "/models/target", "port": port,
        "server_args": ["--tp-size", "2"], "server_start_timeout": 30, "grid": grid, "prompts": str(prompts),
        "num_prompts": len(PROMPTS), "max_new_tokens": TOKENS,
        "server_env": {"STANDIN_ACCEPT": str(accept), "STANDIN_TOKEN_SECONDS": str(token_seconds),
                       "STANDIN_DRAFT_COST": str(DRAFT_COST), "STANDIN_JOURNAL": str(tmp_path / "journal.jsonl")},
        **({"drafts": named} if drafts else {}),
    }
    bench.inventory({"chat": {"source": "inventories/samples/sharegpt.jsonl", "kind": "native"}}, {"eval": settings})
    bench.inv("deploy")
    return {"draft": draft, "drafts": named, "journal": tmp_path / "journal.jsonl"}


def write_draft(directory: Path, accept: float | None = None) -> Path:
    """A draft directory as SGLang wants one (a config.json); `accept`: the stand-in's chance for it."""
    directory.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLMEagle3"], **({"standin_accept": accept} if accept is not None else {})}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
