"""A real, throwaway OpenSSH server on 127.0.0.1, for tests and benchmarks.

Modelled on parallel-ssh's embedded openssh server: `sshd -D` from a config
template, its own host key, a throwaway client key, a free high port, and a
bounded wait for the SSH banner. Nothing here reads the user's ~/.ssh.

The login user
--------------
When we run as root (here and in CI), sshd runs as root and we log in as
`aerie-test`, an alias of root (uid 0, gid 0) whose shell is /bin/sh:
- root's ~/.bashrc is slow (pyenv init) and bash sources it even for
  `ssh host cmd`; /bin/sh sources nothing, so a remote command costs what it
  costs on a clean host;
- as uid 0 it can read everything root can, e.g. the venv's interpreter under
  /root/.pyenv, while its home is a world-readable directory, not /root.
It is created once, idempotently, with a locked password; only keys in this
server's own AuthorizedKeysFile can log in, and only through this server.
When not root, sshd runs unprivileged and the only user it can log in is the
current one (with that user's own shell).
"""

from __future__ import annotations

import os
import pwd
import random
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.process_tree import descendants, process_name

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
TEST_USER = "aerie-test"
TEST_USER_HOME = Path("/var/lib/aerie-test/home")
ADDRESS = "127.0.0.1"
START_TIMEOUT_S = 10.0
# OpenSSH >= 9.8 splits the per-connection process out as sshd-session/sshd-auth.
_SSHD_NAMES = {"sshd", "sshd-session", "sshd-auth"}

SSHD_CONFIG = """\
ListenAddress {address}
Port {port}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowUsers {user}
MaxStartups 100
MaxSessions 100
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
LogLevel {log_level}
Subsystem sftp internal-sftp
{set_env}"""


class SshServerError(RuntimeError):
    pass


@dataclass
class SshServer:
    """One `sshd -D` listening on 127.0.0.1; build it with `start_server`."""

    directory: Path
    """Where its keys, configs, pid file and log live."""
    port: int
    """A free high port on `address`."""
    user: str
    """Who logs in: `aerie-test` (uid 0, shell /bin/sh) as root, else the current user."""
    identity: Path
    """A throwaway ed25519 private key that this server accepts."""
    known_hosts: Path
    """Holds this server's host key as `[127.0.0.1]:PORT ssh-ed25519 ...`."""
    ssh_config: Path
    """An empty client ssh_config, so that the user's ~/.ssh/config is never read."""
    home: Path
    """The login user's home directory (the working directory of remote commands)."""
    host_key_fingerprint: str
    """`SHA256:...`, as `ssh-keygen -lf` prints it."""
    host_public_key: str
    """`ssh-ed25519 AAAA...`, for writing a known_hosts line by hand."""
    environment: dict[str, str] = field(default_factory=dict)
    """Set in every session on this server (sshd's SetEnv)."""
    address: str = ADDRESS
    log_level: str = "ERROR"
    """sshd's LogLevel: INFO logs each accepted connection ("Accepted publickey ...")."""
    cpus: set[int] | None = None
    """Where sshd and its sessions may run; None: anywhere."""
    process: subprocess.Popen | None = None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}"

    @property
    def log(self) -> Path:
        return self.directory / "sshd.log"

    def start(self) -> None:
        """Start sshd and wait until it answers with an SSH banner."""
        config = self.directory / "sshd_config"
        # One line: sshd keeps only the first SetEnv it reads.
        pairs = " ".join(f"{name}={value}" for name, value in self.environment.items())
        set_env = f"SetEnv {pairs}\n" if pairs else ""
        config.write_text(SSHD_CONFIG.format(
            address=self.address, port=self.port, user=self.user, set_env=set_env, log_level=self.log_level,
            host_key=self.directory / "host_key", pid_file=self.directory / "sshd.pid",
            authorized_keys=self.directory / "authorized_keys",
        ))
        self.known_hosts.write_text(f"[{self.address}]:{self.port} {self.host_public_key}\n")
        with self.log.open("wb") as log:
            # -D: stay in the foreground so we own the listener; -e: log to stderr (the log file).
            self.process = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None,  # noqa: PLW1509
            )
        self._wait_for_banner()

    def stop(self) -> None:
        """End every connection, then the listener."""
        if self.process is None:
            return
        self.kill_connections()
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill_connections(self) -> int:
        """SIGKILL the per-connection sshd processes, as a dropped laptop link would end them.

        The listener stays up, and so do the commands those connections started
        (without a tty nothing sends them SIGHUP, just as on a real host).
        Returns how many sshd processes were killed.
        """
        if self.process is None:
            return 0
        victims = [pid for pid in descendants(self.process.pid) if process_name(pid) in _SSHD_NAMES]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(victims)

    def ssh_options(self) -> list[str]:
        """`ssh` and its options, without the destination: hermetic, strict, non-interactive."""
        return [
            "ssh", "-F", str(self.ssh_config), "-i", str(self.identity), "-p", str(self.port),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=5",
        ]

    def ssh_argv(self, *command: str) -> list[str]:
        """An `ssh` command line that runs `command` on this server."""
        return [*self.ssh_options(), self.destination, *command]

    def rsh(self) -> str:
        """The value for `rsync -e`: rsync appends the destination itself."""
        return shlex.join(self.ssh_options())

    def _wait_for_banner(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SshServerError(f"sshd exited with {self.process.returncode} on port {self.port}: {self._log_tail()}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise SshServerError(f"sshd did not answer on {self.address}:{self.port} within {START_TIMEOUT_S:g}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:].strip() or "(no output)"


def start_server(
    directory: Path,
    identity: Path | None = None,
    environment: dict[str, str] | None = None,
    log_level: str = "ERROR",
    cpus: set[int] | None = None,
) -> SshServer:
    """Generate keys and configs under `directory` and start a server there.

    `identity`: a private key to accept instead of a new one, so that a second
    server (with a different host key) accepts the first one's client key.
    `cpus`: the only CPUs the server and every command it runs may use (the benchmarks'
    "host", apart from the "laptop").
    """
    require_openssh()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _keygen(directory / "host_key")
    if identity is None:
        identity = directory / "id_ed25519"
        _keygen(identity)
    (directory / "authorized_keys").write_text(Path(f"{identity}.pub").read_text())
    ssh_config = directory / "ssh_config"
    ssh_config.write_text("# Empty on purpose: tests never read ~/.ssh/config.\n")
    user, home = login_user()
    for attempt in range(3):
        server = SshServer(
            directory=directory, port=free_port(), user=user, identity=identity,
            known_hosts=directory / "known_hosts", ssh_config=ssh_config, home=home,
            host_key_fingerprint=_fingerprint(directory / "host_key.pub"),
            host_public_key=_public_key(directory / "host_key.pub"),
            environment=dict(environment or {}), log_level=log_level, cpus=cpus,
        )
        try:
            server.start()
            return server
        except SshServerError as error:
            # NOTE: free_port() can race with another process taking the port; try a fresh one.
            if "Address already in use" not in str(error) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def require_openssh() -> None:
    """Raise SshServerError naming what is missing and how to install it."""
    if not SSHD.exists():
        raise SshServerError(f"{SSHD} not found: install it with `apt-get install openssh-server`")
    if subprocess.run(["sh", "-c", "command -v ssh && command -v ssh-keygen"], capture_output=True).returncode:
        raise SshServerError("ssh or ssh-keygen not found: install them with `apt-get install openssh-client`")


def login_user() -> tuple[str, Path]:
    """The user the test server logs in, and its home; see the module docstring."""
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return entry.pw_name, Path(entry.pw_dir)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    TEST_USER_HOME.mkdir(parents=True, exist_ok=True)
    TEST_USER_HOME.chmod(0o755)
    if not _user_exists(TEST_USER):
        added = subprocess.run(
            # -p '*': no password, but not locked: without PAM, sshd refuses a locked ("!") account even for keys.
            ["useradd", "-o", "-u", "0", "-g", "0", "-M", "-p", "*", "-d", str(TEST_USER_HOME), "-s", "/bin/sh", TEST_USER],
            capture_output=True, text=True,
        )
        # Another pytest-xdist worker may have added it at the same moment.
        if added.returncode and not _user_exists(TEST_USER):
            raise SshServerError(f"useradd {TEST_USER} failed: {added.stderr.strip()}")
    if _is_locked(TEST_USER):  # made by hand or by an older version of this file
        subprocess.run(["usermod", "-p", "*", TEST_USER], check=True, capture_output=True)
    entry = pwd.getpwnam(TEST_USER)
    if (entry.pw_uid, entry.pw_gid, entry.pw_shell) != (0, 0, "/bin/sh"):
        raise SshServerError(
            f"user {TEST_USER} exists with uid {entry.pw_uid}, gid {entry.pw_gid}, shell {entry.pw_shell}; "
            f"expected 0, 0, /bin/sh: remove it with `userdel -f {TEST_USER}` and rerun"
        )
    return TEST_USER, Path(entry.pw_dir)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now, below the kernel's ephemeral range.

    A port from that range (what `bind(0)` gives) can be handed out again to another test's
    server bound to port 0, or be the local end of a connection, before its user binds it: an
    eval test whose servers come and go on one port found it taken (CI, 4 workers)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for port in random.sample(range(10_000, low), min(100, max(0, low - 10_000))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((ADDRESS, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room below the range
        sock.bind((ADDRESS, 0))
        return sock.getsockname()[1]


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _is_locked(name: str) -> bool:
    for line in Path("/etc/shadow").read_text().splitlines():
        user, password, *_ = line.split(":")
        if user == name:
            return password.startswith("!")
    return False


def _keygen(path: Path) -> None:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", f"aerie-test-{path.name}", "-f", str(path)],
        check=True, capture_output=True,
    )


def _fingerprint(public_key: Path) -> str:
    # "256 SHA256:abc... comment (ED25519)"
    return subprocess.run([SSH_KEYGEN, "-lf", str(public_key)], check=True, capture_output=True, text=True).stdout.split()[1]


def _public_key(public_key: Path) -> str:
    kind, blob, *_comment = public_key.read_text().split()
    return f"{kind} {blob}"


