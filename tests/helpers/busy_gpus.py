"""Two GPUs as `nvidia-smi` shows them, one of them busy: the stand-in script (the holder's pid in a file beside it)."""

from __future__ import annotations


STAND_IN = """#!/bin/sh
# A stand-in for nvidia-smi: the two queries aerie makes, answered from fixed CSV.
case "$1" in
  --query-gpu=*) printf '0, GPU-aaa, 97, 70000, 81559\\n1, GPU-bbb, 0, 1, 81559\\n' ;;
  --query-compute-apps=*) printf '%s, GPU-aaa, 69000\\n' "$(cat "$(dirname "$0")/pid")" ;;
  *) exit 9 ;;
esac
"""
