"""An 8 x H200 host as `nvidia-smi` shows it: the stand-in script, and a fixture that puts it first on PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


STAND_IN = """#!/bin/sh
# A stand-in for nvidia-smi on an 8 x H200 host: the query aerie makes, answered from fixed CSV.
case "$1" in
  --query-gpu=*) for i in 0 1 2 3 4 5 6 7; do printf '%s, GPU-%s, 0, 1, 143771\\n' "$i" "$i"; done ;;
  --query-compute-apps=*) ;;
  *) exit 9 ;;
esac
"""


@pytest.fixture
def eight_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir
