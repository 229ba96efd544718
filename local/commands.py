"""What every way of running a host's command shares (local/transport.py, local/multiplex.py, local/ssh.py):
its result, a process run here, and the checks both SSH clients make before they connect.

Kept below all three so that none imports another for them: the transports import this, never each other's
helpers.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from local.exceptions import AerieError

if TYPE_CHECKING:  # the schema (pydantic) stays unimported on the fast path: local/inventory_cache.py
    from local.inventory import Host

#: Set by the test suite: refuse any SSH address that is not loopback.
LOOPBACK_ONLY_ENV = "AERIE_TEST_ONLY_LOOPBACK"


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


def known_hosts(host: Host) -> Path:
    """The host keys both SSH clients check against: the inventory's file, else the user's own."""
    return Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()


def refuse_non_loopback(address: str) -> None:
    if not os.environ.get(LOOPBACK_ONLY_ENV):
        return
    resolved = socket.getaddrinfo(address, None)[0][4][0]
    if not ipaddress.ip_address(resolved).is_loopback:
        raise AerieError(f"refusing to connect to {address} ({resolved}): tests may reach loopback only")
