"""One rank of the chunked job's resident training group (`remote.orchestration.rank_group`), started by torchrun's agent.

It joins the process group (NCCL on GPUs, gloo on the CPU), connects to the job
(`remote.orchestration.channel`) and makes the job's commands on its own
`remote.orchestration.resident.Trainer` until told to stop: ``open`` (the trainer, from the
job's context and the settings sent), ``train`` (a chunk's pass), ``measured``, ``measure`` (an
epoch, rank 0) and ``manifest``. Rank 0's progress calls go back to the job (`Forward`); a
refusal is a reply (the job says it, once); anything else ends the rank, and the group with it.
It dies with the launcher, and leaves when the job's end of the channel closes.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

from remote.control_plane import collector, logfile
from remote.control_plane.progress import Progress
from remote.eagle3 import StageInputError, distributed
from remote.orchestration import channel
from remote.orchestration.channel import Channel

#: The exit code of a rank that failed (a refusal is a reply, never an exit): the launcher names it in its line.
CRASHED = 3
#: Seconds between two heartbeats sent to the job: the trainer beats far more often than the job needs.
BEAT_EVERY = 0.5


class Forward:
    """The chunked job's progress as rank 0 reports it: each call sent to the job, which makes it."""

    def __init__(self, link: Channel) -> None:
        self.link, self.beaten = link, 0.0

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.link.send({"progress": name, "args": list(args), "kwargs": kwargs})

    def written(self, n: int = 1) -> None:
        self._call("written", n)

    def skipped(self, reason: str, n: int = 1) -> None:
        self._call("skipped", reason, n)

    def metrics(self, **values: float) -> None:
        self._call("metrics", **values)

    def note(self, message: str) -> None:
        self._call("note", message)

    def expect(self, total: int, by: str | None = None) -> None:
        self._call("expect", total, by)

    def estimate(self, seconds: float) -> None:
        self._call("estimate", seconds)

    def resumed(self) -> None:
        self._call("resumed")

    def beat(self) -> None:
        if time.monotonic() - self.beaten >= BEAT_EVERY:
            self.beaten = time.monotonic()
            self._call("beat")


def open_trainer(spec: dict[str, Any], link: Channel, world: distributed.World) -> Any:
    """This rank's trainer, as the job would make it in its own process (`remote.orchestration.resident.trainer`)."""
    from remote.orchestration.resident import Trainer
    from remote.stages import StageContext

    trained = {"preps": {name: Path(p) for name, p in spec["trained"]["preps"].items()}, "heldout": spec["trained"]["heldout"]}
    return Trainer(StageContext.from_env(), spec["settings"], Path(spec["output"]), [Path(p) for p in spec["heldout"]],
                   spec["schedule_steps"], Path(spec["evaluations"]), Forward(link) if world.is_main else Progress(),
                   trained, world=world)


def make(trainer: Any, do: str, args: dict[str, Any]) -> Any:
    """One command on this rank's trainer; its reply."""
    if do == "train":
        return trainer.run([Path(p) for p in args["inputs"]], args["epochs"], args["name"], args["seed"])
    if do == "measured":
        return trainer.measured()
    if do == "measure":
        return trainer.measure(args["epoch"])
    if do == "manifest":
        return trainer.manifest(args["epochs"], args["records"], args["seconds"])
    raise ValueError(f"resident rank: no command {do!r}")


def serve(link: Channel, world: distributed.World) -> None:
    """The job's commands, one at a time, until ``stop`` (the group left together) or the job's end closing."""
    trainer = None
    while (command := link.receive()) is not None:
        do = command.pop("do")
        if do == "stop":
            distributed.stop(world)
            return
        try:
            reply = None
            if do == "open":
                trainer = open_trainer(command, link, world)
            else:
                reply = make(trainer, do, command)
        except StageInputError as refused:
            link.send({"refused": str(refused)})
            continue
        link.send({"reply": reply})


def main() -> None:
    collector.tune()
    logfile.whole_lines()  # the ranks and their launcher share the job's log
    channel.dies_with(int(os.environ[channel.PARENT_ENV]), signal.SIGKILL)()
    world = distributed.World.from_env()
    distributed.start(world)
    link = channel.connect(world.rank)
    if world.is_main:  # once per group: the job's log counts the groups it started
        print(f"resident trainer: {world.size} ranks joined", flush=True)
    try:
        serve(link, world)
    except Exception:
        traceback.print_exc()
        raise SystemExit(CRASHED) from None


if __name__ == "__main__":
    main()
