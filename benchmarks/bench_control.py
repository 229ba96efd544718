"""Control-plane figures against a throwaway loopback sshd, as ratios to baselines run alongside.

As typed (the whole `inv` command, Python start-up included), each against `ssh host true`
in pairs: `inv status` of 40 jobs over the connection the last command left open (warm),
`--json`, and with no connection open (cold: paramiko connects); `inv launch` of 40 jobs;
and `inv --version`, Invoke's own start-up, the floor under every task.

In-process phases, on a connection of their own (paramiko: connect + the commands): status
and launch of 40 jobs (remote commands used, wall time), and deploys of a 200-file tree, a
no-op and a one-file change, against `rsync -az` of the same tree over the same sshd.

The as-typed status and launch pairs are also taken over links with a round trip (`LINK_RTTS`,
`benchmarks.link`): on loopback `ssh host true` costs only its CPU, over a network every
handshake exchange adds a round trip, and a shared connection's command about one.

Given a commit to measure against (`inv bench --against REF`), each as-typed command is also
timed in turn with the same command in REF's checkout (`vs_ref`, on loopback and over each link:
the ratio this/REF); `inv --version`, Invoke's alone and so the same on both sides, gauges the noise.

Each figure is the median of `repeat` runs (of the pairwise ratios, for pairs).
"""

from __future__ import annotations

import compileall
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, TypeVar

from benchmarks.link import DelayedLink
from local.host import releases
from local.host.verbs import RemoteHost
from local.inventory.schema import load
from local.transport.openssh import Multiplexed, accepts
from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from benchmarks.harness.pairing import Clock, against_ref, children_cpu, median_seconds, paired
from benchmarks.harness.process_tree import tree_cpu_seconds
from benchmarks.harness.ref_checkout import Ref, RefBench, ref_bench
from benchmarks.harness.sshd import start_server

JOBS = 40
DATASETS = {f"D{i:02d}": "records=3" for i in range(JOBS)}
TREE_FILES = 200
#: Round trips of the links the as-typed figures are also taken over: a LAN, a VPN to a cloud region.
LINK_RTTS = (0.002, 0.02)
AnyBench = TypeVar("AnyBench", bound=Bench)


class Counting:
    """Wraps a transport to count the remote commands a task uses."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.commands = inner, inner.name, 0

    def run(self, command: str, stdin: bytes | None = None, stream: Any = None) -> Any:
        self.commands += 1
        return self.inner.run(command, stdin, stream)

    def close(self) -> None:
        self.inner.close()


def host_of(bench: Bench) -> RemoteHost:
    """A host over a connection of its own (paramiko), as an in-process phase: connect + commands."""
    from local.transport.paramiko_ssh import SshTransport

    inventory = load(str(bench.checkout / "inventories" / "test.yaml"))
    return RemoteHost(inventory, Counting(SshTransport(inventory.host)))


def once(bench: Bench, verb: Callable[[RemoteHost], object]) -> int:
    """Run one task's work on a fresh connection; the number of remote commands it used."""
    host = host_of(bench)
    try:
        verb(host)
        return host.transport.commands  # type: ignore[attr-defined]
    finally:
        host.close()


def run(repeat: int = 5, against: Ref | None = None) -> dict[str, Any]:
    return on_loopback_sshd(measure, repeat, against)


Measure = Callable[[Bench, Path, int, "RefBench | None"], dict[str, Any]]


def on_loopback_sshd(measure: Measure, repeat: int, against: Ref | None = None) -> dict[str, Any]:
    """`measure` over a copy of this checkout deployed to a fresh loopback sshd, stopped afterwards;
    given `against`, also over a checkout of that commit (its own host root, the same sshd).

    Laptop and host are two machines: with two CPUs or more, the sshd (and so every command and
    job on the "host") runs on the last CPU and this process (and every command it times) on the
    others, so that a launch's jobs starting on the host do not slow the laptop's `inv`.
    """
    cpus = sorted(os.sched_getaffinity(0))
    host_cpus, laptop_cpus = (set(cpus[-1:]), set(cpus[:-1])) if len(cpus) > 1 else (set(cpus), set(cpus))
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        sshd = start_server(work / "sshd", cpus=host_cpus)
        checkout = copy_checkout(work / "checkout")
        # As on a user's laptop after the first command: bytecode cached (PYTHONDONTWRITEBYTECODE, set
        # on some machines, would make every `inv` compile aerie's modules again).
        compileall.compile_dir(checkout, quiet=1)
        bench = Bench(checkout, work / "root", "ssh", sshd)
        ref = ref_bench(against, bench, work) if against else None
        os.sched_setaffinity(0, laptop_cpus)
        try:
            figures = measure(bench, work, repeat, ref)
            return {**figures, "cpus": {"host": sorted(host_cpus), "laptop": sorted(laptop_cpus)}}
        finally:
            os.sched_setaffinity(0, set(cpus))
            sshd.stop()


def grow_tree(checkout: Path) -> None:
    """Pad `remote/` to TREE_FILES files, so deploys move a tree of a realistic size."""
    (checkout / "remote" / "tree").mkdir(exist_ok=True)
    for index in range(TREE_FILES - len(releases.manifest(checkout))):
        (checkout / "remote" / "tree" / f"m{index:03d}.py").write_text(f"# module {index}\n" + "X = 1\n" * 200)


def measure(bench: Bench, work: Path, repeat: int, ref: RefBench | None = None) -> dict[str, Any]:
    assert bench.sshd is not None
    ssh_true = median_seconds(lambda: subprocess.run(bench.sshd.ssh_argv("true"), check=True), repeat)
    for side in _sides(bench, ref):
        side.scripted(DATASETS)
        grow_tree(side.checkout)
        side.inv("deploy")
    if ref:  # its host holds 40 ended jobs, as this one's does once _status_and_launch has launched
        ref.inv("launch", "--stage", "prep")
        _all_ended(ref)
    files = releases.manifest(bench.checkout)
    commands = _status_and_launch(bench, ssh_true, repeat)
    against = {"vs_ref": vs_ref(bench, ref, repeat)} if ref else {}
    deploys = _deploys_vs_rsync(bench, work, files, repeat)
    # Last: it points the inventories at the link.
    links = {f"rtt_{rtt * 1000:g}ms": over_link(bench, work, rtt, repeat, ref) for rtt in LINK_RTTS}
    for side in _sides(bench, ref):
        _all_ended(side)  # the last launch's jobs write under the scratch directory, which is removed next
    return {"ssh_true_s": ssh_true, **commands, **against, **deploys, "over_a_link": links}


def _sides(bench: Bench, ref: RefBench | None) -> list[Bench]:
    return [bench, ref] if ref else [bench]


def _all_ended(bench: Bench) -> None:
    """Wait for the 40 launched jobs to have succeeded."""
    def ended() -> bool:
        jobs = bench.poll()
        return len(jobs) == JOBS and all(j["state"] == "succeeded" for j in jobs.values())

    wait_for(ended, 120, "40 jobs to finish")


def _status_and_launch(bench: Bench, ssh_true: float, repeat: int) -> dict[str, Any]:
    """`status` and `launch` of 40 jobs: the host's commands alone, then as typed against `ssh host true`."""
    assert bench.sshd is not None
    all_ended = lambda: _all_ended(bench)  # noqa: E731
    launch_commands = once(bench, lambda h: h.call("launch", specs=_specs(bench), force=True))
    all_ended()
    launch = median_seconds(lambda: once(bench, lambda h: h.call("launch", specs=_specs(bench), force=True)), 1)
    all_ended()  # 40 jobs starting on the host's one CPU would slow every command timed now
    status_commands = once(bench, lambda h: h.call("status"))
    status = median_seconds(lambda: once(bench, lambda h: h.call("status")), repeat)
    inv_status = median_seconds(lambda: bench.inv("status", check=False), repeat)
    # As typed, against `ssh host true` in pairs (Python start-up, imports and the host's Python included).
    ssh = lambda: subprocess.run(bench.sshd.ssh_argv("true"), check=True)  # noqa: E731
    typed_status = paired(lambda: bench.inv("status", check=False), ssh, repeat)
    typed_json = paired(lambda: bench.inv("status", "--json", check=False), ssh, repeat)
    cold_status = paired(lambda: bench.inv("status", check=False), ssh, repeat, before=first_of_the_day(bench))
    floor = paired(lambda: subprocess.run([sys.executable, "-m", "invoke", "--version"], check=True, capture_output=True), ssh, repeat)

    typed_launch = paired(lambda: bench.inv("launch", "--stage", "prep", "--force"), ssh, repeat, before=all_ended)
    all_ended()
    return {
        "status_40_jobs": {"remote_commands": status_commands, "seconds": status, "ratio_to_ssh_true": status / ssh_true,
                           "inv_seconds": inv_status, "inv_ratio_to_ssh_true": inv_status / ssh_true},
        "launch_40_jobs": {"remote_commands": launch_commands, "seconds": launch, "ratio_to_ssh_true": launch / ssh_true},
        "inv_status_as_typed_vs_ssh_true": typed_status,
        "inv_status_json_as_typed_vs_ssh_true": typed_json,
        "inv_status_as_typed_cold_vs_ssh_true": cold_status,
        "inv_version_as_typed_vs_ssh_true": floor,
        "inv_launch_40_as_typed_vs_ssh_true": typed_launch,
    }


def first_of_the_day(bench: Bench) -> Callable[[], None]:
    """What makes the next command find no shared connection open, so that it connects (paramiko) itself.

    NOTE: REF's commands are taken to share the socket this checkout names (the name is the host's
    address, user and keys); a REF that names it otherwise makes the first wait time out.
    """
    assert bench.sshd is not None
    sshd = bench.sshd
    shared = Multiplexed(load(str(bench.checkout / "inventories" / "test.yaml")).host).socket

    def close() -> None:
        wait_for(shared.exists, 20, "the shared connection")  # the last one's master is up: no handshake in flight
        sshd.kill_connections()
        wait_for(lambda: not accepts(shared), 5, "the shared connection to end")

    return close


def vs_ref(bench: Bench, ref: RefBench, repeat: int, link: bool = False) -> dict[str, Any]:
    """Each command as typed, in this checkout and in REF's in turn: its ratios this/REF, of wall time and of
    the CPU used on each side (`cpu_meters`).

    `inv --version` is Invoke's alone, the same on both sides: its spread is the run's noise.
    """
    def both_ended() -> None:
        _all_ended(bench)
        _all_ended(ref)

    nothing = lambda: None  # noqa: E731
    commands: dict[str, tuple[tuple[str, ...], Callable[[], None]]] = {
        "inv_status_as_typed": (("status",), nothing),
        "inv_status_json_as_typed": (("status", "--json"), nothing),
        "inv_launch_40_as_typed": (("launch", "--stage", "prep", "--force"), both_ended),
    }
    if not link:
        commands |= {"inv_status_as_typed_cold": (("status",), first_of_the_day(bench)),
                     "inv_version_as_typed": (("--version",), nothing)}
    figures: dict[str, Any] = {"ref": ref.ref.name, "commit": ref.ref.commit[:12]}
    for name, (args, ready) in commands.items():
        figures[name] = against_ref(_typed(bench, args), _typed(ref, args), repeat, ready, meters=cpu_meters(bench))
    both_ended()
    return figures


def cpu_meters(bench: Bench) -> dict[str, Clock]:
    """The CPU a command as typed uses on the laptop (the `inv` process and what it waited for) and on the
    host (the sshd and all under it: the host's Python, its commands)."""
    assert bench.sshd is not None and bench.sshd.process is not None
    sshd = bench.sshd.process.pid
    return {"laptop_cpu": children_cpu, "host_cpu": lambda: tree_cpu_seconds(sshd)}


def _typed(bench: Bench, args: tuple[str, ...]) -> Callable[[], object]:
    return lambda: bench.inv(*args)  # checked: a side that failed fast would read as fast


def _deploys_vs_rsync(bench: Bench, work: Path, files: dict[str, str], repeat: int) -> dict[str, Any]:
    """aerie's deploy of the 200-file tree against rsync's: nothing changed, then one file changed."""
    assert bench.sshd is not None

    def deploy_once(host: RemoteHost) -> None:
        releases.push(host, releases.diff(host, files), bench.checkout) if not releases.diff(host, files).is_noop else None

    noop_commands = once(bench, deploy_once)
    noop = median_seconds(lambda: once(bench, deploy_once), repeat)
    rsync_target = f"{bench.sshd.destination}:{work / 'rsync-copy'}/"
    rsync = ["rsync", "-az", "--delete", "-e", bench.sshd.rsh(), f"{bench.checkout / 'remote'}/", rsync_target]
    subprocess.run(rsync, check=True)
    rsync_noop = median_seconds(lambda: subprocess.run(rsync, check=True), repeat)

    target = bench.checkout / "remote" / "tree" / "m000.py"

    def change_one() -> None:
        target.write_text(target.read_text() + "# edit\n")

    def aerie_change() -> None:
        change_one()
        once(bench, lambda h: releases.push(h, releases.diff(h, releases.manifest(bench.checkout)), bench.checkout))

    def rsync_change() -> None:
        change_one()
        subprocess.run(rsync, check=True)

    one_file = median_seconds(aerie_change, repeat)
    rsync_one = median_seconds(rsync_change, repeat)
    return {
        "deploy_noop_200_files": {"remote_commands": noop_commands, "seconds": noop, "rsync_seconds": rsync_noop,
                                  "ratio_to_rsync": noop / rsync_noop},
        "deploy_one_changed_200_files": {"seconds": one_file, "rsync_seconds": rsync_one,
                                         "ratio_to_rsync": one_file / rsync_one},
    }


def over_link(bench: Bench, work: Path, rtt: float, repeat: int, ref: RefBench | None = None) -> dict[str, Any]:
    """As typed, against `ssh host true`, both over a link with round trip `rtt` (the sshd behind a
    `DelayedLink`): `inv status` warm, `--json`, and `inv launch` of 40 jobs; and against REF's."""
    assert bench.sshd is not None
    all_ended = lambda: _all_ended(bench)  # noqa: E731
    all_ended()  # the last launch's jobs, which would slow the first baselines
    with DelayedLink(bench.sshd.port, rtt) as link:
        linked = _through(bench, link, work)
        ssh = lambda: subprocess.run(linked.sshd.ssh_argv("true"), check=True)  # noqa: E731
        figures = {
            "ssh_true_s": median_seconds(ssh, repeat),
            "inv_status_as_typed_vs_ssh_true": paired(lambda: linked.inv("status", check=False), ssh, repeat),
            "inv_status_json_as_typed_vs_ssh_true": paired(lambda: linked.inv("status", "--json", check=False), ssh,
                                                           repeat),
            "inv_launch_40_as_typed_vs_ssh_true": paired(lambda: linked.inv("launch", "--stage", "prep", "--force"), ssh, repeat,
                                                         before=all_ended),
        }
        if ref:
            figures["vs_ref"] = vs_ref(linked, _through(ref, link, work), repeat, link=True)
        return figures


def _through(bench: AnyBench, link: DelayedLink, work: Path) -> AnyBench:
    """`bench` with its inventory pointed at the sshd behind `link`, the shared connection opened over it."""
    assert bench.sshd is not None
    known = work / f"known_hosts.{link.port}"  # the host's key, under the link's port
    known.write_text(f"[{bench.sshd.address}]:{link.port} {bench.sshd.host_public_key}\n")
    linked = dataclasses.replace(bench, sshd=dataclasses.replace(bench.sshd, port=link.port, known_hosts=known))
    linked.scripted(DATASETS)
    linked.inv("status", check=False)
    return linked


def _specs(bench: Bench) -> list[dict[str, Any]]:
    from local.jobs import specs

    return specs.specs(load(str(bench.checkout / "inventories" / "test.yaml")), "prep", None)


if __name__ == "__main__":
    json.dump(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5), sys.stdout, indent=2)
    print()
