"""Rows of a dataset: a hub id through `datasets`, or a local JSONL, JSON or Parquet.

Local JSON and JSONL are read row by row here rather than through `datasets`:
Arrow infers one schema per file, so a file that mixes formats (``content`` a
string in one row and a list of parts in the next) or holds one broken line
fails as a whole. Here a broken row (bad JSON, bytes that are not UTF-8, longer
than `MAX_ROW_BYTES`, the cut-off end of a truncated file) becomes a
`Malformed` row, counted and skipped, and the rest of the file is read.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from remote.prep.errors import PrepError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
#: The longest row read from a local JSON or JSONL file; a longer one is skipped unread. Far above any
#: real conversation, far below what would exhaust memory once parsed (a parsed row takes a large
#: multiple of its bytes: docs/benchmarks.md, "Figures moved out of comments").
MAX_ROW_BYTES = 16 << 20


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
    #: A hub dataset's commit, tag or branch: pinned data is reproducible data.
    revision: str | None = None

    @classmethod
    def from_config(cls, source: str, config: dict[str, Any]) -> "Source":
        if not source:
            raise PrepError("the dataset has no source: set datasets.<name>.source to a hub id or a file path")
        limit = config.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise PrepError(f"limit must be a positive integer (got {limit!r})")
        revision = config.get("revision")
        if revision is not None and (not isinstance(revision, str) or not revision.strip()):
            raise PrepError(f"revision must be a commit, tag or branch of the hub dataset (got {revision!r})")
        return cls(source, config.get("config"), config.get("split") or "train", limit, bool(config.get("streaming")),
                   revision)


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


def _jsonl_rows(path: Path, max_bytes: int | None = None) -> Iterator[Any]:
    """One row per line, split on ``\n`` only (a stray ``\r`` inside a row is the row's own), each
    line read up to `max_bytes`: a longer one is skipped without being held in memory."""
    max_bytes = max_bytes or MAX_ROW_BYTES
    with path.open("rb") as lines:
        while True:
            line = lines.readline(max_bytes + 1)
            if not line:
                return
            if len(line) > max_bytes and not line.endswith(b"\n"):
                _skip_line(lines)
                yield Malformed(f"row longer than {max_bytes:,} bytes")
                continue
            if not line.strip():
                continue
            yield _parse(line, "malformed JSON line")


def _skip_line(handle: BinaryIO) -> None:
    while True:
        chunk = handle.readline(1 << 16)
        if not chunk or chunk.endswith(b"\n"):
            return


def _parse(raw: bytes | bytearray, malformed: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Malformed("invalid UTF-8")
    try:
        return json.loads(text, strict=False)  # a raw control character (a stray \r) in a string is kept
    except json.JSONDecodeError:
        return Malformed(malformed)


def _json_rows(path: Path, max_bytes: int | None = None) -> Iterator[Any]:
    """A JSON array of rows, read one element at a time; one object; or (as often happens) JSONL under a
    .json name."""
    max_bytes = max_bytes or MAX_ROW_BYTES
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip()
        if head.startswith(b"["):
            handle.seek(0)
            yield from _array_rows(handle, max_bytes)
            return
    if head.startswith(b"{") and path.stat().st_size <= max_bytes:
        whole = _parse(path.read_bytes(), "malformed JSON")
        if isinstance(whole, dict):
            yield whole
            return
    yield from _jsonl_rows(path, max_bytes)


_ARRAY_TOKENS = re.compile(rb'["\\\[\]{},]')


def _array_rows(handle: BinaryIO, max_bytes: int) -> Iterator[Any]:
    """The elements of a top-level JSON array, found by a scanner that tracks strings and nesting, so
    that each is parsed on its own: a truncated file keeps its complete rows, a bad one is skipped
    with its reason, and an element over `max_bytes` is skipped without being held."""
    depth = 0  # 1 inside the top-level array
    in_string = escaped = over = False
    element = bytearray()
    while chunk := handle.read(1 << 20):
        start = 0 if depth else None  # where the current element's bytes begin in this chunk
        i = 0
        while i < len(chunk):
            if escaped:
                escaped, i = False, i + 1
                continue
            if depth == 0:
                opening = chunk.find(b"[", i)
                if opening < 0:
                    break
                depth, i, start = 1, opening + 1, opening + 1
                continue
            match = _ARRAY_TOKENS.search(chunk, i)
            if match is None:
                break
            token, i = match.group(), match.end()
            if in_string:
                if token == b"\\":
                    escaped = True
                elif token == b'"':
                    in_string = False
            elif token == b'"':
                in_string = True
            elif token in (b"{", b"["):
                depth += 1
            elif token in (b"}", b"]") and depth > 1:
                depth -= 1
            elif depth == 1 and token in (b",", b"]"):  # the end of one top-level element
                over = _keep(element, chunk[start:match.start()], max_bytes, over)
                if over:
                    yield Malformed(f"row longer than {max_bytes:,} bytes")
                elif element.strip():
                    yield _parse(element, "malformed JSON row")
                element.clear()
                over = False
                if token == b"]":
                    return
                start = i
        if start is not None and depth:
            over = _keep(element, chunk[start:], max_bytes, over)
    if over or element.strip():
        yield Malformed("the file ends inside a row (truncated?)")


def _keep(element: bytearray, part: bytes, max_bytes: int, over: bool) -> bool:
    """Add `part` to the element unless that makes it too long; whether it is."""
    if over or len(element) + len(part) > max_bytes:
        element.clear()
        return True
    element += part
    return False


def _parquet_rows(path: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _hub_rows(source: Source) -> Iterator[Any]:
    import datasets

    try:
        dataset = datasets.load_dataset(source.source, source.config, split=source.split, streaming=source.streaming,
                                        revision=source.revision)
    except Exception as exc:  # datasets raises many types; all mean "cannot open"
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise PrepError(
            f"cannot load dataset {source.source!r} (config {source.config}, split {source.split}"
            f"{f', revision {source.revision}' if source.revision else ''}): {first_line}"
            " (with HF_DATASETS_OFFLINE=1 it must already be in the host's cache)"
        ) from None
    return iter(dataset)
