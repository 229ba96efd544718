"""One SSH connection kept between `inv` commands (local/transport/openssh.py), against a real sshd and OpenSSH client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from local.inventory.schema import load
from local.transport.openssh import Multiplexed
from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from benchmarks.harness.sshd import SshServer, start_server

pytestmark = pytest.mark.e2e


@pytest.fixture
def logged(tmp_path: Path, hermetic_environment: dict[str, str]) -> Iterator[SshServer]:
    """A server of its own that logs every authenticated connection, so they can be counted."""
    server = start_server(tmp_path / "sshd", environment=hermetic_environment, log_level="INFO")
    yield server
    server.stop()


def accepted(server: SshServer) -> int:
    return server.log.read_text().count("Accepted publickey")


def shared_socket(bench: Bench) -> Path:
    return Multiplexed(load(str(bench.checkout / "inventories" / "test.yaml")).host).socket


def typed(bench: Bench, *args: str) -> subprocess.CompletedProcess[str]:
    """`inv ARGS -i test` with Python's import log on stderr: which modules the command loaded."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "invoke", *args, "-i", "test"],
                          cwd=bench.checkout, capture_output=True, text=True, timeout=120, env=env)


def imported(log: str) -> set[str]:
    """The top-level packages named in `python -X importtime`'s log."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in log.splitlines() if line.startswith("import time:")}


def test_later_commands_ride_the_first_ones_connection_without_a_handshake_or_paramiko(
        tmp_path: Path, logged: SshServer) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "ssh", logged)
    bench.scripted({"A": "records=2"})
    bench.inv("deploy")  # paramiko, then a master started beside it
    socket = shared_socket(bench)
    wait_for(socket.exists, 20, "the shared connection's socket")
    assert oct(socket.parent.stat().st_mode & 0o777) == "0o700"

    before = accepted(logged)
    launch = typed(bench, "launch", "--stage", "prep")
    assert launch.returncode == 0 and "launched A/prep" in launch.stdout, launch.stderr
    bench.wait_state("A/prep", {"succeeded"})
    status = typed(bench, "status")
    assert status.returncode == 0, status.stderr
    assert "A " in status.stdout and "succeeded" in status.stdout
    for command in (launch, status):  # neither SSH library nor the inventory's schema is loaded
        assert not {"paramiko", "fabric", "pydantic"} & imported(command.stderr)
    assert accepted(logged) == before  # three commands, no new connection

    # The connection dies (a laptop's network drops): the next command connects again, then shares again.
    assert logged.kill_connections() >= 1
    again = bench.inv("status")
    assert "succeeded" in again.stdout
    # paramiko's connection and the new shared one; the master is started beside the command and not
    # waited for, so it may connect after the command has ended (CI: 3 == 2 + 2 when asserted at once).
    wait_for(lambda: accepted(logged) == before + 2 and socket.exists(), 20, "the new shared connection")
    bench.inv("status")
    assert accepted(logged) == before + 2


def test_control_persist_zero_keeps_nothing_open(tmp_path: Path, logged: SshServer) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "ssh", logged,
                  host_settings={"control_persist": 0})
    bench.scripted({"A": "records=1"})
    bench.inv("deploy")
    before = accepted(logged)
    for _ in range(2):
        assert bench.inv("status").returncode == 0
    assert not shared_socket(bench).exists()
    assert accepted(logged) == before + 2  # a connection of its own for each command


def test_trusting_or_removing_a_key_is_checked_on_a_new_connection_not_bypassed(bench_ssh: Bench) -> None:
    """The shared connection is keyed by known_hosts' contents: an edited file never rides an old connection."""
    bench = bench_ssh
    bench.scripted({"A": "records=1"})
    bench.inv("deploy")
    socket = shared_socket(bench)
    wait_for(socket.exists, 20, "the shared connection's socket")
    known_hosts = Path(load(str(bench.checkout / "inventories" / "test.yaml")).host.known_hosts or "")
    assert known_hosts.parent == bench.checkout.parent  # this test's copy, never the session server's
    known_hosts.write_text("")  # the user withdraws trust in the host
    assert shared_socket(bench) != socket
    refused = bench.inv("status", check=False)
    assert refused.returncode == 2 and "is not in" in refused.stderr and "inv trust" in refused.stderr


@pytest.fixture
def bench_ssh(tmp_path: Path, sshd: SshServer) -> Bench:
    """A bench whose known_hosts is its own copy, so that editing it touches no other test."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sshd.known_hosts.read_text())
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "ssh", sshd,
                  host_settings={"known_hosts": str(known_hosts)})
    return bench


def test_the_ssh_command_line_carries_the_inventory_s_view_of_the_host(tmp_path: Path) -> None:
    from local.inventory.values import Host

    host = Host(address="gpubox", port=2222, user="root", identity="~/keys/id", known_hosts=str(tmp_path / "kh"),
                ssh_config="none", root="/r", connect_timeout=7.4, keepalive=9)
    argv = Multiplexed(host).options()
    pairs = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("-")}
    options = {value.split("=", 1)[0]: value.split("=", 1)[1] for key, value in zip(argv, argv[1:]) if key == "-o"}
    assert pairs["-F"] == "/dev/null" and pairs["-p"] == "2222" and pairs["-l"] == "root"
    assert pairs["-i"] == str(Path("~/keys/id").expanduser())
    assert options["StrictHostKeyChecking"] == "yes" and options["BatchMode"] == "yes"
    assert options["UserKnownHostsFile"] == str(tmp_path / "kh") and options["ConnectTimeout"] == "7"
    assert options["ControlPath"] == str(Multiplexed(host).socket)
    other = Host(address="gpubox", port=2223, user="root", identity="~/keys/id", known_hosts=str(tmp_path / "kh"),
                 ssh_config="none", root="/r")
    assert Multiplexed(other).socket != Multiplexed(host).socket
