"""The loopback OpenSSH server the end-to-end tests and benchmarks stand on."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest
from fabric import Config, Connection

from benchmarks.harness.sshd import SshServer, free_port

pytestmark = pytest.mark.e2e  # a real sshd: not the unit tier


def _ssh(server: SshServer, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(server.ssh_argv(*command), capture_output=True, text=True, timeout=30)


def test_server_accepts_its_key_and_runs_commands_in_a_plain_shell(sshd: SshServer) -> None:
    done = _ssh(sshd, 'echo "$SHELL"; id -u; pwd')
    assert done.returncode == 0, done.stderr
    shell, uid, cwd = done.stdout.splitlines()
    assert shell == "/bin/sh"
    assert cwd == str(sshd.home)
    assert uid == str(os.getuid())
    assert done.stderr == ""  # nothing sourced, nothing printed


def test_server_rejects_an_unknown_key(sshd: SshServer, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    argv = sshd.ssh_argv("true")
    argv[argv.index(str(sshd.identity))] = str(stranger)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert "Permission denied (publickey)" in done.stderr


def test_known_hosts_and_fingerprint_name_the_key_the_server_shows(sshd: SshServer) -> None:
    transport = paramiko.Transport((sshd.address, sshd.port))
    try:
        transport.start_client(timeout=5)
        shown = transport.get_remote_server_key()
    finally:
        transport.close()
    assert shown.fingerprint == sshd.host_key_fingerprint
    assert sshd.known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} ssh-ed25519 {shown.get_base64()}\n"


def test_fabric_connects_with_the_fixture_files_and_nothing_else(sshd: SshServer) -> None:
    connection = Connection(
        sshd.address, user=sshd.user, port=sshd.port,
        config=Config(runtime_ssh_path=str(sshd.ssh_config)),
        connect_kwargs={"key_filename": [str(sshd.identity)], "allow_agent": False, "look_for_keys": False},
    )
    connection.client.load_host_keys(str(sshd.known_hosts))
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with connection:
        assert connection.run("echo $SHELL", hide=True, in_stream=False).stdout == "/bin/sh\n"


def test_a_server_with_another_host_key_is_refused(
    sshd: SshServer, ssh_server_factory: Callable[..., SshServer]
) -> None:
    other = ssh_server_factory(identity=sshd.identity)
    assert other.host_key_fingerprint != sshd.host_key_fingerprint
    assert _ssh(other, "true").returncode == 0
    other.known_hosts.write_text(f"[127.0.0.1]:{other.port} {sshd.host_public_key}\n")  # a changed key
    done = _ssh(other, "true")
    assert done.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr
    other.known_hosts.write_text("")  # an unknown key
    done = _ssh(other, "true")
    assert done.returncode == 255
    assert "Host key verification failed" in done.stderr


def test_kill_connections_drops_sessions_but_keeps_the_listener(sshd: SshServer) -> None:
    client = subprocess.Popen(sshd.ssh_argv("echo $$; exec sleep 60"), stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    remote_pid = int(client.stdout.readline())
    try:
        assert sshd.kill_connections() >= 1
        assert client.wait(timeout=10) == 255
        assert _ssh(sshd, "true").returncode == 0
        os.kill(remote_pid, 0)  # like a real host, the dropped session's command lives on
    finally:
        os.kill(remote_pid, 9)
        client.wait(timeout=10)


def test_a_closed_port_is_refused_at_once(sshd: SshServer, free_port: int) -> None:
    argv = sshd.ssh_argv("true")
    argv[argv.index("-p") + 1] = str(free_port)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert "Connection refused" in done.stderr
    assert time.monotonic() - started < 2


def test_free_ports_are_below_the_ephemeral_range_and_free() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert port < low  # never one that bind(0) could hand another test meanwhile
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
