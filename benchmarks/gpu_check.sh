#!/usr/bin/env bash
# The prepared GPU check (issue 30; docs/benchmarks.md): on one GPU with torch + CUDA, transformers and
# safetensors and no network, aerie's EAGLE-3 train step against SpecForge 0.2.0's on the same batch and
# HF capture against the bare forward pass, at Kimi-K2.5's width; it prints the figures as JSON (and
# leaves them in $OUT/gpu_check.json when $OUT is set). At most 8 minutes.
#
#   here, once:  .venv/bin/pip download --no-deps specforge==0.2.0 -d .wheels    (.wheels/ is ignored)
#   there:       bash benchmarks/gpu_check.sh            (the device tool: carry [".wheels"])
#   a CPU:       bash benchmarks/gpu_check.sh --small    (a small width, to show it works)
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch: $PYTHON, else this checkout's .venv, else python3 or python on PATH.
if [ -z "${PYTHON:-}" ]; then
    for candidate in .venv/bin/python python3 python; do
        if "$candidate" -c "import torch" 2>/dev/null; then PYTHON=$candidate; break; fi
    done
fi
: "${PYTHON:?no Python with torch found: set PYTHON}"
if ! "$PYTHON" -c "import specforge" 2>/dev/null; then
    # --no-deps: its requirements pin a torch and an SGLang; the step it is timed on needs neither.
    "$PYTHON" -m pip install -q --no-deps --no-index .wheels/specforge-0.2.0-py3-none-any.whl
fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" >&2
out=${OUT:-/tmp}/gpu_check.json
timeout 450 "$PYTHON" -m benchmarks.bench_steps "$@" | tee "$out.tmp"
mv "$out.tmp" "$out"
