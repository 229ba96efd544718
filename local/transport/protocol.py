"""How commands reach the host: a subprocess here, or SSH there (local/transport/openssh.py, local/transport/paramiko_ssh.py).

Both backends run a shell command line, feed it bytes on stdin and hand back
its exit code and output; `stream` copies stdout as it arrives (`inv logs -f`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO, Protocol

from local.transport.process import Result, run_process

if TYPE_CHECKING:
    from local.inventory.values import Host


class Transport(Protocol):
    name: str

    def run(self, command: str, stdin: bytes | None = None, stream: BinaryIO | None = None) -> Result: ...

    def close(self) -> None: ...


class LocalTransport:
    """The `local` backend: this machine, no SSH."""

    name = "localhost"

    def run(self, command: str, stdin: bytes | None = None, stream: BinaryIO | None = None) -> Result:
        return run_process(["/bin/sh", "-c", command], stdin, stream)

    def close(self) -> None:
        pass


def open_transport(host: Host) -> Transport:
    """SSH to a host with an address; this machine for one without (backend local, a local Slurm login node)."""
    if not host.address:
        return LocalTransport()
    from local.transport.openssh import Multiplexed  # here: the local backend never needs SSH

    return Multiplexed(host)
