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

With `against` (`inv bench --against REF`), the suites that time commands as typed (control, loop)
also time each in a checkout of that commit, in turn with this checkout's: the ratio this/REF.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from typing import Any

from benchmarks.harness.ref_checkout import resolve
from local.exceptions import AerieError

SUITES = ("control", "loop", "view", "prep", "infer", "extract", "slurm", "chunked", "train", "ranks", "phases", "states")
#: The suites that time commands as typed, and so can time them in a checkout of another commit too.
AGAINST = ("control", "loop")


def run(only: list[str] | None = None, against: str | None = None) -> dict[str, Any]:
    """Each suite's figures; given `against` (a commit), the as-typed ones also against that commit's checkout."""
    names = only or (list(AGAINST) if against else list(SUITES))
    for name in names:
        if name not in SUITES:
            raise AerieError(f"unknown benchmark {name!r}: expected one of {', '.join(SUITES)}")
    ref = resolve(against) if against is not None else None
    if ref and (others := [name for name in names if name not in AGAINST]):
        raise AerieError(f"--against times the as-typed suites only ({', '.join(AGAINST)}), not {', '.join(others)}: "
                         f"`inv bench --only {','.join(AGAINST)} --against {against}`")
    results: dict[str, Any] = {}
    for name in names:
        suite = importlib.import_module(f"benchmarks.bench_{name}")
        started = time.perf_counter()
        results[name] = suite.run(against=ref) if ref else suite.run()
        results[name]["suite_seconds"] = round(time.perf_counter() - started, 1)
    return results


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1:] or None), indent=2))
