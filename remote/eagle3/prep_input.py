"""The prep stage's tokenised records, checked before anything reads them.

Prep writes ``<data>/prep/tokens-*.parquet`` (columns ``id``, ``input_ids``,
``loss_mask``) and, last of all, ``<data>/prep/manifest.json``. A missing
manifest, or one without ``release``, means prep never finished, or an older
aerie wrote it: extraction refuses such inputs rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from remote.eagle3 import StageInputError, read_upstream_manifest

COLUMNS = ["id", "input_ids", "loss_mask"]


@dataclass(frozen=True)
class Record:
    """One tokenised conversation."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]


def read_manifest(prep_dir: Path) -> dict[str, Any]:
    """Prep's manifest, refused when prep did not finish or predates the release field."""
    return read_upstream_manifest(prep_dir, "prep", ("release",))


def shard_files(prep_dir: Path) -> list[Path]:
    files = sorted(prep_dir.glob("tokens-*.parquet"))
    if not files:
        raise StageInputError(f"no tokens-*.parquet in {prep_dir}: rerun prep")
    return files


def read_records(prep_dir: Path) -> Iterator[Record]:
    """Every record, in shard order then row order (a stable order for resuming)."""
    import pyarrow.parquet as pq

    for file in shard_files(prep_dir):
        # NOTE: one file at a time with ParquetFile: pq.read_table would import pyarrow.dataset, and pandas with it,
        # at every extract and train start, for nothing they use.
        with pq.ParquetFile(file) as shard:
            missing = [c for c in COLUMNS if c not in shard.schema_arrow.names]
            if missing:
                raise StageInputError(f"{file} lacks column(s) {', '.join(missing)}: rerun prep on the current release")
            rows = shard.read(columns=COLUMNS).to_pylist()
        for row in rows:
            yield Record(str(row["id"]), list(row["input_ids"]), list(row["loss_mask"]))
