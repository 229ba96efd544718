"""A TCP link with a round-trip time, for timing commands as they run against a host that is not loopback.

`DelayedLink(port, rtt)` listens on 127.0.0.1 and forwards each connection to
`port` there, holding every chunk of bytes for half the round trip in each
direction, in order. An SSH handshake's exchanges (key exchange, auth, channel
open) each pay the round trip, as over a network; the TCP handshake to the
link itself does not, so a baseline of `ssh host true` comes out a round trip
short -- against aerie, not for it.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from types import TracebackType


class DelayedLink:
    def __init__(self, port: int, rtt: float) -> None:
        self.target, self.delay = port, rtt / 2
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ended = threading.Semaphore(0)  # one release per direction that has ended
            self._pipe(client, server, ended)
            self._pipe(server, client, ended)
            threading.Thread(target=self._close_after, args=(ended, client, server), daemon=True).start()

    @staticmethod
    def _close_after(ended: threading.Semaphore, *sockets: socket.socket) -> None:
        for _ in range(2):
            ended.acquire()
        for sock in sockets:
            sock.close()

    def _pipe(self, source: socket.socket, sink: socket.socket, ended: threading.Semaphore) -> None:
        """Bytes from `source` reach `sink` `delay` seconds after they arrived, in order."""
        held: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def read() -> None:
            while True:
                try:
                    data = source.recv(65536)
                except OSError:
                    data = b""
                held.put((time.monotonic() + self.delay, data))
                if not data:
                    return

        def write() -> None:
            try:
                while True:
                    due, data = held.get()
                    time.sleep(max(0.0, due - time.monotonic()))
                    if not data:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(data)
            except OSError:
                return
            finally:
                ended.release()

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> DelayedLink:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
