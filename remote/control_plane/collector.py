"""Python's cyclic garbage collector in a process that imports torch, transformers or SGLang and then works.

Those imports leave a few hundred thousand objects that live as long as the process. While the
interpreter shuts down, the collector walks every one of them again, several times, to find cycles
whose memory the operating system takes back a moment later anyway: a large share of a short stage's
CPU (docs/benchmarks.md, "The collector at exit"). `freeze_at_exit` moves them out of its reach
(`gc.freeze`) once the process is done. Nothing a stage keeps depends on a collection at exit:
its output is written and renamed into place before it returns, and Python never promised to run
the finalizers of objects still alive at exit.
"""

from __future__ import annotations

import atexit
import gc


def freeze_at_exit() -> None:
    """Freeze every tracked object when this process exits (once, whatever calls it again)."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
