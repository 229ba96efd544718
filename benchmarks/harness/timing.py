"""Timing a callable on a device: the train-step and capture benchmarks (bench_extract, bench_steps) share it."""

from __future__ import annotations

import time
from typing import Any, Callable


def sync(device: str) -> None:
    """Wait for the device's queued work, so that a clock reading covers it (CUDA runs asynchronously)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int, warmup: int = 1) -> float:
    """Seconds per call, after `warmup` calls (compilation, allocator, autotuning)."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - start) / repeats
