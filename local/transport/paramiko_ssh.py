"""The first connection to a host: paramiko through Fabric, with its host-key checks and one-line errors.

Imported only when a command has no shared OpenSSH connection to use (local/transport/openssh.py):
paramiko and its cryptography cost more to import than a multiplexed command takes.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import paramiko
from fabric import Config, Connection

from local.exceptions import AerieError
from local.transport.process import Result
from local.transport.ssh_checks import known_hosts, refuse_non_loopback
from remote.vocabulary import hints

if TYPE_CHECKING:
    from local.inventory.values import Host


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """No silent trust: an unknown key ends the connection, carrying the key for `inv trust`."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class SshTransport:
    """The `ssh` backend: one Fabric connection per `inv` run, opened on first use."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.name = host.address or "?"
        self._connection: Connection | None = None

    @property
    def known_hosts(self) -> Path:
        return known_hosts(self.host)

    def connection(self) -> Connection:
        if self._connection is None:
            self._connection = self._open()
        return self._connection

    @property
    def is_dropped(self) -> bool:
        """Opened once and lost since: to be replaced rather than reused (local/transport/shared.py)."""
        return self._connection is not None and not self._connection.is_connected

    def _fabric_config(self) -> Config:
        ssh_config = self.host.ssh_config
        if ssh_config == "none":
            return Config(overrides={"load_ssh_configs": False})
        return Config(runtime_ssh_path=str(Path(ssh_config).expanduser())) if ssh_config else Config()

    def connection_unopened(self) -> Connection:
        """A Connection with host, port and user resolved through ssh_config, not yet opened."""
        assert self.host.address is not None
        connection = Connection(
            self.host.address,
            user=self.host.user,
            port=self.host.port,
            config=self._fabric_config(),
            connect_timeout=self.host.connect_timeout,
            connect_kwargs={
                "banner_timeout": self.host.connect_timeout,
                "auth_timeout": self.host.connect_timeout,
                **({"key_filename": [str(Path(self.host.identity).expanduser())]} if self.host.identity else {}),
            },
        )
        refuse_non_loopback(connection.host)
        return connection

    def _open(self) -> Connection:
        connection = self.connection_unopened()
        hop: Connection | None = connection
        while isinstance(hop, Connection):  # ProxyJump hops check their keys too
            hop.client.set_missing_host_key_policy(_RefuseUnknown())
            if self.known_hosts.exists():
                hop.client.load_host_keys(str(self.known_hosts))
            hop = hop.gateway if isinstance(hop.gateway, Connection) else None
        try:
            if connection.gateway is None:  # a direct connection: see that SSH answers before paramiko waits on it
                connection.connect_kwargs["sock"] = ssh_socket(connection.host, connection.port, self.host.connect_timeout)
            connection.open()
        except AerieError:
            raise
        except Exception as exc:  # paramiko and socket errors become one line
            raise AerieError(self._explain(connection, exc)) from None
        connection.transport.set_keepalive(self.host.keepalive)
        return connection

    def _explain(self, connection: Connection, exc: Exception) -> str:
        where = f"{connection.user}@{connection.host}:{connection.port}"
        if isinstance(exc, UnknownHostKey):  # named as known_hosts names it: a ProxyJump hop may be the one
            return (f"{exc.hostname}: host key {exc.key.get_name()} {exc.key.fingerprint} is not in {self.known_hosts}: "
                    f"check it with the host's admin, then run {hints.inv('trust')} to add it")
        if isinstance(exc, paramiko.BadHostKeyException):
            return (f"{exc.hostname}: host key CHANGED ({exc.key.fingerprint}, expected {exc.expected_key.fingerprint}): "
                    f"if the host was rebuilt, remove its line from {self.known_hosts} and run {hints.inv('trust')}")
        if isinstance(exc, paramiko.AuthenticationException):
            return f"{where}: authentication failed: check host.user and host.identity in the inventory"
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return f"{where}: no answer within {self.host.connect_timeout:g}s: check host.address, host.port and the network"
        if isinstance(exc, ConnectionRefusedError) or "Unable to connect" in str(exc):
            return f"{where}: connection refused: is sshd running there and is host.port right?"
        return f"{where}: cannot connect: {exc}"

    def run(self, command: str, stdin: bytes | None = None, stream: BinaryIO | None = None) -> Result:
        try:
            return self._run(command, stdin, stream)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise AerieError(f"{self.name}: the SSH connection was lost ({exc or type(exc).__name__}); "
                             f"jobs on the host keep running: {hints.inv('status')} reconnects") from None

    def _run(self, command: str, stdin: bytes | None, stream: BinaryIO | None) -> Result:
        # A bare channel rather than Connection.run: binary stdin and no per-command overhead.
        channel = self.connection().transport.open_session()
        try:
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            stdout = _drain(channel, stream)
            stderr = channel.makefile_stderr("rb").read()
            return Result(channel.recv_exit_status(), stdout.decode(errors="replace"), stderr.decode(errors="replace"))
        finally:
            channel.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


def ssh_socket(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection on which an SSH server has begun to speak; else one line saying why not.

    An SSH server sends its banner first, so waiting for its first byte tells a silent port
    (a firewall's tarpit, a service that is not sshd) from a slow handshake, in the user's
    own time limit, where paramiko would answer "No existing session" or a traceback.
    """
    refuse_non_loopback(address)
    where = f"{address}:{port}"
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except (socket.timeout, TimeoutError):
        raise AerieError(f"{where}: no answer within {timeout:g}s: check host.address, host.port and the network") from None
    except ConnectionRefusedError:
        raise AerieError(f"{where}: connection refused: is sshd running there and is host.port right?") from None
    except OSError as exc:
        raise AerieError(f"{where}: cannot connect: {exc.strerror or exc}") from None
    try:
        first = sock.recv(1, socket.MSG_PEEK)
    except (socket.timeout, TimeoutError):
        sock.close()
        raise AerieError(f"{where}: no SSH answer within {timeout:g}s: the port accepts connections "
                         "but nothing there speaks SSH (check host.port)") from None
    except OSError as exc:
        sock.close()
        raise AerieError(f"{where}: the connection was closed before SSH answered: {exc.strerror or exc}") from None
    if not first:
        sock.close()
        raise AerieError(f"{where}: the connection was closed before SSH answered (check host.port)")
    return sock


def _drain(channel: paramiko.Channel, stream: BinaryIO | None) -> bytes:
    chunks = []
    for chunk in iter(lambda: channel.recv(65536), b""):
        if stream is None:
            chunks.append(chunk)
        else:
            stream.write(chunk)
            stream.flush()
    return b"".join(chunks)
