"""Speed of prep's tokenise-and-mask path, against the plain batch encoding of the same text.

The limit on a machine is what the fast tokenizer does alone: ``tokenizer(texts)``
over the rendered conversations (and, stricter, its Rust backend's
``encode_batch`` with no Python lists built). Prep also normalises, renders the
template, finds the assistant spans and builds the mask; `ratio` says how much
of the ``tokenizer(texts)`` limit it keeps (aim: 0.75 or more). The same run
with more processes shows scaling.

Usage: ``python -m benchmarks.bench_prep`` (prints JSON), or ``run()`` from `inv bench`.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from local.inventory import Prep
from remote.prep.pipeline import Preparer, run_prep
from remote.prep.settings import PrepSettings, Target
from remote.tiny_tokenizer import build_tokenizer

WORDS = (
    "the model reads a file then runs the tests and fixes the parser because the output was wrong "
    "we compute the sum of the values and return a list of results for each user in the table"
).split()


def _settings(**values: Any) -> PrepSettings:
    """Prep's settings as the workstation sends them: the inventory's defaults, then these."""
    return PrepSettings.from_config({**Prep().model_dump(exclude={"command", "stall_after"}), **values})


def conversations(records: int, seed: int = 0) -> list[dict[str, Any]]:
    """`records` ShareGPT-style rows of 2 to 6 exchanges, deterministic for a seed."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    rows = []
    for i in range(records):
        turns = [{"from": "system", "value": text(5, 20)}]
        for _ in range(rng.randint(2, 6)):
            turns.append({"from": "human", "value": text(10, 60)})
            turns.append({"from": "gpt", "value": text(20, 150)})
        rows.append({"id": f"bench-{i}", "conversations": turns})
    return rows


def run(records: int = 3000, num_proc: int = 1) -> dict[str, Any]:
    """Records/s and tokens/s of prep and of the plain encoding; prep at 1 and `num_proc` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        target = Target(str(build_tokenizer(Path(tmp) / "tokenizer")))
        rows = conversations(records)
        settings = _settings(max_length=1 << 20)
        preparer = Preparer("native", "bench", target, settings)
        texts = [preparer.template.render(conversation) for conversation in _normalised(rows)]

        batch = settings.batch_size
        backend = preparer.tokenizer.backend_tokenizer
        procs = sorted({1, num_proc})
        work: dict[str, Callable[[], Any]] = {
            "plain": lambda: [preparer.tokenizer(texts[i : i + batch]) for i in range(0, len(texts), batch)],
            # NOTE: `tokenizer(texts)` also builds Python lists and attention masks;
            # the Rust backend alone is the stricter limit, reported beside it.
            "backend_only": lambda: [backend.encode_batch(texts[i : i + batch]) for i in range(0, len(texts), batch)],
        }
        for n in procs:
            work[f"prep_num_proc_{n}"] = partial(_prep, rows, target, _settings(max_length=1 << 20, num_proc=n))
        seconds, results = _best_interleaved(work)
        tokens = sum(len(ids) for ids in preparer.tokenizer(texts)["input_ids"])

        result: dict[str, Any] = {"records": records, "tokens": tokens}
        for name, elapsed in seconds.items():
            result[name] = _rates(records, tokens, elapsed)
        for n in procs:
            summary = results[f"prep_num_proc_{n}"]
            assert summary.kept == records and summary.tokens == tokens, "prep and plain encodings disagree"
            result[f"prep_num_proc_{n}"]["ratio_to_plain"] = round(seconds["plain"] / seconds[f"prep_num_proc_{n}"], 3)
            result[f"prep_num_proc_{n}"]["ratio_to_backend_only"] = round(
                seconds["backend_only"] / seconds[f"prep_num_proc_{n}"], 3
            )
        result["ratio"] = result["prep_num_proc_1"]["ratio_to_plain"]
        return result


def _normalised(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The normalised conversations of `rows`, as prep renders them."""
    from remote.prep.normalise import normalise

    return [normalise(row, i).conversations for i, row in enumerate(rows)]


def _rates(records: int, tokens: int, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "records_per_s": round(records / seconds), "tokens_per_s": round(tokens / seconds)}


def _prep(rows: list[dict[str, Any]], target: Target, settings: PrepSettings) -> Any:
    return run_prep(rows, ("native", "bench", target, settings), settings)


def _best_interleaved(work: dict[str, Callable[[], Any]], rounds: int = 3) -> tuple[dict[str, float], dict[str, Any]]:
    """The fastest of a few rounds of each job, taken in turns so that load from
    other work on the machine falls on all of them alike; and each job's result."""
    best: dict[str, float] = {}
    results: dict[str, Any] = {}
    for _ in range(rounds):
        for name, job in work.items():
            start = time.perf_counter()
            results[name] = job()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    return best, results


if __name__ == "__main__":
    print(json.dumps(run(num_proc=2), indent=2))
