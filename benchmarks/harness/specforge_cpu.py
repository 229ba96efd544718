"""The real SpecForge CLI (the pinned 0.2.0 wheel) on a machine without a GPU, for the tests and the
benchmarks only (tests/specforge_cpu.py runs it for the tests; `benchmarks.bench_train` for `inv bench`).

    python benchmarks/harness/specforge_cpu.py train --config run.yaml      # or: export --to sglang ...

Everything is SpecForge's own code except what cannot run on a CPU, replaced here and nowhere in
what ships (local/ and remote/):

- its loss, a Triton kernel (`specforge.core.loss.LogSoftmaxLoss`), by the same math in torch:
  per position, minus the target distribution's dot product with the log-softmax of the logits,
  zero where the position mask is 0, averaged over every position (`_log_softmax_loss`);
- `torch.compile`, the identity: Inductor compiles each new shape on a CPU, and merely importing
  it for SpecForge's decorators cost more than a 10-record run's training; one thread, since the
  tensors are tiny and the runners' cores busy;
- for `train`, two dotted overrides on SpecForge's own command line, so the run.yaml aerie wrote is
  untouched: ``training.fsdp_sharding=NO_SHARD`` (one gloo rank) and
  ``training.attention_backend=sdpa`` (flex attention needs a compiled kernel).
"""

from __future__ import annotations

import sys
import types

CPU_OVERRIDES = ["training.fsdp_sharding=NO_SHARD", "training.attention_backend=sdpa"]


def _log_softmax_loss(logits, target, position_mask):
    import torch

    batch, positions, _ = logits.shape
    log_p = torch.log_softmax(logits.float(), dim=-1)
    per_position = -(target.float() * log_p).sum(-1) * position_mask.reshape(batch, positions).bool()
    return per_position.mean()


def _no_compile(model=None, **_options):
    return model if model is not None else (lambda function: function)


def install() -> None:
    """Put the torch loss where SpecForge imports its Triton one from; compile nothing."""
    import torch

    torch.compile = _no_compile
    torch.set_num_threads(1)
    module = types.ModuleType("specforge.core.loss")
    module.LogSoftmaxLoss = types.SimpleNamespace(apply=_log_softmax_loss)
    sys.modules["specforge.core.loss"] = module


def main(argv: list[str]) -> int:
    install()
    from specforge.cli import main as specforge

    return specforge([*argv, *CPU_OVERRIDES] if argv[:1] == ["train"] else argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
