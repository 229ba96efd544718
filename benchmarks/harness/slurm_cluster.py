"""A real, throwaway single-node Slurm cluster on 127.0.0.1, for tests and benchmarks.

Debian's `munge`, `slurmctld` and `slurmd`, started by hand (no systemd), each
in the foreground so that we own its process, from a `slurm.conf` written into
a fresh directory, on free high ports:
- no cgroups (`proctrack/linuxproc`, `task/none`), so it runs in a container;
- no slurmdbd (`accounting_storage/none`), but a job completion log
  (`jobcomp/filetxt`), which is what `remote.control_plane.slurm.query` falls back on once
  slurmctld has forgotten a job (after `MinJobAge`, 2 s here);
- the node is `hostname -s`, because slurmd finds its own NodeName that way.
Clients find the cluster through `SLURM_CONF` (`cluster.env`), and munge
through `AuthInfo=socket=...` in that same file, so nothing touches /etc/slurm
or /run/munge and two clusters can run side by side.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.process_tree import descendants, process_name
from benchmarks.harness.sshd import free_port

ADDRESS = "127.0.0.1"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")

SLURM_CONF = """\
ClusterName=aerie-test
SlurmctldHost={node}({address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd.pid
SlurmctldLogFile={directory}/slurmctld.log
SlurmdLogFile={directory}/slurmd.log
# No cgroups: containers and CI runners rarely delegate them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
# No slurmdbd: finished jobs are known from slurmctld for MinJobAge seconds, then from this log.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={jobcomp}
MinJobAge={min_job_age}
MpiDefault=none
ReturnToService=2
# Trust the node's line below, whatever the hardware says (CPUs may be more than nproc).
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
KillWait=2
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr={address} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP
PartitionName={second_partition} Nodes={node} MaxTime=INFINITE State=UP
"""


class SlurmClusterError(RuntimeError):
    pass


@dataclass
class SlurmCluster:
    """One munged + slurmctld + slurmd on 127.0.0.1; build it with `start_cluster`."""

    directory: Path
    """Holds slurm.conf, the daemons' state, spool, pid files and logs, and the job completion log."""
    conf: Path
    """The slurm.conf every daemon and client reads."""
    env: dict[str, str]
    """What a client needs on top of its environment: `{"SLURM_CONF": ...}`."""
    node: str
    """The only node: `hostname -s`."""
    jobcomp: Path
    """The job completion log (`jobcomp/filetxt`): one line per finished job."""
    partition: str = "debug"
    """The default partition."""
    second_partition: str = "batch"
    """Another partition on the same node, for tests that name one."""
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    """The node's CPUs, hence how many one-CPU jobs run at once."""
    min_job_age: int = 2
    """Seconds slurmctld keeps a finished job before only the job completion log knows it (Slurm's minimum is 2)."""
    ctld_port: int = 0
    slurmd_port: int = 0
    munge_directory: Path | None = None
    """munged's key, socket, pid and seed files: a short path whose parents all allow search, as munged demands."""
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def munge_socket(self) -> Path:
        assert self.munge_directory is not None
        return self.munge_directory / "munge.socket"

    def environ(self) -> dict[str, str]:
        """This process's environment pointed at this cluster, without any outer Slurm job's variables."""
        outer = {name: value for name, value in os.environ.items() if not name.startswith("SLURM_")}
        return {**outer, **self.env}

    def start(self) -> None:
        """Start munged, slurmctld and slurmd, and wait until the node is idle."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in ("state", "spool"):
            (self.directory / name).mkdir(exist_ok=True)
        self._start_munged()
        self.conf.write_text(SLURM_CONF.format(
            node=self.node, address=ADDRESS, ctld_port=self.ctld_port, slurmd_port=self.slurmd_port,
            user=_user_name(), munge_socket=self.munge_socket, directory=self.directory,
            jobcomp=self.jobcomp, min_job_age=self.min_job_age, cpus=self.cpus, memory_mb=_memory_mb(),
            partition=self.partition, second_partition=self.second_partition,
        ))
        # -D: stay in the foreground, so that the process we hold is the daemon itself.
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self.wait_idle()

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until sinfo reports the node idle; raise with the daemons' logs if it does not."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise SlurmClusterError(f"{name} exited with {process.returncode}: {self.log_tail(name)}")
            try:
                # Short: a port that someone else holds (a lost race) would keep sinfo waiting for 10 s.
                result = self.run("sinfo", "-h", "-n", self.node, "-o", "%t", timeout=1)
            except subprocess.TimeoutExpired:
                continue
            state = result.stdout.strip()
            if result.returncode == 0 and state == "idle":
                return
            time.sleep(0.1)
        raise SlurmClusterError(
            f"node {self.node} is {state or 'unknown'}, not idle, after {timeout:g}s: "
            f"{self.log_tail('slurmctld')} / {self.log_tail('slurmd')}"
        )

    def run(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; never raises on a non-zero exit."""
        return subprocess.run(command, env=self.environ(), capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        """Cancel every job, stop the daemons, and kill whatever job process is left: nothing keeps running."""
        controller = self.processes.get("slurmctld")
        controller_alive = controller is not None and controller.poll() is None
        if controller_alive:
            self._cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.pop(name, None)
            if process is not None:
                # NOTE: without its controller, slurmd spends ~10 s on SIGTERM trying to reach it.
                _terminate(process, grace=STOP_TIMEOUT_S if controller_alive else 0)
        # NOTE: slurmstepd detaches from slurmd, so stopping slurmd leaves running jobs alive.
        victims = [pid for stepd in self._stepds() for pid in (stepd, *descendants(stepd))]
        for pid in victims:
            _kill(pid)
        _wait_gone(victims)
        if self.munge_directory is not None:
            shutil.rmtree(self.munge_directory, ignore_errors=True)
            self.munge_directory = None

    def log_tail(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return text[-2000:].strip() or "(no log)"

    def _start_munged(self) -> None:
        self.munge_directory = Path(tempfile.mkdtemp(prefix="aerie-munge-"))
        # munged refuses a socket whose parent directories are not searchable by everyone.
        self.munge_directory.chmod(0o755)
        key = self.munge_directory / "munge.key"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self._spawn("munged", [
            "munged", "--foreground", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={self.munge_directory / 'munged.pid'}", f"--seed-file={self.munge_directory / 'munged.seed'}",
            f"--log-file={self.directory / 'munged.log'}",
        ])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.munge_socket.exists():
            if self.processes["munged"].poll() is not None or time.monotonic() > deadline:
                raise SlurmClusterError(f"munged did not start: {self.log_tail('munged')}")
            time.sleep(0.02)

    def _spawn(self, name: str, argv: list[str]) -> None:
        with (self.directory / f"{name}.out").open("wb") as out:
            self.processes[name] = subprocess.Popen(
                [_which(argv[0]), *argv[1:]], env=self.environ(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C on pytest must not reach the daemons before stop() does
            )

    def _cancel_all(self) -> None:
        ids = self.run("squeue", "-h", "-o", "%i").stdout.split()
        if ids:
            self.run("scancel", *ids)
            # A cancelled job reads CANCELLED at once, but its processes get up to KillWait to exit.
            _wait_gone(self._stepds())

    def _stepds(self) -> list[int]:
        """The live slurmstepd processes of this cluster: they hold its slurmd.log open."""
        log = str((self.directory / "slurmd.log").resolve())
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and process_name(int(entry.name)) == "slurmstepd":
                try:
                    if any(os.readlink(fd) == log for fd in (entry / "fd").iterdir()):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found


def start_cluster(directory: Path, *, cpus: int | None = None, min_job_age: int = 2) -> SlurmCluster:
    """Write a cluster's files under `directory` (created, should be fresh) and start it.

    Retries on fresh ports when one was taken between choosing and binding it.
    """
    require_slurm()
    directory = Path(directory)
    for attempt in range(3):
        run_directory = directory / f"run{attempt}" if attempt else directory
        ctld_port, slurmd_port = free_port(), free_port()
        while slurmd_port == ctld_port:
            slurmd_port = free_port()
        cluster = SlurmCluster(
            directory=run_directory, conf=run_directory / "slurm.conf",
            env={"SLURM_CONF": str(run_directory / "slurm.conf")}, node=node_name(),
            jobcomp=run_directory / "jobcomp.log", cpus=cpus or os.cpu_count() or 1, min_job_age=min_job_age,
            ctld_port=ctld_port, slurmd_port=slurmd_port,
        )
        try:
            cluster.start()
            return cluster
        except SlurmClusterError as error:
            cluster.stop()
            if "Address already in use" not in str(error) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def require_slurm() -> None:
    """Raise SlurmClusterError naming what is missing and how to install it."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=_sbin_path()) is None]
    if missing:
        raise SlurmClusterError(
            f"{', '.join(missing)} not found: install them with "
            "`apt-get install munge slurmctld slurmd slurm-client`"
        )


def node_name() -> str:
    """`hostname -s`: the name slurmd looks itself up by in slurm.conf."""
    return socket.gethostname().split(".")[0]


def _which(name: str) -> str:
    return shutil.which(name, path=_sbin_path()) or name


def _sbin_path() -> str:
    # The daemons live in /usr/sbin, which a non-root PATH may lack.
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])


def _user_name() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _memory_mb() -> int:
    """Half the machine's memory, at most 4 GiB: slurmd drains a node that claims more than it has."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return max(256, min(4096, int(line.split()[1]) // 1024 // 2))
    return 1024


def _terminate(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM the daemon's process group (slurmctld's slurmscriptd is in it), SIGKILL after `grace` seconds."""
    if process.poll() is not None:
        _signal_group(process.pid, signal.SIGKILL)
        return
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
    _signal_group(process.pid, signal.SIGKILL)  # whatever child outlived its daemon


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(pids: list[int], timeout: float = STOP_TIMEOUT_S) -> None:
    """Wait until none of `pids` is alive (a zombie counts as gone: only its parent can reap it)."""
    deadline = time.monotonic() + timeout
    while any(_is_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _is_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


