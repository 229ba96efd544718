"""A job's log: capped while the job writes it, and read from its end.

Writing: the supervisor is the log's only writer (`CappedLog`). The stage's stdout and
stderr reach it through a pipe, so a runaway stage cannot fill the host's disk: when the
log would pass the job's `log_limit` (the spec's, from ``stages.<stage>.log_limit``), its
newest half is copied behind one marker line into a new file, renamed into place::

    [aerie] this log is capped at 67108864 bytes (the stage's log_limit): its first 1234567 bytes were cut

Reading: `tail` and `last_line` read a log's last 4 KiB (`inv status`'s last line, a failed
job's error). `write_last_lines` finds where the last N lines start by reading backwards from
the end, then copies them out in blocks, so it holds one block whatever the log's size;
a line longer than `LINE_LIMIT` keeps its end (a progress bar's latest state, an error's
last words) after a marker. `follow` goes on from there and across the writer's renames.
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
from pathlib import Path

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import BinaryIO, Callable

SUPERVISOR_MARK = "[aerie]"  # the supervisor's own lines in a job's log
#: How much of a log's end `tail` and `last_line` read.
TAIL_BYTES = 4096
BLOCK = 64 * 1024
#: The most of one line `inv logs` shows: a longer line keeps its last LINE_LIMIT bytes.
LINE_LIMIT = 16 * 1024
#: How far back `inv logs` looks for the start of its lines; a capped log is never that long.
SCAN_LIMIT = 1 << 30
MARKER = SUPERVISOR_MARK + " this log is capped at {limit} bytes (the stage's log_limit): its first {cut} bytes were cut\n"
HEADER = re.compile(rb"\[aerie\] this log is capped at \d+ bytes [^\n]*: its first (\d+) bytes were cut\n")


def whole_lines() -> None:
    """This process's stdout and stderr written to the log a whole line at a time, as promptly.

    A job's processes (the stage; a launcher and its ranks) share its log through one pipe, and
    under ``PYTHONUNBUFFERED`` (set so that each line reaches the log at once) `print` writes a
    line and its newline apart: another process's line could land between the two, gluing two
    lines into one and leaving an empty one (the job's error is its log's last line)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.write_through:
            stream.reconfigure(write_through=False, line_buffering=True)


def tail(log: Path, size: int = TAIL_BYTES) -> str:
    """The last `size` bytes of a log as text; "" when it cannot be read."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def last_line(log: Path, limit: int = 160) -> str:
    """The stage's last non-empty line in a log (not the supervisor's own), read from its last
    `limit` bytes (4 KiB at least) only; its first `limit` characters, after "…" when its start lies
    before what was read."""
    window = max(TAIL_BYTES, limit)
    lines = tail(log, window).split("\n")
    for index in range(len(lines) - 1, -1, -1):
        text = lines[index].strip()
        if text and not text.startswith(SUPERVISOR_MARK):
            whole = index > 0 or _size(log) <= window
            return ("" if whole else "…") + text[:limit]
    return ""


def bounded(text: str, limit: int) -> str:
    """`text`, or its last `limit` characters after "…": what a message ends with says what went wrong."""
    return text if len(text) <= limit else "…" + text[len(text) - limit + 1:]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


#: The most of the log's unwritten end kept in memory.
LOST_LIMIT = 8192


class CappedLog:
    """The job's log as its supervisor writes it: appends, and past `limit` bytes (None: no limit)
    the oldest part cut. Thread-safe: the stage's output and the supervisor's own lines share it."""

    def __init__(self, path: Path, limit: int | None) -> None:
        import threading  # here: only the supervisor writes logs

        self.path, self.limit = path, limit
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        self.cut, self.header = marker_of(self._fd)
        self._stdio = False
        #: The end of what a full disk kept out of the file: the supervisor's end state still tells it.
        self.lost = b""

    def take_stdio(self) -> None:
        """Point this process's stdout and stderr at the log, now and after every cut, so that what
        Python prints by itself (a traceback) lands in the file the log is now."""
        self._stdio = True
        for fd in (1, 2):
            os.dup2(self._fd, fd)

    def line(self, text: str) -> None:
        self.write(f"{text}\n".encode(errors="replace"))

    def write(self, data: bytes) -> None:
        with self._lock:
            try:
                if self.limit and self.size + len(data) > self.limit:
                    self._cut(data)
                else:
                    _write_all(self._fd, data)
                    self.size += len(data)
            except OSError:  # a full disk: the stage goes on, and its end state says why it failed
                self.size = os.fstat(self._fd).st_size
                self.lost = (self.lost + data)[-LOST_LIMIT:]

    def lost_line(self) -> str:
        """The last line a full disk kept out of the log ("" when none was)."""
        lines = [line.strip() for line in self.lost.decode(errors="replace").splitlines()]
        return next((line for line in reversed(lines) if line and not line.startswith(SUPERVISOR_MARK)), "")

    def pump(self, source: int) -> None:
        """Copy everything from the pipe `source` into the log until every writer has closed it."""
        while True:
            try:
                chunk = os.read(source, BLOCK)
            except InterruptedError:
                continue
            if not chunk:
                break
            self.write(chunk)
        os.close(source)

    def _cut(self, data: bytes) -> None:
        """Keep the newest half of the limit (from a line's start where one is near) behind the marker."""
        keep = max(self.limit // 2, 1)
        dropped = max(0, len(data) - keep)
        data = data[dropped:]
        start = max(self.header, self.size - (keep - len(data))) if not dropped else self.size
        start = self._next_line(start)
        cut = self.cut + (start - self.header) + dropped
        marker = MARKER.format(limit=self.limit, cut=cut).encode()
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, marker)
            for offset in range(start, self.size, BLOCK):
                _write_all(fd, os.pread(self._fd, min(BLOCK, self.size - offset), offset))
            _write_all(fd, data)
            os.replace(temporary, self.path)
        except OSError:
            os.close(fd)
            temporary.unlink(missing_ok=True)
            raise
        os.close(self._fd)
        self._fd, self.header, self.cut, self.size = fd, len(marker), cut, os.fstat(fd).st_size
        if self._stdio:
            self.take_stdio()

    def _next_line(self, start: int) -> int:
        """`start`, moved past the next newline when one is within a few KiB: the kept part begins with a whole line."""
        if start >= self.size:
            return start
        near = os.pread(self._fd, min(4096, self.size - start), start)
        newline = near.find(b"\n")
        return start + newline + 1 if newline >= 0 else start


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def marker_of(fd: int) -> tuple[int, int]:
    """How many bytes of the job's output were cut before this file's content, and the length of the
    marker line that says so (0, 0 for a log never cut)."""
    match = HEADER.match(os.pread(fd, 512, 0))
    return (int(match.group(1)), match.end()) if match else (0, 0)


# -- reading ---------------------------------------------------------------------------


def line_starts(handle: BinaryIO, end: int, count: int, scan_limit: int = SCAN_LIMIT) -> tuple[list[int], bool]:
    """Where the last `count` lines before `end` start, oldest first, and whether the first of them
    truly starts there (False: its start lies more than `scan_limit` bytes back, where the search stopped)."""
    if count <= 0 or end <= 0:
        return [], True
    handle.seek(end - 1)
    stop = end - 1 if handle.read(1) == b"\n" else end  # a final newline ends the last line, it starts none
    newlines: list[int] = []
    position = stop
    while position > 0 and len(newlines) < count:
        if end - position >= scan_limit:
            return [position, *(n + 1 for n in reversed(newlines))], False
        begin = max(0, position - BLOCK, end - scan_limit)
        handle.seek(begin)
        block = handle.read(position - begin)
        index = len(block)
        while len(newlines) < count:
            index = block.rfind(b"\n", 0, index)
            if index < 0:
                break
            newlines.append(begin + index)
        position = begin
    starts = [n + 1 for n in reversed(newlines)]
    return ([0] if len(newlines) < count else []) + starts, True


def write_last_lines(handle: BinaryIO, count: int, write: Callable[[bytes], object],
                     line_limit: int = LINE_LIMIT) -> int:
    """Write the log's last `count` lines, each cut to its last `line_limit` bytes after a marker;
    the offset they end at (where `follow` goes on)."""
    end = handle.seek(0, os.SEEK_END)
    starts, whole = line_starts(handle, end, count)
    for index, start in enumerate(starts):
        stop = starts[index + 1] if index + 1 < len(starts) else end
        if stop - start > line_limit:
            kept = _char_start(handle, stop - line_limit)
            write(f"[aerie: line cut, its first {'more than ' if index == 0 and not whole else ''}{kept - start} bytes "
                  f"not shown] ".encode())
            start = kept
        _copy(handle, start, stop, write)
    return end


def _char_start(handle: BinaryIO, offset: int) -> int:
    """`offset`, moved past UTF-8 continuation bytes: a cut line does not begin with half a character."""
    handle.seek(offset)
    head = handle.read(3)
    return offset + next((i for i, byte in enumerate(head) if byte & 0xC0 != 0x80), len(head))


def _copy(handle: BinaryIO, start: int, stop: int, write: Callable[[bytes], object]) -> None:
    handle.seek(start)
    while start < stop:
        chunk = handle.read(min(BLOCK, stop - start))
        if not chunk:
            return
        write(chunk)
        start += len(chunk)


def follow(path: Path, handle: BinaryIO, offset: int, is_over: Callable[[], bool],
           write: Callable[[bytes], object], pause: float = 0.25) -> None:
    """Write what is added to the log from `offset` on, across the writer's cuts, until `is_over()`
    (checked only when nothing new is there; what was written before it is written too)."""
    handle.seek(offset)
    cut, header = marker_of(handle.fileno())
    position = cut + offset - header  # in the job's whole output
    while True:
        handle, position, moved = _catch_up(path, handle, position, write)
        if moved:
            continue
        if is_over():
            _catch_up(path, handle, position, write)
            return
        time.sleep(pause)


def _catch_up(path: Path, handle: BinaryIO, position: int,
              write: Callable[[bytes], object]) -> tuple[BinaryIO, int, bool]:
    """Write everything there is now, moving to the new file after each cut; the handle, the position
    in the job's whole output, and whether anything was written."""
    moved = False
    while True:
        chunk = handle.read(BLOCK)
        if chunk:
            write(chunk)
            position += len(chunk)
            moved = True
            continue
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle, position, moved
            fresh = open(path, "rb")
        except FileNotFoundError:
            return handle, position, moved
        cut, header = marker_of(fresh.fileno())
        if position < cut:
            write(f"\n[aerie: {cut - position} bytes were cut from the log before they could be shown]\n".encode())
            position = cut
        fresh.seek(header + position - cut)
        handle.close()
        handle, moved = fresh, True
