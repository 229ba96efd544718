"""The real SpecForge CLI (the pinned 0.2.0 wheel) on a CPU, as the tests run it:
`benchmarks.harness.specforge_cpu`, which `inv bench` shares (benchmarks/ imports nothing from tests/).

    python tests/specforge_cpu.py train --config run.yaml      # or: export --to sglang ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the checkout importable

from benchmarks.harness.specforge_cpu import CPU_OVERRIDES, _log_softmax_loss, install, main  # noqa: E402
from remote.control_plane import collector  # noqa: E402

__all__ = ["CPU_OVERRIDES", "_log_softmax_loss", "install", "main"]

if __name__ == "__main__":
    collector.tune()  # as aerie's stages do: full collections would walk every import again and again
    raise SystemExit(main(sys.argv[1:]))
