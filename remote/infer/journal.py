"""A durable, append-only JSONL journal: what a restart reads to know which ids are done.

Lines are appended and made durable (flush + fsync) once per batch. A crash
can leave the last batch half on disk: a torn last line, or, after a power
loss, a stretch of garbage. Opening a journal keeps every line up to the first
one that does not parse and cuts the file there; the records after it are
simply asked again, so nothing is lost and nothing is written twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from remote.control_plane.scratch import temporary_name


class Journal:
    """One JSONL file of records keyed by ``id``, opened for appending."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = None

    def read(self) -> Iterator[dict[str, Any]]:
        """The intact records; cuts the file after the last one (call before `append`)."""
        if not self.path.exists():
            return
        good = 0
        with open(self.path, "rb") as file:
            for line in file:
                record = _parse(line)
                if record is None:
                    break
                good += len(line)
                yield record
        size = self.path.stat().st_size
        if size > good:
            with open(self.path, "r+b") as file:
                file.truncate(good)
                os.fsync(file.fileno())

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append `records` and make them durable before returning."""
        if not records:
            return
        if self._file is None:
            self._file = open(self.path, "ab")
        self._file.write(b"".join(_line(r) for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())

    def replace(self, records: list[dict[str, Any]]) -> None:
        """Make the journal hold exactly `records` (written beside it, renamed into place); call before `append`."""
        self.close()
        tmp = self.path.with_name(temporary_name(self.path.name))
        with open(tmp, "wb") as file:
            file.write(b"".join(_line(r) for r in records))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _line(record: dict[str, Any]) -> bytes:
    # NOTE: ASCII-only, so a reader that splits on Unicode line breaks
    # (U+2028, U+0085: str.splitlines does) still sees one record per line.
    return json.dumps(record, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def _parse(line: bytes) -> dict[str, Any] | None:
    """The record on a complete line, or None for a torn or garbled one."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "id" in record else None
