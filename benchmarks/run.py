"""`inv bench`: every benchmark suite, each a ratio against a baseline measured in the same run.

Suites: control (status, launch and deploy over a loopback sshd), prep (with
Kimi-K2.5's tokenizer, vs. a plain apply_chat_template + encode loop), infer (the stage's client vs.
plain clients on the same server; `concurrency: auto` vs. pinned 4, 16 and 64 on a
saturating stand-in), extract (capture vs. a bare forward pass),
slurm (launch and status of 40 jobs on the test cluster), loop (deploy and
rerun as typed, against rsync, scp and ssh), view (the watch view of 20 to 1,000 bad jobs,
against one screenful of table), chunked (the chunked route's wall time and
held-out accept length against the offline route's on the same records), train (aerie's trainer
against SpecForge 0.2.0's on the same states and held-out split: CPU seconds and accept length), ranks
(aerie's engine on two torchrun ranks against one process: seconds, accept length, the epoch kept),
phases (the inference server's starts and the target's loads in one `inv run` of ten datasets), states
(train's reading of the stored states with their size and checksum checked, against the plain read).
Figures are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any

SUITES = ("control", "loop", "view", "prep", "infer", "extract", "slurm", "chunked", "train", "ranks", "phases", "states")


def run(only: list[str] | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in only or SUITES:
        if name not in SUITES:
            raise ValueError(f"unknown benchmark {name!r}: expected one of {', '.join(SUITES)}")
        started = time.perf_counter()
        results[name] = importlib.import_module(f"benchmarks.bench_{name}").run()
        results[name]["suite_seconds"] = round(time.perf_counter() - started, 1)
    return results


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1:] or None), indent=2))
