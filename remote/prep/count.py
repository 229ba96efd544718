"""How many rows a dataset has, known before prep reads it, so `inv status` can tell the time left.

Cheap by design: a JSON Lines file is counted by its newlines (read in large
blocks, no parsing) up to `EXACT_BYTES`, and beyond that estimated from the
newlines of its first `SAMPLE_BYTES` scaled by its size; a Parquet file says
its row count in its footer; a hub dataset the number of examples its metadata gives for the
split (what `datasets` records when it prepares it; the prep stage is about to
load it anyway). A JSON array, or a hub dataset without that metadata, gives
None (unknown: no ETA) unless `limit` caps it. Never raises: a count is only a hint.
"""

from __future__ import annotations

from pathlib import Path

from remote.prep.load import LOCAL_SUFFIXES, Source, _looks_like_path

EXACT_BYTES = 256 << 20
SAMPLE_BYTES = 16 << 20
BLOCK = 1 << 20


def estimate_rows(source: Source, base: Path | None = None) -> int | None:
    """The rows prep will read from `source` (exactly or nearly), or None when unknown."""
    try:
        path = Path(source.source).expanduser()
        path = path if path.is_absolute() else (base or Path.cwd()) / path
        if path.exists():
            files = sorted(p for p in path.rglob("*") if p.suffix in LOCAL_SUFFIXES and p.is_file()) if path.is_dir() else [path]
            counts = [_rows(f) for f in files]
            total = sum(c for c in counts if c is not None) if counts and None not in counts else None
        else:
            total = None if _looks_like_path(source.source) else _hub_rows(source)
    except Exception:  # noqa: BLE001 (a hint: pyarrow, datasets and the file system all raise their own)
        total = None
    if source.limit:
        return min(total, source.limit) if total is not None else source.limit
    return total


def _hub_rows(source: Source) -> int | None:
    """The split's example count from the hub dataset's metadata, when it has one."""
    import datasets

    splits = datasets.load_dataset_builder(source.source, source.config).info.splits or {}
    split = splits.get(source.split)
    return int(split.num_examples) if split is not None and split.num_examples else None


def _rows(path: Path) -> int | None:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if path.suffix != ".jsonl":
        return None  # a JSON array: its rows are known only once it is parsed
    size = path.stat().st_size
    with open(path, "rb") as file:
        if size <= EXACT_BYTES:
            return _lines(file, size)
        sampled = _lines(file, SAMPLE_BYTES)
    return round(sampled * size / SAMPLE_BYTES)


def _lines(file, limit: int) -> int:  # noqa: ANN001 (a binary file)
    """Lines in the first `limit` bytes (a last line without a newline counts; blank lines too: a hint)."""
    lines, read, last = 0, 0, b"\n"
    while read < limit and (block := file.read(min(BLOCK, limit - read))):
        lines += block.count(b"\n")
        read, last = read + len(block), block[-1:]
    return lines + (last != b"\n")
