"""aerie's engine on two processes against one (DDP over gloo on the CPU), and the epoch training keeps.

``run()`` (``inv bench --only ranks``) builds the demo's wired tiny target and ``records`` records along
its greedy path (benchmarks/bench_chunked.py), extracts their states once, then runs the train stage as
the supervisor does (benchmarks/bench_train.py's `stage`) with the same global batch of 2:

- ``one``: ``nproc: 1``, ``batch_size: 2`` (the plain process);
- ``two``: ``nproc: 2``, ``batch_size: 1`` (two torchrun ranks, each its own record of every step).

Reported: wall and CPU seconds, the kept draft's held-out accept length with its 95 % interval, whether the
two are within noise, ``wall_ratio`` (two's wall seconds over one's) and, from ``one``'s manifest, every
epoch's figure and the epoch kept in ``draft/`` with its reason. On a CPU the second rank buys no speed (the
ranks share the cores and add an all-reduce a step); the figure that matters there is the accept length.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_chunked import settings
from benchmarks.bench_train import build, stage

EXTRACT = {"layers": [0, 1, 2], "dtype": "float32"}
#: A learning rate a third of the demo's: the curve rises over the epochs instead of at the first (the choice shows).
TRAIN = {"draft_vocab_size": 256, "epochs": 6, "learning_rate": 1e-3, "ttt_steps": 3, "eval_records": 16}


def run(records: int = 60, seed: int = 0) -> dict[str, Any]:
    from remote.eagle3.epochs import EpochRecord

    with tempfile.TemporaryDirectory(prefix="aerie-bench-ranks-") as tmp:
        work = Path(tmp)
        target = build(work, records, seed)
        root = work / f"seed-{seed}"
        shared = {"target": {"model": str(target)}}
        stage(root, "A1", "extract", {"dataset": {}, "stage": settings("extract", EXTRACT), "inventory": shared})
        extract = root / "data" / "A1" / "extract"
        figures: dict[str, Any] = {"records": records, **TRAIN}
        for name, nproc, batch in (("one", 1, 2), ("two", 2, 1)):
            config = {"dataset": {}, "stage": settings("train", {**TRAIN, "nproc": nproc, "batch_size": batch}),
                      "inventory": shared, "inputs": [str(extract)]}
            figures[name] = stage(root, name, "train", config)
            manifest = json.loads((root / "data" / name / "train" / "manifest.json").read_text())
            figures[name].update({k: manifest[k] for k in ("nproc", "global_batch", "steps", "accept_length",
                                                           "accept_interval", "kept_epoch", "kept_reason")})
            if name == "one":
                figures["epochs_measured"] = [[e["epoch"], e.get("accept_length"), e.get("accept_low"), e.get("accept_high")]
                                              for e in manifest["epoch_history"]]
        one, two = (EpochRecord(0, None, figures[n]["accept_length"], interval=figures[n]["accept_interval"]) for n in ("one", "two"))
        figures["within_noise"] = one.within_noise(two)
        figures["wall_ratio"] = round(figures["two"]["wall_seconds"] / figures["one"]["wall_seconds"], 2)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(run(args.records, args.seed), indent=2))
