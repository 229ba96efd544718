"""Prep's outputs, written under temporary names and renamed into place at the end.

Layout of the output directory::

    conversations.jsonl        native: the normalised records (SpecForge's layout)
    tokens-00000.parquet ...   native: id (string), input_ids (list<int32>), loss_mask (list<int8>)
    prompts.jsonl              prompts: {"id", "conversations", "tools"?}: the system prompt, every user turn,
                               an agent row's original calls and tool results (remote.prep.prompt_turns)
    manifest.json              written last: what was read, kept, skipped and why

A finished run's outputs stay in place until the next run commits (a rerun that is
stopped, killed or fails leaves the dataset as it was): opening a writer removes only
temporaries that dead runs left, and `commit` replaces the outputs, removes the earlier
run's that this run did not write, and writes the manifest last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from remote.prep.preparer import Prepared
from remote.control_plane.progress import write_json_atomic
from remote.control_plane.scratch import TMP_PREFIX, temporary_name

MANIFEST = "manifest.json"


class OutputWriter:
    """Streams kept records to temporary files; `commit` renames them into place."""

    def __init__(self, directory: Path, kind: str, shard_size: int = 10_000) -> None:
        self.directory = Path(directory)
        self.kind = kind
        self.shard_size = shard_size
        self.directory.mkdir(parents=True, exist_ok=True)
        _clear_temporaries(self.directory)
        name = "conversations.jsonl" if kind == "native" else "prompts.jsonl"
        self._jsonl_name = name
        self._jsonl = open(self.directory / temporary_name(name), "w", encoding="utf-8")
        self._pending: list[tuple[str, np.ndarray, np.ndarray]] = []
        self._shards: list[str] = []

    def __call__(self, prepared: Prepared) -> None:
        for record in prepared.records:
            self._jsonl.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
        for record, tokens in zip(prepared.records, prepared.tokens):
            self._pending.append((record.id, tokens.input_ids, tokens.loss_mask))
        while len(self._pending) >= self.shard_size:
            self._write_shard(self._pending[: self.shard_size])
            self._pending = self._pending[self.shard_size :]

    def commit(self, manifest: dict[str, Any]) -> list[str]:
        """Move every output into place, then write `manifest.json`; the names written."""
        if self._pending:
            self._write_shard(self._pending)
            self._pending = []
        self._jsonl.close()
        names = [self._jsonl_name] + self._shards
        # NOTE: the manifest goes first: until the new one is written, the directory is not a finished output.
        (self.directory / MANIFEST).unlink(missing_ok=True)
        for name in names:
            os.replace(self.directory / temporary_name(name), self.directory / name)
        for path in self.directory.iterdir():  # the earlier run's shards beyond this run's
            if _is_output(path.name) and path.name not in names:
                path.unlink()
        write_json_atomic(self.directory / MANIFEST, {**manifest, "outputs": names})
        return names

    def abort(self) -> None:
        """Drop what this run wrote; an earlier run's finished outputs stay."""
        try:
            self._jsonl.close()  # its last flush fails on a full disk: clear all the same, to free it
        except OSError:
            pass
        _clear_temporaries(self.directory)

    def _write_shard(self, rows: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        lengths = np.array([len(ids) for _, ids, _ in rows], dtype=np.int32)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        table = pa.table(
            {
                "id": pa.array([row_id for row_id, _, _ in rows], type=pa.string()),
                "input_ids": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate([r[1] for r in rows]))),
                "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate([r[2] for r in rows]))),
            }
        )
        name = f"tokens-{len(self._shards):05d}.parquet"
        pq.write_table(table, self.directory / temporary_name(name))
        self._shards.append(name)


def _clear_temporaries(directory: Path) -> None:
    """Every run's temporaries: a run that is not this one and still writes is one being ended (a
    relaunch cancels it first), and it must not publish a mix of its files and this run's."""
    for path in directory.iterdir():
        if path.name.startswith(TMP_PREFIX):
            path.unlink()


def _is_output(name: str) -> bool:
    return name in ("conversations.jsonl", "prompts.jsonl") or (name.startswith("tokens-") and name.endswith(".parquet"))
