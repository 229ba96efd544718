"""The chunked route's resident trainer on several ranks: one group of ``stages.train.nproc`` training processes.

Started the first time the job trains (`GroupTrainer`), through torchrun's launcher as the offline
train stage's ranks are (`remote.eagle3.distributed.launch`, on loopback), and kept for every later
chunk and epoch: on a GPU host each start costs every rank a CUDA and NCCL initialisation. The target
stays where it is, with the job's extractor; the ranks load what training needs. The job sends the
same command to every rank over `remote.orchestration.channel`; each rank makes it on its own
`remote.orchestration.resident.Trainer` (`remote.orchestration.resident_rank`: DDP, rank 0 alone
writes and measures) and replies; rank 0's progress calls are made on the job's progress, whose
file only the job writes.

The group never outlives the job: the launcher gets SIGTERM when the job ends (however it ends) and
stops the ranks, which also die with the launcher. A rank that dies ends the group (torchrun
restarts nothing) and the job, on the launcher's one line naming the rank; ``inv rerun --failed``
goes on from the last checkpoint with as many ranks (`remote.orchestration.resident.check_world`
refuses another count).
"""

from __future__ import annotations

import hmac
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from remote.control_plane import collector, logfile
from remote.control_plane.progress import read_json
from remote.eagle3 import StageInputError
from remote.orchestration import channel
from remote.orchestration.channel import Channel

#: The progress calls rank 0 may have made on the job's progress.
PROGRESS_CALLS = {"written", "skipped", "metrics", "note", "expect", "estimate", "resumed", "beat"}
#: Seconds the ranks get to leave together, or the launcher to stop them after one died, before it is stopped.
STOP_WAIT = 60.0


class RankGroup:
    """`nproc` training ranks under one launcher, each on its channel (index: rank)."""

    def __init__(self, launcher: subprocess.Popen, channels: list[Channel], progress: Any) -> None:
        self.launcher, self.channels, self.progress = launcher, channels, progress
        self.selector = selectors.DefaultSelector()
        for rank, link in enumerate(channels):
            self.selector.register(link.sock, selectors.EVENT_READ, rank)

    @classmethod
    def start(cls, nproc: int, progress: Any) -> "RankGroup":
        """The launcher started (it dies with this process) and every rank connected."""
        token = secrets.token_hex(16)
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(1.0)
        env = {**os.environ, channel.PORT_ENV: str(server.getsockname()[1]), channel.TOKEN_ENV: token,
               channel.PARENT_ENV: str(os.getpid())}
        launcher = subprocess.Popen([sys.executable, "-m", "remote.orchestration.rank_group", str(nproc)], env=env)
        try:
            channels = _accept(server, launcher, nproc, token, progress)
        except BaseException:
            launcher.terminate()
            raise
        finally:
            server.close()
        return cls(launcher, channels, progress)

    def call(self, do: str, **args: Any) -> Any:
        """`do` made by every rank; rank 0's reply. A refusal (any rank's) is raised as this job's."""
        for link in self.channels:
            try:
                link.send({"do": do, **args})
            except OSError:  # that rank has gone
                self._ended()
        replies: dict[int, dict[str, Any]] = {}
        for rank, message in self._messages(lambda: len(replies) == len(self.channels)):
            if "progress" in message and message["progress"] in PROGRESS_CALLS:
                getattr(self.progress, message["progress"])(*message["args"], **message["kwargs"])
            else:
                replies[rank] = message
        refused = [replies[rank]["refused"] for rank in sorted(replies) if "refused" in replies[rank]]
        if refused:
            raise StageInputError(refused[0])
        return replies[0].get("reply")

    def _messages(self, done: Any) -> Iterator[tuple[int, dict[str, Any]]]:
        """Each message from a rank until `done()`, beating while none comes; a rank gone ends the job (`_ended`)."""
        while not done():
            ready = self.selector.select(timeout=1.0)
            if not ready:
                self.progress.beat()
                if self.launcher.poll() is not None:
                    self._ended()
            for key, _ in ready:
                link = self.channels[key.data]
                if not link.fill():
                    self._ended()
                for message in link.pending():
                    yield key.data, message

    def _ended(self) -> None:
        """A rank has gone: the launcher stops the others and says which in one line, which ends this job too."""
        try:
            code = self.launcher.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.stop()
            code = None
        if code:  # its line is the log's last: the job's error
            raise SystemExit(code)
        raise SystemExit("chunked: the training ranks ended before they answered; "
                         "`inv rerun --failed` goes on from the last checkpoint")

    def stop(self) -> None:
        """Every rank told to leave and waited for; stopped (SIGTERM to the launcher) when they do not in time."""
        if self.launcher.poll() is None:
            for link in self.channels:
                try:
                    link.send({"do": "stop"})
                except OSError:
                    pass  # that rank has gone: the launcher is stopping the others
            try:
                self.launcher.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                self.launcher.terminate()
                self.launcher.wait()
        for link in self.channels:
            link.close()
        self.selector.close()


def _accept(server: socket.socket, launcher: subprocess.Popen, nproc: int, token: str, progress: Any) -> list[Channel]:
    """Each rank's channel, by rank, once it said its rank with the job's token; beating while they start."""
    channels: dict[int, Channel] = {}
    while len(channels) < nproc:
        try:
            sock, _ = server.accept()
        except socket.timeout:
            progress.beat()
            if launcher.poll() is not None:
                raise SystemExit(launcher.returncode or 1) from None
            continue
        sock.settimeout(30.0)  # a stranger that connects and says nothing is dropped, not waited for
        link = Channel(sock)
        try:
            hello = link.receive() or {}
        except (OSError, ValueError):
            hello = {}
        if not hmac.compare_digest(str(hello.get("token", "")), token):
            link.close()
            continue
        sock.settimeout(None)
        channels[int(hello["rank"])] = link
    return [channels[rank] for rank in range(nproc)]


class GroupTrainer:
    """`remote.orchestration.resident.Trainer`'s calls, made by `nproc` ranks that start on the first chunk trained
    and stay for the run; `spec`: the rest of the Trainer's arguments (the ranks read the job's context themselves)."""

    def __init__(self, nproc: int, progress: Any, output: Path, heldout: list[Path], **spec: Any) -> None:
        self.nproc, self.progress, self.output, self.heldout = nproc, progress, output, heldout
        self.spec = {**spec, "output": str(output), "heldout": [str(p) for p in heldout]}
        self.group: RankGroup | None = None

    def run(self, inputs: list[Path], epochs: int, name: str, seed: int) -> None:
        if self.group is None:
            self.group = RankGroup.start(self.nproc, self.progress)
            self.group.call("open", **self.spec)
        self.group.call("train", inputs=[str(p) for p in inputs], epochs=epochs, name=name, seed=seed)

    def measured(self) -> int | None:
        return None if self.group is None else self.group.call("measured")

    def measure(self, epoch: int) -> dict[str, Any]:
        return self.group.call("measure", epoch=epoch)

    def manifest(self, epochs: int, records: int, seconds: float) -> dict[str, Any]:
        if self.group is None:  # a rerun of a run that had ended: its manifest stands
            return read_json(self.output / "manifest.json", {})
        return self.group.call("manifest", epochs=epochs, records=records, seconds=seconds)

    def close(self) -> None:
        if self.group is not None:
            self.group.stop()
            self.group = None


def main() -> None:
    """The launcher: torchrun's agent over ``argv[1]`` ranks of `remote.orchestration.resident_rank`."""
    from remote.eagle3 import distributed

    collector.tune()
    logfile.whole_lines()  # its one line and its ranks' share the job's log
    # NOTE: SIGTERM, not SIGKILL: torchrun's agent stops its ranks on it (they die with it too, `resident_rank`).
    channel.dies_with(int(os.environ[channel.PARENT_ENV]), signal.SIGTERM)()
    os.environ[channel.PARENT_ENV] = str(os.getpid())  # the ranks' parent
    raise SystemExit(distributed.launch("remote.orchestration.resident_rank", int(sys.argv[1])))


if __name__ == "__main__":
    main()
