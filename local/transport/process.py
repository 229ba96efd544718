"""A command's result, and a process run here: what every transport (local/transport/) hands back."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import BinaryIO


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def run_process(argv: list[str], stdin: bytes | None = None, stream: BinaryIO | None = None) -> Result:
    """`argv` to its end: its output kept, or its stdout copied to `stream` as it comes."""
    if stream is None:
        done = subprocess.run(argv, input=stdin or b"", capture_output=True)
        return Result(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
    process = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    if stdin:  # written whole first: a remote verb reads all of its arguments before it prints
        assert process.stdin is not None
        process.stdin.write(stdin)
        process.stdin.close()
    for chunk in iter(lambda: process.stdout.read1(65536), b""):  # type: ignore[union-attr]
        stream.write(chunk)
        stream.flush()
    return Result(process.wait(), "", process.stderr.read().decode(errors="replace"))
