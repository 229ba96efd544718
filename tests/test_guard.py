"""The guards that keep the test suite on loopback, in this process, its subprocesses and on the test sshd."""

from __future__ import annotations

import os
import pwd
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_socket

from benchmarks.harness.sshd import SshServer

LOOPBACK_ONLY_ENV = "AERIE_TEST_ONLY_LOOPBACK"  # honoured by local/transport/ssh_checks.py
# Reserved for nobody in particular; if a guard were missing, the precondition checks
# below stop the test before it sends anything here.
OUTSIDE = ("10.255.255.1", 9)

# Run in a subprocess: prove the guard is installed before trying, then try.
PROBE = f"""
import socket, sys
if socket.socket.connect.__name__ != "_guarded_connect":
    sys.exit("no guard in this interpreter")
try:
    socket.create_connection({OUTSIDE!r}, timeout=1)
except OSError as blocked:
    print(blocked)
    sys.exit(0)
sys.exit("connected")
"""

BLOCKED_WARNING = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket.connect")


def _assert_guarded() -> None:
    assert socket.socket.connect is not pytest_socket._true_connect, "pytest-socket is not guarding connect()"


@BLOCKED_WARNING
def test_connecting_outside_loopback_fails_before_any_packet_leaves() -> None:
    _assert_guarded()
    started = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(pytest_socket.SocketConnectBlockedError, match="10.255.255.1"):
            sock.connect(OUTSIDE)
    assert time.monotonic() - started < 0.5


@BLOCKED_WARNING
def test_creating_a_connection_outside_loopback_fails() -> None:
    _assert_guarded()
    with pytest.raises(pytest_socket.SocketConnectBlockedError):
        socket.create_connection(OUTSIDE, timeout=1)


def test_connecting_to_loopback_works() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()[:2], timeout=1) as client:
            peer, _ = server.accept()
            with peer:
                client.sendall(b"ping")
                assert peer.recv(4) == b"ping"


def test_connecting_to_a_unix_socket_works(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(path)
        server.listen()
        client.connect(path)
        peer, _ = server.accept()
        with peer:
            client.sendall(b"ping")
            assert peer.recv(4) == b"ping"


def test_python_subprocesses_cannot_connect_outside_loopback() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "aerie tests reach loopback only, not 10.255.255.1" in done.stdout


def test_python_subprocesses_cannot_resolve_outside_names() -> None:
    probe = "import socket\ntry:\n    socket.getaddrinfo('example.com', 443)\nexcept socket.gaierror as e:\n    print(e)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert "aerie tests resolve loopback names only, not example.com" in done.stdout, done.stderr


def test_sessions_on_the_test_sshd_are_guarded_too(sshd: SshServer) -> None:
    done = subprocess.run(
        sshd.ssh_argv(sys.executable, "-c", shlex.quote(PROBE), ";", "echo", f"${LOOPBACK_ONLY_ENV}"),
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[Errno 101] aerie tests reach loopback only, not 10.255.255.1", "1"]


def test_the_environment_is_loopback_only_and_blind_to_the_users_home() -> None:
    assert os.environ[LOOPBACK_ONLY_ENV] == "1"
    assert "SSH_AUTH_SOCK" not in os.environ
    assert not any(os.environ.get(name) for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"))
    home = Path.home()
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert not (home / ".ssh" / "config").exists()
    assert not (home / ".ssh" / "known_hosts").exists()
