"""`inv trust`: look at a host's key, and add it to known_hosts only when the user says so."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import paramiko

from local.errors import AerieError
from local.transport import SshTransport


def known_hosts_name(address: str, port: int) -> str:
    """The name OpenSSH and paramiko look up: `[addr]:port` unless the port is 22."""
    return address if port == 22 else f"[{address}]:{port}"


def scan(transport: SshTransport) -> tuple[str, paramiko.PKey]:
    """The host's key, read from the SSH handshake; nothing is authenticated or trusted."""
    connection = transport.connection_unopened()
    address, port = connection.host, connection.port
    try:
        sock = socket.create_connection((address, port), timeout=transport.host.connect_timeout)
    except OSError as exc:
        raise AerieError(f"{address}:{port}: cannot connect to read its host key: {exc}")
    session = paramiko.Transport(sock)
    try:
        session.start_client(timeout=transport.host.connect_timeout)
        return known_hosts_name(address, port), session.get_remote_server_key()
    except paramiko.SSHException as exc:
        raise AerieError(f"{address}:{port}: SSH handshake failed: {exc}")
    finally:
        session.close()


def add(known_hosts: Path, name: str, key: paramiko.PKey) -> None:
    """Append one line, through a temporary file and a rename."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    existing = known_hosts.read_text() if known_hosts.exists() else ""
    if existing and not existing.endswith("\n"):
        existing += "\n"
    temporary = known_hosts.with_name(f".{known_hosts.name}.aerie.tmp")
    temporary.write_text(f"{existing}{name} {key.get_name()} {key.get_base64()}\n")
    os.chmod(temporary, 0o600)
    os.replace(temporary, known_hosts)


def is_known(known_hosts: Path, name: str, key: paramiko.PKey) -> bool:
    if not known_hosts.exists():
        return False
    entries = paramiko.HostKeys(str(known_hosts)).lookup(name) or {}
    return entries.get(key.get_name()) == key
