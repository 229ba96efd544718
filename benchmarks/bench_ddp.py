"""aerie's train step in the plain process against the same step as one rank under torchrun (DDP).

Run plain, it times `remote.eagle3.trainer.train_step` as one process trains; run under
``torchrun --nproc-per-node 1`` (``WORLD_SIZE`` set), the same step through
`remote.eagle3.distributed` as the train stage's ranks run it: the draft under
DistributedDataParallel (NCCL on a GPU, gloo on a CPU) and the step's figures averaged
over the ranks. The batch, the draft and the widths are benchmarks/bench_steps.py's (Kimi-K2.5's;
``--small`` for a CPU). benchmarks/gpu_check.sh runs both and prints ``ddp_over_plain``
(the plain step's seconds over the rank's: below 1 is what DDP costs on one GPU).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks.bench_steps import AUX_LAYERS, KIMI, SMALL, peak_gib, shared_weights, target_config, the_batch
from benchmarks.harness.timing import timed


def step_seconds(small: bool, repeats: int) -> dict[str, Any]:
    from remote.eagle3 import distributed, draft_config
    from remote.eagle3.model import Eagle3Draft
    from remote.eagle3.resume import TrainState
    from remote.eagle3.trainer import Batch, optimizer_for, train_step

    world = distributed.World.from_env()
    device = distributed.start(world)
    kind = device.type
    shape = SMALL if small else KIMI
    batch, weights = the_batch(shape, kind), shared_weights(shape, kind)
    config = draft_config.build(target_config(shape), AUX_LAYERS, shape["draft_vocab"])
    draft = Eagle3Draft.warm(config, weights["d2t"], weights["t2d"], weights["embed"].cpu(), weights["head"].cpu()).to(device)
    optimizer, schedule = optimizer_for(draft, 1e-4, 1000, TrainState())
    forward = distributed.wrap(draft, world)
    data = Batch(batch["input_ids"], batch["loss_mask"], batch["aux"].float(), batch["final"].float())

    def step() -> None:
        loss, accuracies = train_step(draft, data, weights["head"], shape["ttt"], optimizer, schedule, forward)
        distributed.mean([loss, *accuracies], world)

    seconds = timed(step, kind, repeats, warmup=2)
    distributed.stop(world)
    return {"mode": f"torchrun nproc {world.size}" if world.is_distributed else "plain", "device": kind,
            "step_s": round(seconds, 4), "tok_s": round(data.input_ids.numel() / seconds, 1), "peak_gib": peak_gib(kind),
            "shape": "small" if small else "kimi"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="bench_steps' small widths (a CPU)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = step_seconds(args.small, args.repeats)
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
