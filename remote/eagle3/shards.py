"""The hidden-state store: shards of per-sample ``.ckpt`` files, committed by rename.

Layout under the extract stage's output directory::

    plan.json                 what these shards were made from (prep release, layers, model, ...)
    shard-00000/              a complete shard: records [0, shard_size) of prep's order
        meta.json             {"shard": 0, "files": [...], "ids": [...]}
        data_000000000.ckpt   one record (see below)
    .shard-00001.tmp/         a shard being written; a restart deletes it and starts it again
    manifest.json             written last, when every shard is complete

Each ``.ckpt`` is a ``torch.save`` dict in the layout SpecForge's offline
trainer reads (``OfflineEagle3Dataset``; it walks the directory for ``*.ckpt``
and sorts the paths), so ``--train-hidden-states-path`` can point straight at
the output directory:

==================  =============  ==========================================
``input_ids``       (T,) int64     the record's tokens
``loss_mask``       (T,) int64     1 where the token is trained on
``aux_hidden_state``(1, T, 3H)     the configured layers' outputs, concatenated in order
``hidden_state``    (1, T, H)      the final hidden state (after the final norm; the lm_head's input)
``id``              str            the prep record id (ignored by SpecForge)
==================  =============  ==========================================

A shard's files are written as ``*.part`` inside the hidden temporary
directory and renamed to ``*.ckpt`` just before the directory itself is renamed
into place, so a reader never sees a half-written shard, and a crash leaves
nothing ending in ``.ckpt`` outside a complete shard.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from remote.control_plane.progress import read_json, write_json_atomic

SHARD_PREFIX = "shard-"
TMP_SUFFIX = ".tmp"


def shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:05d}"


def sample_name(record_index: int) -> str:
    # NOTE: zero-padded so that SpecForge's sorted path list keeps prep's order.
    return f"data_{record_index:09d}.ckpt"


class ShardStore:
    """The shards under one extract output directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def shard_dir(self, index: int) -> Path:
        return self.root / shard_name(index)

    def is_complete(self, index: int) -> bool:
        return (self.shard_dir(index) / "meta.json").is_file()

    def meta(self, index: int) -> dict[str, Any]:
        return json.loads((self.shard_dir(index) / "meta.json").read_text())

    def complete_shards(self) -> list[int]:
        return sorted(int(p.name[len(SHARD_PREFIX):]) for p in self.root.glob(f"{SHARD_PREFIX}*") if (p / "meta.json").is_file())

    def remove_torn(self) -> list[str]:
        """Delete shards a killed run left half-written; their names."""
        torn = sorted(self.root.glob(f".{SHARD_PREFIX}*{TMP_SUFFIX}"))
        for path in torn:
            shutil.rmtree(path)
        return [p.name for p in torn]

    def reset(self) -> None:
        """Forget every shard and the manifest (the inputs changed)."""
        for path in self.root.glob(f"{SHARD_PREFIX}*"):
            shutil.rmtree(path)
        (self.root / "manifest.json").unlink(missing_ok=True)
        self.remove_torn()

    def use_plan(self, plan: dict[str, Any]) -> bool:
        """Record what the shards are made from; False (and a reset) when older shards came from something else."""
        path = self.root / "plan.json"
        old = read_json(path)
        changed = old is not None and old != plan
        if changed:
            self.reset()
        write_json_atomic(path, plan)
        return not changed

    def writer(self, index: int) -> "ShardWriter":
        return ShardWriter(self.root, index)

    def sample_files(self) -> list[Path]:
        """Every complete sample, in prep's order."""
        return sorted(p for index in self.complete_shards() for p in self.shard_dir(index).glob("*.ckpt"))


class ShardWriter:
    """Writes one shard into a temporary directory; `commit` renames it into place."""

    def __init__(self, root: Path, index: int) -> None:
        self.index = index
        self.final = root / shard_name(index)
        self.tmp = root / f".{shard_name(index)}{TMP_SUFFIX}"
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.files: list[str] = []
        self.ids: list[str] = []

    def add(self, record_index: int, sample: dict[str, Any]) -> None:
        import torch

        name = sample_name(record_index)
        torch.save(sample, self.tmp / f"{name}.part")
        self.files.append(name)
        self.ids.append(str(sample.get("id", "")))

    def commit(self) -> None:
        for name in self.files:
            os.replace(self.tmp / f"{name}.part", self.tmp / name)
        write_json_atomic(self.tmp / "meta.json", {"shard": self.index, "files": self.files, "ids": self.ids})
        os.replace(self.tmp, self.final)


def load_sample(path: Path, mmap: bool = False) -> dict[str, Any]:
    """One record; with `mmap` only the tensors actually touched are read from disk."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
