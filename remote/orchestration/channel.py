"""The loopback channel between the chunked job and its resident training ranks (`remote.orchestration.rank_group`).

One TCP connection per rank, on 127.0.0.1, carrying one JSON object a line each way. A rank
connects to the port the job listens on (``AERIE_RANKS_PORT``) and says first which rank it is,
with the job's token (``AERIE_RANKS_TOKEN``, in the environment only): another process of the
host that finds the port is refused. The connection closing is how either side learns that the
other has gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from typing import Any, Callable

PORT_ENV, TOKEN_ENV = "AERIE_RANKS_PORT", "AERIE_RANKS_TOKEN"
#: The pid of the process that started this one (the job's, in the launcher; the launcher's, in a rank): it dies with it.
PARENT_ENV = "AERIE_RANKS_PARENT"
#: Linux's prctl option that sends a signal to a process when its parent ends.
PR_SET_PDEATHSIG = 1


class Channel:
    """JSON objects, one a line, over a connected socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message, default=float).encode() + b"\n")

    def fill(self) -> bool:
        """Read what has arrived (waiting for some); False once the other end has closed."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:  # the other end ended with data unread: closed all the same
            return False
        self.buffer += data
        return bool(data)

    def pending(self) -> list[dict[str, Any]]:
        """The whole messages read so far, taken out of the buffer."""
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def receive(self) -> dict[str, Any] | None:
        """The next message, waiting for it; None once the other end has closed."""
        while b"\n" not in self.buffer:
            if not self.fill():
                return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.sock.close()


def connect(rank: int) -> Channel:
    """This rank's channel to the job that started it (`PORT_ENV`), introduced with the job's token."""
    sock = socket.create_connection(("127.0.0.1", int(os.environ[PORT_ENV])))
    channel = Channel(sock)
    channel.send({"rank": rank, "pid": os.getpid(), "token": os.environ[TOKEN_ENV]})
    return channel


def dies_with(parent: int, sig: signal.Signals) -> Callable[[], None]:
    """A function that makes the process calling it get `sig` when `parent` ends, or end now when `parent` has
    already gone: the launcher and the ranks never outlive the job."""
    def arm() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:  # the parent ended before the signal was armed
            os._exit(1)

    return arm
