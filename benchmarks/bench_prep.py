"""Speed of prep with Kimi-K2.5's real tokenizer, against the plain loop a user would write.

The baselines are one process looping ``apply_chat_template(conversation,
tokenize=False)`` and ``encode`` over the same rows with the same tokenizer
(slow, tiktoken, no offsets), twice:

- ``plain_same_text``: with ``preserve_thinking=True``, so the text keeps the
  reasoning, as prep's records do (for a two-turn row it is exactly prep's text);
- ``plain``: Kimi's defaults, whose template strips the reasoning of a whole
  conversation's turns: a quarter of the tokens, none of them reasoning.

Prep also normalises each row, renders the context the server rendered for
each assistant turn and the turn itself, and masks the turns on token
boundaries. `ratio` is ``plain_same_text`` time / prep time in one process
(aim: 0.75 or more), both as CPU time; ``ratio_to_plain`` is the same against
``plain``; the same run with two processes (wall clock) shows scaling.

Rows: two-turn reasoning conversations (user, assistant with
``reasoning_content``), and a smaller set of three-exchange reasoning chats
whose earlier turns each need a record of their own ("turns expanded").

Usage: ``python -m benchmarks.bench_prep`` (prints JSON), or ``run()`` from `inv bench`.
"""

from __future__ import annotations

import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from local.inventory.fields import dump
from local.inventory.stages import Prep
from remote.prep.preparer import run_prep
from remote.prep.prep_settings import PrepSettings, Target

KIMI_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "kimi-k2.5-tokenizer"
WORDS = (
    "the model reads a file then runs the tests and fixes the parser because the output was wrong "
    "we compute the sum of the values and return a list of results for each user in the table "
    "so first let me check whether x equals 4 and then verify 2x + 3 = 11 holds"
).split()


def _settings(**values: Any) -> PrepSettings:
    """Prep's settings as the workstation sends them: the inventory's defaults, then these."""
    return PrepSettings.from_config({**dump(Prep(), exclude={"command", "stall_after"}), **values})


def reasoning_rows(records: int, exchanges: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """`records` OpenAI-style rows of `exchanges` user/assistant pairs, each answer with reasoning."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    rows = []
    for i in range(records):
        messages = []
        for _ in range(exchanges):
            messages.append({"role": "user", "content": text(10, 80)})
            messages.append({"role": "assistant", "content": text(20, 200), "reasoning_content": text(100, 800)})
        rows.append({"id": f"bench-{i}", "messages": messages})
    return rows


def run(records: int = 3000, num_proc: int = 2) -> dict[str, Any]:
    """Rows/s and tokens/s of the plain loop and of prep (1 and `num_proc` processes), and their ratios."""
    if not (KIMI_DIR / "tiktoken.model").is_file():
        return {"error": f"Kimi-K2.5's tokenizer is not at {KIMI_DIR}: nothing measured"}
    target = Target(str(KIMI_DIR), trust_remote_code=True)
    tokenizer = target.load()
    result: dict[str, Any] = {"tokenizer": "Kimi-K2.5 (TikTokenTokenizer, slow)"}
    for name, rows in (("two_turn_reasoning", reasoning_rows(records)),
                       ("three_exchange_reasoning", reasoning_rows(records // 6, exchanges=3, seed=1))):
        result[name] = _measure(tokenizer, target, rows, num_proc)
    result["ratio"] = result["two_turn_reasoning"]["prep_num_proc_1"]["ratio"]
    return result


def _measure(tokenizer: Any, target: Target, rows: list[dict[str, Any]], num_proc: int) -> dict[str, Any]:
    work: dict[str, Callable[[], Any]] = {"plain": partial(_plain, tokenizer, rows),
                                          "plain_same_text": partial(_plain, tokenizer, rows, preserve_thinking=True)}
    procs = sorted({1, num_proc})
    for n in procs:
        work[f"prep_num_proc_{n}"] = partial(_prep, rows, target, tokenizer, _settings(max_length=1 << 20, num_proc=n))
    seconds, results = _best_interleaved(work)
    plain_tokens = results["plain"]
    summary = results["prep_num_proc_1"]
    assert summary.kept == len(rows), f"prep kept {summary.kept} of {len(rows)} rows: {dict(summary.skip_reasons)}"
    out: dict[str, Any] = {
        "rows": len(rows),
        "plain": {**_rates(len(rows), plain_tokens, seconds["plain"]), "tokens": plain_tokens},
        "plain_same_text": {**_rates(len(rows), results["plain_same_text"], seconds["plain_same_text"]),
                            "tokens": results["plain_same_text"]},
        "prep_records": summary.records,
        "prep_tokens": summary.tokens,
        "prep_learned_tokens": summary.loss_tokens,
        "prep_reasoning_tokens": summary.reasoning_tokens,
        "turns_expanded": summary.turns_expanded,
    }
    for n in procs:
        name = f"prep_num_proc_{n}"
        out[name] = {**_rates(len(rows), summary.tokens, seconds[name]),
                     "ratio": round(seconds["plain_same_text"] / seconds[name], 3),
                     "ratio_to_plain": round(seconds["plain"] / seconds[name], 3)}
    return out


def _plain(tokenizer: Any, rows: list[dict[str, Any]], **kwargs: Any) -> int:
    """A baseline: render each conversation and encode it, nothing else; its token count."""
    tokens = 0
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=False, **kwargs)
        tokens += len(tokenizer.encode(text))
    return tokens


def _prep(rows: list[dict[str, Any]], target: Target, tokenizer: Any, settings: PrepSettings) -> Any:
    return run_prep(rows, ("native", "bench", target, settings, tokenizer), settings)


def _rates(rows: int, tokens: int, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "rows_per_s": round(rows / seconds), "tokens_per_s": round(tokens / seconds)}


def _best_interleaved(work: dict[str, Callable[[], Any]], rounds: int = 3) -> tuple[dict[str, float], dict[str, Any]]:
    """The fastest of a few rounds of each job, taken in turns so that load from other work on
    the machine falls on all of them alike; and each job's result.

    NOTE: a job in this one process is timed by its CPU time, not the wall clock: on a shared
    machine the wall clock measures the neighbours (runs on a loaded two-core machine gave
    ratios from 0.4 to 1.6 by the wall clock). A job with worker processes (``num_proc`` > 1)
    can only be timed by the wall clock.
    """
    best: dict[str, float] = {}
    results: dict[str, Any] = {}
    for _ in range(rounds):
        for name, job in work.items():
            clock = time.perf_counter if name.startswith("prep_num_proc_") and not name.endswith("_1") else time.process_time
            start = clock()
            results[name] = job()
            best[name] = min(best.get(name, float("inf")), clock() - start)
    return best, results


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
