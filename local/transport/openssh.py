"""One authenticated SSH connection per host, kept open between `inv` commands.

A command as typed pays Python's start-up, then a key exchange and an authentication:
on loopback that second part alone is as long as `ssh host true`, and over a WAN far
longer. OpenSSH's connection sharing (ControlMaster, ControlPersist; SkyPilot works the
same way) keeps one connection open in the background for `host.control_persist`
seconds after its last use, and each later command is a new session on it: a fork of
`ssh`, no handshake, and no paramiko to import.

The first command to a host still connects with paramiko (local/transport/paramiko_ssh.py): its host-key
checks, `inv trust` and one-line errors stay the only way in. Once it is authenticated,
an OpenSSH master is started beside it with the same identity, port, ssh_config and
known_hosts (checked strictly, never prompting), so the next command finds it. The
sockets live in a directory only this user can open.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from local.exceptions import AerieError
from local.transport.process import Result, run_process
from local.transport.ssh_checks import known_hosts, refuse_non_loopback
from remote.vocabulary import hints

if TYPE_CHECKING:
    from local.inventory.values import Host

#: ssh's own exit code when the connection (not the remote command) failed.
SSH_FAILED = 255


def control_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "aerie" / "ssh"


class Multiplexed:
    """A host's commands over its shared OpenSSH connection while one is open, else over paramiko."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.name = host.address or "?"
        self._direct: Any = None  # local.transport.paramiko_ssh.SshTransport, once a command needed it
        self._masters: list[subprocess.Popen[bytes]] = []
        self.socket = control_dir() / _key(host)

    @property
    def shares(self) -> bool:
        import shutil  # here: a command on an open connection needs no search of PATH

        return self.host.control_persist > 0 and shutil.which("ssh") is not None

    @property
    def is_dropped(self) -> bool:
        return self._direct is not None and self._direct.is_dropped

    def run(self, command: str, stdin: bytes | None = None, stream: BinaryIO | None = None) -> Result:
        # A master that answers was started by an `ssh` found on PATH: no need to look again.
        if self._direct is None and self.host.control_persist > 0 and self._master_alive():
            return self._shared(command, stdin, stream)
        return self._paramiko().run(command, stdin, stream)

    def _shared(self, command: str, stdin: bytes | None, stream: BinaryIO | None) -> Result:
        assert self.host.address is not None
        refuse_non_loopback(self.host.address)
        result = run_process([*self.options(), "-o", "ControlMaster=no", "-T", self.host.address, command], stdin, stream)
        if result.exit_code == SSH_FAILED:  # aerie's remote commands never exit 255: ssh itself failed
            detail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no reason given"
            raise AerieError(f"{self.name}: the SSH connection was lost ({detail}); "
                             f"jobs on the host keep running: {hints.inv('status')} reconnects")
        return result

    def _paramiko(self) -> Any:
        if self._direct is None:
            from local.transport.paramiko_ssh import SshTransport  # here: paramiko is the slow part of a command's start-up

            self._direct = SshTransport(self.host)
            self._direct.connection()  # authenticated, its key checked: now OpenSSH may keep one open
            if self.shares:
                self._start_master()
        return self._direct

    def options(self) -> list[str]:
        """`ssh` with the inventory's view of the host, strict and never asking anything."""
        host = self.host
        argv = ["ssh", "-o", f"ControlPath={self.socket}", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts(host)}",
                "-o", f"ConnectTimeout={max(1, round(host.connect_timeout))}",
                "-o", f"ServerAliveInterval={host.keepalive}", "-o", "ServerAliveCountMax=2"]
        if host.ssh_config:
            argv += ["-F", "/dev/null" if host.ssh_config == "none" else str(Path(host.ssh_config).expanduser())]
        if host.port:
            argv += ["-p", str(host.port)]
        if host.user:
            argv += ["-l", host.user]
        if host.identity:
            argv += ["-i", str(Path(host.identity).expanduser())]
        return argv

    def _start_master(self) -> None:
        """In the background, not waited for: `auto` makes it the master unless another
        command's master won the race, and ControlPersist keeps it after `true` ends."""
        assert self.host.address is not None
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.socket.parent, 0o700)
        persist = f"ControlPersist={max(1, round(self.host.control_persist))}"
        argv = [*self.options(), "-o", "ControlMaster=auto", "-o", persist, self.host.address, "true"]
        self._masters.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True))

    def _master_alive(self) -> bool:
        """A socket that accepts: a master listens. A stale one (its master killed) is removed."""
        if accepts(self.socket):
            return True
        self.socket.unlink(missing_ok=True)
        return False

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        for master in self._masters:
            master.poll()  # reaped if its `true` has ended; the master itself lives on, detached


def accepts(path: Path) -> bool:
    """Whether something listens on the Unix socket `path` (a connect, nothing said)."""
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _key(host: Host) -> str:
    """The socket's name: everything that decides which server, as whom, with which keys. The
    contents of known_hosts and ssh_config are part of it, so that a key removed, replaced or
    trusted, or a changed ProxyJump, is checked afresh on a new connection, not bypassed."""
    files = [known_hosts(host)]
    if host.ssh_config != "none":
        files.append(Path(host.ssh_config or "~/.ssh/config").expanduser())
    digest = hashlib.sha256(json.dumps([host.address, host.port, host.user, host.identity, host.ssh_config,
                                        [str(f) for f in files]]).encode())
    for path in files:
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"\0missing")
    return digest.hexdigest()[:20]
