"""Python's cyclic garbage collector in a process that imports torch, transformers or SGLang and then works.

Those imports leave a few hundred thousand objects that live as long as the process. With Python's
default thresholds the collector walks every one of them at each full collection: about six times while
they are imported (a full collection comes after ten of the middle generation, once the long-lived objects
have grown by a quarter), and again as the interpreter shuts down, to find cycles whose memory the
operating system takes back a moment later anyway. Together about a sixth of a short stage's CPU
(docs/benchmarks.md, "The collector's thresholds").

`tune` leaves the young generations as they are, where nearly all cyclic garbage (an import's, a step's)
dies, and makes full collections ten times rarer: none while torch and transformers are imported, still one
in every several hundred thousand allocations after. At exit it moves every object out of the collector's reach
(`gc.freeze`). Nothing a stage keeps depends on a collection at exit: its output is written and renamed
into place before it returns, and Python never promised to run the finalizers of objects alive at exit.
"""

from __future__ import annotations

import atexit
import gc

#: Collections of the middle generation per full collection (Python's default: 10).
FULL_EVERY = 100


def tune() -> None:
    """Full collections ten times rarer from now on, and none at exit (idempotent)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_EVERY)
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
