"""`inv trust`: look at a host's key, and add it to known_hosts only when the user says so."""

from __future__ import annotations

import os
from pathlib import Path

import paramiko

from local.exceptions import AerieError
from local.transport.paramiko_ssh import SshTransport, ssh_socket


def known_hosts_name(address: str, port: int) -> str:
    """The name OpenSSH and paramiko look up: `[addr]:port` unless the port is 22."""
    return address if port == 22 else f"[{address}]:{port}"


def scan(transport: SshTransport) -> tuple[str, paramiko.PKey]:
    """The host's key, read from the SSH handshake; nothing is authenticated or trusted."""
    connection = transport.connection_unopened()
    address, port = connection.host, connection.port
    sock = ssh_socket(address, port, transport.host.connect_timeout)
    session = paramiko.Transport(sock)
    try:
        session.start_client(timeout=transport.host.connect_timeout)
        return known_hosts_name(address, port), session.get_remote_server_key()
    except paramiko.SSHException as exc:
        raise AerieError(f"{address}:{port}: SSH handshake failed: {exc}")
    finally:
        session.close()


def add(known_hosts: Path, name: str, key: paramiko.PKey) -> int:
    """Write `name`'s key, through a temporary file and a rename; the number of lines it replaced.

    A line for `name` with a key of the same type is a changed key: it is replaced, not left
    first in the file (where it would win over an appended line for ever). Other lines stay.
    """
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = known_hosts.read_text().splitlines() if known_hosts.exists() else []
    kept, replaced = [], 0
    for line in lines:
        entry = _entry(line)
        if entry is None or entry.key.get_name() != key.get_name() or not any(_names(h, name) for h in entry.hostnames):
            kept.append(line)
            continue
        replaced += 1
        others = [h for h in entry.hostnames if not _names(h, name)]
        if others:  # a line for several names keeps the others
            kept.append(" ".join([",".join(others), *line.split()[1:]]))
    kept.append(f"{name} {key.get_name()} {key.get_base64()}")
    temporary = known_hosts.with_name(f".{known_hosts.name}.aerie.{os.getpid()}.tmp")
    temporary.write_text("\n".join(kept) + "\n")
    os.chmod(temporary, 0o600)
    os.replace(temporary, known_hosts)
    return replaced


def changed(known_hosts: Path, name: str, key: paramiko.PKey) -> paramiko.PKey | None:
    """The other key of the same type that known_hosts holds for `name` (the host key changed), if any."""
    if not known_hosts.exists():
        return None
    old = (paramiko.HostKeys(str(known_hosts)).lookup(name) or {}).get(key.get_name())
    return old if old is not None and old != key else None


def _entry(line: str) -> paramiko.hostkeys.HostKeyEntry | None:
    if not line.strip() or line.lstrip().startswith(("#", "@")):
        return None
    try:
        return paramiko.hostkeys.HostKeyEntry.from_line(line)
    except (paramiko.SSHException, ValueError, IndexError):
        return None


def _names(pattern: str, name: str) -> bool:
    """Whether a known_hosts host field names `name`, hashed (|1|salt|hash) or not."""
    if pattern.startswith("|1|"):
        return paramiko.HostKeys.hash_host(name, pattern) == pattern
    return pattern == name


def is_known(known_hosts: Path, name: str, key: paramiko.PKey) -> bool:
    if not known_hosts.exists():
        return False
    entries = paramiko.HostKeys(str(known_hosts)).lookup(name) or {}
    return entries.get(key.get_name()) == key
