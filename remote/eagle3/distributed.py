"""aerie's engine on every GPU: the train stage under torchrun, one process per GPU, DistributedDataParallel.

`stages.train.nproc` processes (unset: every GPU the host shows, `visible_gpus`; 1 without GPUs).
With more than one, the stage's own process launches them through torchrun's launcher
(`launch`: the same agent as ``torchrun --standalone``, on loopback) and waits: each
process is one rank (NCCL on GPUs, gloo on the CPU), every rank trains on its share of
each global batch (`share`: ``batch_size`` records per rank, ``batch_size x nproc`` per
optimizer step), DDP averages the gradients, and rank 0 alone writes: the draft, the
resume state, the held-out measurement, the progress. A rank that dies ends them all
(torchrun restarts nothing): the job fails and ``inv rerun --failed`` resumes from the
last checkpoint, with the same ``nproc`` (`remote.eagle3.resume` refuses another).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

#: Set by torchrun in each rank's environment.
RANK_ENV, WORLD_ENV, LOCAL_RANK_ENV = "RANK", "WORLD_SIZE", "LOCAL_RANK"
#: Rank 0 measures the held-out records while the others wait in the next step's all-reduce.
COLLECTIVE_TIMEOUT = timedelta(hours=4)
#: The exit code a rank gives for a refusal (its one line is already printed).
REFUSED = 1


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    #: Started by torchrun: a process group to join, even of one (benchmarks/bench_ddp.py times that).
    launched: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.launched or self.size > 1

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "World":
        env = os.environ if env is None else env
        if WORLD_ENV not in env:
            return cls()
        return cls(int(env[RANK_ENV]), int(env[WORLD_ENV]), int(env.get(LOCAL_RANK_ENV, env[RANK_ENV])), launched=True)


def visible_gpus(env: dict[str, str] | None = None) -> int:
    """The GPUs a process here may use: ``nvidia-smi``'s, narrowed by ``CUDA_VISIBLE_DEVICES`` (indices or
    UUIDs; an empty value hides them all); 0 without nvidia-smi or when it fails."""
    from remote.eagle3.target_memory import nvidia_smi_gpus

    env = os.environ if env is None else env
    return len(nvidia_smi_gpus(env.get("CUDA_VISIBLE_DEVICES")))


def resolve_nproc(setting: int | None) -> int:
    """`stages.train.nproc`, or every visible GPU when unset (1 on a host without GPUs)."""
    return setting if setting else max(1, visible_gpus())


def ranks_for(config: dict[str, Any]) -> int:
    """How many ranks the train stage with the job's `config` launches: `resolve_nproc` for aerie's engine;
    1 for SpecForge's (it runs its own torchrun) and for settings the stage refuses (in one line, itself)."""
    from remote.eagle3 import StageInputError
    from remote.eagle3.train_settings import TrainSettings

    try:
        settings = TrainSettings.from_config(config.get("stage", {}))
    except StageInputError:
        return 1
    online = config.get("prep_inputs") and not config.get("inputs")
    return 1 if settings.engine != "aerie" or online else resolve_nproc(settings.nproc)


def no_counts(vocab_size: int) -> Callable[[], Any]:
    """Token counts for a rank other than 0: none (DDP copies rank 0's vocabulary map and weights to it)."""
    def counts() -> Any:
        import torch

        return torch.zeros(vocab_size, dtype=torch.long)

    return counts


def launch(module: str, nproc: int) -> int:
    """Run ``python -m module`` as `nproc` ranks under torchrun's agent (standalone, loopback) and wait;
    the exit code, with one line naming the rank that failed unless it refused (its line is printed)."""
    # NOTE: before the import: each of the agent's loggers takes its level from LOGLEVEL when it is made;
    # its notes (a rank's death, a stop's signal, its ERROR line on a failed rank) are not the user's: a job's
    # error is its log's last line, which must be the rank's own (a refusal, a traceback's end) or the one below.
    os.environ.setdefault("LOGLEVEL", "CRITICAL")
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # and the loggers that inherit a level
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"aerie-{os.getpid()}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.5,
                          start_method="spawn")
    try:
        elastic_launch(config, sys.executable)("-m", module)
    except SignalException as stopped:  # `inv stop` (SIGTERM): the agent stopped the ranks; the job ends by it
        return 128 + int(stopped.sigval)
    except ChildFailedError as failed:
        rank, failure = first_cause(failed.failures)
        code = failure.exitcode
        if code == REFUSED:
            return REFUSED
        why = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        print(f"{module.rsplit('.', 1)[-1]}: rank {rank} of {nproc} {why}; the others were stopped "
              "(`inv rerun --failed` goes on from the last checkpoint)", file=sys.stderr, flush=True)
        return 1
    return 0


def first_cause(failures: dict[int, Any]) -> tuple[int, Any]:
    """The rank whose failure the others followed: one killed by a signal (the OOM killer's SIGKILL, a user's kill)
    before any that exited, since the others exit on the broken collective; a SIGTERM last, since that is how the
    agent stops the others once one failed; within each, the first to fail. The agent's own first failure is by
    time alone, and a rank that exits on the broken collective can carry an earlier time than the killed rank,
    whose death the agent only notices at its next look."""
    return min(failures.items(), key=lambda item: (item[1].exitcode == -signal.SIGTERM, item[1].exitcode >= 0,
                                                   item[1].timestamp))


def start(world: World) -> Any:
    """Join the process group (NCCL on GPUs, gloo on the CPU); this rank's device."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        device = torch.device("cuda", world.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world.is_distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return device


def stop(world: World) -> None:
    import torch.distributed as dist

    if world.is_distributed and dist.is_initialized():
        # NOTE: every rank leaves together: a rank that tears its gloo group down while rank 0 still
        # measures and saves the last epoch can abort in gloo's threads (SIGABRT) as it exits.
        dist.barrier()
        dist.destroy_process_group()


def wrap(model: Any, world: World) -> Any:
    """`model` as the ranks train it: under DDP (its weights and buffers broadcast from rank 0 first)."""
    if not world.is_distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [model.fc.weight.device.index] if model.fc.weight.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def share(chunk: Sequence[Any], world: World) -> list[Any]:
    """This rank's records of one global batch: every `size`-th, from its rank; a batch shorter than the
    world is repeated so that every rank takes a step (each must, for the gradients' all-reduce)."""
    chunk = list(chunk)
    if len(chunk) < world.size:
        chunk = (chunk * world.size)[: world.size]
    return chunk[world.rank :: world.size]


def mean(values: list[float], world: World) -> list[float]:
    """`values` averaged over the ranks (a step's loss and accuracies, as rank 0 reports them)."""
    if not world.is_distributed:
        return values
    import torch
    import torch.distributed as dist

    backend_cuda = dist.get_backend() == "nccl"
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda" if backend_cuda else "cpu")
    dist.all_reduce(tensor)
    return (tensor / world.size).tolist()


def barrier(world: World) -> None:
    if world.is_distributed:
        import torch.distributed as dist

        dist.barrier()
