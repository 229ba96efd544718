"""One connection per host for a whole `inv` invocation, however many tasks it runs.

Invoke runs several tasks in one process (`inv deploy rerun --failed`), and each task
opens its hosts through `fleet()`. The transports live here, keyed by everything that
shapes the connection, and close when the process exits: the second task reuses the
first one's SSH connection instead of paying a key exchange and authentication again.
"""

from __future__ import annotations

import atexit
import json
import threading
from typing import TYPE_CHECKING, BinaryIO

from local.inventory.fields import dump
from local.transport.process import Result
from local.transport.protocol import Transport, open_transport

if TYPE_CHECKING:
    from local.inventory.values import Host

_open: dict[str, Transport] = {}
_lock = threading.Lock()


class Shared:
    """A transport owned by this registry: `close()` leaves it open for the next task."""

    def __init__(self, inner: Transport) -> None:
        self.inner, self.name = inner, inner.name

    def run(self, command: str, stdin: bytes | None = None, stream: BinaryIO | None = None) -> Result:
        return self.inner.run(command, stdin, stream)

    def close(self) -> None:
        pass  # close_all(), at exit


def shared(host: Host) -> Shared:
    """This process's transport to `host`, opened on first use; one that dropped is replaced."""
    key = json.dumps(dump(host), sort_keys=True)
    with _lock:
        transport = _open.get(key)
        if transport is None or getattr(transport, "is_dropped", False):
            if not _open:
                atexit.register(close_all)
            transport = _open[key] = open_transport(host)
        return Shared(transport)


def close_all() -> None:
    with _lock:
        transports = list(_open.values())
        _open.clear()
    for transport in transports:
        transport.close()
