"""The benchmarks' delayed link (`benchmarks.link`): bytes arrive whole, in order, and no sooner than the round trip."""

from __future__ import annotations

import os
import socket
import threading
import time

from benchmarks.link import DelayedLink


def echo_server() -> socket.socket:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_bytes_come_back_whole_in_order_after_the_round_trip() -> None:
    server = echo_server()
    sent = os.urandom(1 << 20)
    with DelayedLink(server.getsockname()[1], rtt=0.2) as link, socket.create_connection(("127.0.0.1", link.port)) as sock:
        started = time.monotonic()
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        round_trip = time.monotonic() - started
        threading.Thread(target=sock.sendall, args=(sent,), daemon=True).start()
        received = bytearray()
        while len(received) < len(sent):
            received += sock.recv(65536)
    assert round_trip >= 0.2  # a floor the link guarantees, however loaded the machine
    assert bytes(received) == sent
    server.close()
