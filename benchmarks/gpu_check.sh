#!/usr/bin/env bash
# The prepared GPU check (issue 30; docs/benchmarks.md): on one GPU with torch + CUDA, transformers and
# safetensors and no network, aerie's EAGLE-3 train step against SpecForge 0.2.0's on the same batch and
# HF capture against the bare forward pass, at Kimi-K2.5's width, and aerie's step as one torchrun rank
# (DDP) against the plain process (benchmarks/bench_ddp.py); it prints the figures as JSON (and leaves
# them in $OUT/gpu_check.json and $OUT/gpu_check_ddp.json when $OUT is set). At most 12 minutes.
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
# aerie's engine under torchrun (issue 38): one rank of DDP against the plain process, on the same step.
ddp=${OUT:-/tmp}/gpu_check_ddp.json
small=""; for arg in "$@"; do [ "$arg" = "--small" ] && small="--small"; done
plain=$(timeout 120 "$PYTHON" -m benchmarks.bench_ddp $small | tail -1)
ranked=$(timeout 120 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 1 -m benchmarks.bench_ddp $small | tail -1)
"$PYTHON" -c 'import json, sys; p, r = json.loads(sys.argv[1]), json.loads(sys.argv[2]); print(json.dumps({"plain": p, "torchrun": r, "ddp_over_plain": round(p["step_s"] / r["step_s"], 3)}, indent=2))' "$plain" "$ranked" | tee "$ddp.tmp"
mv "$ddp.tmp" "$ddp"
