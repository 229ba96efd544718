"""Reaching the host over SSH: keys are checked, failures are quick and said in one line."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from benchmarks.harness.checkout import Bench

pytestmark = [pytest.mark.e2e, pytest.mark.backends("ssh")]


def test_an_unknown_host_key_is_refused_until_trusted_by_fingerprint(bench: Bench, ssh_server_factory) -> None:  # noqa: ANN001
    assert bench.sshd is not None
    other = ssh_server_factory(identity=bench.sshd.identity)  # accepts our key, has its own host key
    bench.sshd = other
    bench.scripted({"A": "records=1"})
    known_hosts = Path(bench.checkout / "known_hosts")
    known_hosts.write_text("")
    inventory = bench.checkout / "inventories" / "test.yaml"
    inventory.write_text(inventory.read_text().replace(str(other.known_hosts), str(known_hosts)))

    refused = bench.inv("deploy", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"host key ssh-ed25519 {other.host_key_fingerprint} is not in {known_hosts}" in refused.stderr
    assert "inv trust" in refused.stderr
    assert not bench.root.exists()

    wrong = bench.inv("trust", "--fingerprint", "SHA256:not-this-one", check=False)
    assert wrong.returncode == 2 and "not trusted" in wrong.stderr and known_hosts.read_text() == ""
    no_tty = bench.inv("trust", check=False)
    assert no_tty.returncode == 2 and "--fingerprint" in no_tty.stderr

    trusted = bench.inv("trust", "--fingerprint", other.host_key_fingerprint)
    assert f"[127.0.0.1]:{other.port} ssh-ed25519" in known_hosts.read_text()
    assert "Added" in trusted.stdout
    assert "Deployed release" in bench.inv("deploy").stdout
    assert "Already trusted" in bench.inv("trust", "--yes").stdout


def test_a_changed_host_key_is_refused_and_named(bench: Bench, ssh_server_factory) -> None:  # noqa: ANN001
    assert bench.sshd is not None
    impostor = ssh_server_factory(identity=bench.sshd.identity)
    bench.scripted({"A": "records=1"})
    inventory = bench.checkout / "inventories" / "test.yaml"
    # The known_hosts file names the first server's key for the impostor's address and port.
    known_hosts = bench.checkout / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{impostor.port} {bench.sshd.host_public_key}\n")
    text = inventory.read_text().replace(str(bench.sshd.known_hosts), str(known_hosts))
    inventory.write_text(text.replace(f"port: {bench.sshd.port}", f"port: {impostor.port}"))
    refused = bench.inv("status", check=False)
    assert refused.returncode == 2
    assert "host key CHANGED" in refused.stderr and impostor.host_key_fingerprint in refused.stderr

    # Trusting the new key (the host was rebuilt) replaces the old line: an appended one would never win.
    trusted = bench.inv("trust", "--fingerprint", impostor.host_key_fingerprint)
    assert "CHANGED" in trusted.stdout and "Replaced the changed key" in trusted.stdout
    lines = known_hosts.read_text().splitlines()
    assert len(lines) == 1 and lines[0].split()[:3] == [f"[127.0.0.1]:{impostor.port}", *impostor.host_public_key.split()[:2]]
    assert bench.inv("status").returncode == 0


def test_a_port_that_never_speaks_ssh_fails_in_the_time_limit_with_one_line(bench: Bench) -> None:
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel does) and never says a word
    try:
        bench.scripted({"A": "records=1"})
        inventory = bench.checkout / "inventories" / "test.yaml"
        assert bench.sshd is not None
        port = silent.getsockname()[1]
        inventory.write_text(inventory.read_text().replace(f"port: {bench.sshd.port}", f"port: {port}"))
        for task in ("status", "trust"):
            done = bench.inv(task, check=False)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            assert done.stderr.strip().splitlines() == [f"aerie: 127.0.0.1:{port}: no SSH answer within 5s: the port "
                                                        "accepts connections but nothing there speaks SSH (check host.port)"]
    finally:
        silent.close()


def test_a_closed_port_fails_at_once_with_a_clear_message(bench: Bench, free_port: int) -> None:
    bench.scripted({"A": "records=1"})
    inventory = bench.checkout / "inventories" / "test.yaml"
    assert bench.sshd is not None
    inventory.write_text(inventory.read_text().replace(f"port: {bench.sshd.port}", f"port: {free_port}"))
    started = time.monotonic()
    done = bench.inv("status", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"127.0.0.1:{free_port}: connection refused" in done.stderr
    assert time.monotonic() - started < 10  # connect_timeout is 5 s; refusal must not wait for it


def test_a_wrong_identity_is_an_authentication_error(bench: Bench, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    bench.scripted({"A": "records=1"})
    inventory = bench.checkout / "inventories" / "test.yaml"
    assert bench.sshd is not None
    inventory.write_text(inventory.read_text().replace(str(bench.sshd.identity), str(stranger)))
    done = bench.inv("status", check=False)
    assert done.returncode == 2 and "authentication failed" in done.stderr


def test_tests_refuse_any_host_outside_loopback(bench: Bench) -> None:
    done = bench.inv("status", "-i", "gpu", check=False)
    assert done.returncode == 2
    assert "refusing to connect to 10.1.230.174" in done.stderr


def test_ssh_config_aliases_identity_and_proxyjump_are_honoured(bench: Bench, ssh_server_factory) -> None:  # noqa: ANN001
    assert bench.sshd is not None
    jump, target = bench.sshd, ssh_server_factory(identity=bench.sshd.identity)
    config = bench.checkout / "ssh_config"
    config.write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {jump.port}\n  User {jump.user}\n  IdentityFile {jump.identity}\n"
        f"Host gpubox\n  HostName 127.0.0.1\n  Port {target.port}\n  User {target.user}\n"
        f"  IdentityFile {target.identity}\n  ProxyJump jumpbox\n")
    known_hosts = bench.checkout / "known_hosts"
    known_hosts.write_text(jump.known_hosts.read_text() + target.known_hosts.read_text())
    bench.scripted({"A": "records=1"})
    inventory = bench.checkout / "inventories" / "test.yaml"
    document = yaml.safe_load(inventory.read_text())
    document["host"] = {"address": "gpubox", "ssh_config": str(config), "known_hosts": str(known_hosts),
                        "root": str(bench.root), "python": bench.python, "connect_timeout": 5}
    inventory.write_text(yaml.safe_dump(document))
    assert "Deployed release" in bench.inv("deploy").stdout
    assert (bench.root / "current").exists()

    known_hosts.write_text(target.known_hosts.read_text())  # the jump host's key is no longer known
    refused = bench.inv("status", check=False)
    assert refused.returncode == 2 and f"[127.0.0.1]:{jump.port}" in refused.stderr and "inv trust" in refused.stderr
