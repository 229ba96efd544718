"""Rows of a dataset: a hub id through `datasets`, or a local JSONL, JSON or Parquet.

Local JSON and JSONL are read line by line here rather than through `datasets`:
Arrow infers one schema per file, so a file that mixes formats (``content`` a
string in one row and a list of parts in the next) or holds one broken line
fails as a whole. Here a broken line becomes a `Malformed` row, counted and
skipped, and the rest of the file is read.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from remote.prep.errors import PrepError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Malformed:
    """A row that could not even be parsed; it is counted under `reason`."""

    reason: str


@dataclass(frozen=True)
class Source:
    """Where a dataset's rows come from: its inventory entry, less the prep settings."""

    source: str
    config: str | None = None
    split: str = "train"
    limit: int | None = None
    streaming: bool = False

    @classmethod
    def from_config(cls, source: str, config: dict[str, Any]) -> "Source":
        if not source:
            raise PrepError("the dataset has no source: set datasets.<name>.source to a hub id or a file path")
        limit = config.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise PrepError(f"limit must be a positive integer (got {limit!r})")
        return cls(source, config.get("config"), config.get("split") or "train", limit, bool(config.get("streaming")))


def iter_rows(source: Source, base: Path | None = None) -> Iterator[Any]:
    """The rows of `source`, at most `limit`; a relative path is taken from `base` (default: cwd)."""
    rows = _local_rows(source, base or Path.cwd())
    if rows is None:
        rows = _hub_rows(source)
    return itertools.islice(rows, source.limit) if source.limit else rows


def _local_rows(source: Source, base: Path) -> Iterator[Any] | None:
    path = Path(source.source).expanduser()
    path = path if path.is_absolute() else base / path
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in LOCAL_SUFFIXES and p.is_file())
        if not files:
            raise PrepError(f"dataset directory {path} holds no .jsonl, .json or .parquet file")
        return itertools.chain.from_iterable(_file_rows(p) for p in files)
    if path.is_file():
        return _file_rows(path)
    if _looks_like_path(source.source):
        raise PrepError(f"dataset file {path} does not exist: fix datasets.<name>.source")
    return None


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or source.endswith(LOCAL_SUFFIXES)


def _file_rows(path: Path) -> Iterator[Any]:
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    if path.suffix == ".json":
        return _json_rows(path)
    return _jsonl_rows(path)


def _jsonl_rows(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                yield Malformed("malformed JSON line")


def _json_rows(path: Path) -> Iterator[Any]:
    """A JSON array of rows, or (as often happens) JSONL under a .json name."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError:
        yield from _jsonl_rows(path)
        return
    yield from data if isinstance(data, list) else [data]


def _parquet_rows(path: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _hub_rows(source: Source) -> Iterator[Any]:
    import datasets

    try:
        dataset = datasets.load_dataset(source.source, source.config, split=source.split, streaming=source.streaming)
    except Exception as exc:  # datasets raises many types; all mean "cannot open"
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise PrepError(
            f"cannot load dataset {source.source!r} (config {source.config}, split {source.split}): {first_line}"
            " (with HF_DATASETS_OFFLINE=1 it must already be in the host's cache)"
        ) from None
    return iter(dataset)
