"""What checking the stored states costs train's reading: `load_sample` with its size and checksum check
against the plain ``torch.load`` train read with before.

``run()`` (``inv bench --only states``) writes ``files`` records through the real shard writer
(`remote.eagle3.shards.ShardWriter`, which takes the checksums as it writes) at Kimi-K2.5's width
(hidden 7,168, three aux layers, bfloat16) and ``tokens`` tokens each, then reads every file, in
alternating rounds:

- ``plain``: ``torch.load(path, map_location="cpu", weights_only=True)``, train's read before checks;
- ``mapped``: the same read as ``checked`` without the check (``torch.load(..., mmap=True)``);
- ``checked``: `remote.eagle3.shards.load_sample`: its size and xxh3_64 checked over the file
  memory-mapped, its tensors memory-mapped from the same pages.

Each sample's tensors are then copied once, as train's batching copies them (`remote.eagle3.trainer.collate`),
so that both read every byte.

Each both from the page cache (``warm``) and from the disk (``cold``: the files dropped from the
cache with ``posix_fadvise(DONTNEED)`` before each round). Reported: the median seconds per round,
``check_cost`` (checked over mapped, less one: what the check itself adds to train's reading),
``ratio`` (checked over plain: train's reading now against before), the hash's own throughput
against crc32's and blake2b's on the same bytes, and ``hash_share``: the xxh3 pass alone, at that
throughput, over the plain read's time (a figure a busy machine's noise does not swamp).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Callable

HIDDEN, AUX_LAYERS = 7168, 3


def write_store(root: Path, files: int, tokens: int) -> list[Path]:
    import torch

    from remote.eagle3.shards import ShardStore

    store = ShardStore(root)
    writer = store.writer(0)
    generator = torch.Generator().manual_seed(0)
    for i in range(files):
        writer.add(i, {"id": f"r{i}", "input_ids": torch.randint(0, 160_000, (tokens,), generator=generator),
                       "loss_mask": torch.ones(tokens, dtype=torch.long),
                       "aux_hidden_state": torch.randn(1, tokens, AUX_LAYERS * HIDDEN, generator=generator).bfloat16(),
                       "hidden_state": torch.randn(1, tokens, HIDDEN, generator=generator).bfloat16()})
    writer.commit()
    return store.sample_files()


def drop_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def copied(sample: dict[str, Any]) -> list[Any]:
    """Every tensor of a sample copied, as train's batching copies them into the batch."""
    return [value.clone() for value in sample.values() if hasattr(value, "clone")]


def timed(read: Callable[[Path], Any], paths: list[Path], cold: bool) -> float:
    if cold:
        drop_cache(paths)
    else:
        for path in paths:  # into the page cache
            path.read_bytes()
    started = time.perf_counter()
    for path in paths:
        copied(read(path))
    return time.perf_counter() - started


def hash_rates(paths: list[Path]) -> dict[str, float]:
    """GB/s of each hash over the files' bytes (already in memory)."""
    import xxhash

    data = [p.read_bytes() for p in paths]
    total = sum(len(d) for d in data)
    rates = {}
    for name, hash_ in (("xxh3_64", xxhash.xxh3_64_hexdigest), ("crc32", zlib.crc32),
                        ("blake2b", lambda d: hashlib.blake2b(d).digest())):
        started = time.perf_counter()
        for d in data:
            hash_(d)
        rates[name] = round(total / (time.perf_counter() - started) / 1e9, 2)
    return rates


def run(files: int = 24, tokens: int = 512, rounds: int = 9) -> dict[str, Any]:
    import torch

    from remote.eagle3.shards import load_sample

    def plain(path: Path) -> Any:
        return torch.load(path, map_location="cpu", weights_only=True)

    def mapped(path: Path) -> Any:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)

    work = Path(tempfile.mkdtemp(prefix="aerie-bench-states-", dir=os.environ.get("AERIE_BENCH_DIR")))
    try:
        paths = write_store(work / "extract", files, tokens)
        size = sum(p.stat().st_size for p in paths)
        result: dict[str, Any] = {"files": files, "tokens": tokens, "bytes": size, "hashes_gb_s": hash_rates(paths)}
        for cache in ("warm", "cold"):
            seconds: dict[str, list[float]] = {"plain": [], "mapped": [], "checked": []}
            for _ in range(rounds):
                for name, read in (("plain", plain), ("mapped", mapped), ("checked", load_sample)):
                    seconds[name].append(timed(read, paths, cache == "cold"))
            plain_s, mapped_s, checked_s = (statistics.median(seconds[k]) for k in ("plain", "mapped", "checked"))
            result[cache] = {"plain_s": round(plain_s, 4), "mapped_s": round(mapped_s, 4), "checked_s": round(checked_s, 4),
                             "plain_gb_s": round(size / plain_s / 1e9, 2),
                             "check_cost": round(checked_s / mapped_s - 1, 3), "ratio": round(checked_s / plain_s, 3),
                             # the hash alone (at its measured rate) over the plain read of the same bytes
                             "hash_share": round(size / (result["hashes_gb_s"]["xxh3_64"] * 1e9) / plain_s, 3)}
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
