"""The edit → deploy → rerun loop, timed as the user types it, against the tools it replaces.

Every "as typed" figure is the whole command run as a process from the checkout
(`.venv/bin/inv deploy -i test`: Python start-up, imports, validation, connection,
transfer). The baselines run alongside, over the same loopback sshd, turn about with
the command (A B A B ...) so that a machine whose speed drifts moves both:

- no-op deploy and one-file deploy: `rsync -az remote inventories host:dst/`;
- `inv deploy rerun --failed` after one edit: `scp` of the edited file, then one
  `ssh host true` (the seed's loop: copy the script, relaunch over ssh).

The phases beside them are timed inside one process: start-up (`inv --list`: Python,
Invoke and tasks.py's imports), the cached validation, one command over the connection
that the commands before left open (local/transport/openssh.py), and the
manifest round trip. The tree is the checkout plus filler modules, 200 files in all.

Given a commit to measure against (`inv bench --against REF`), each of the three commands is
also timed in turn with the same command in REF's checkout (`vs_ref`: the ratio this/REF).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from benchmarks.bench_control import cpu_meters, grow_tree, on_loopback_sshd
from local.host import releases
from local.validation import samples
from local.host.verbs import RemoteHost
from local.inventory.schema import load
from benchmarks.harness.checkout import Bench, wait_for
from benchmarks.harness.pairing import against_ref, median_seconds, paired
from benchmarks.harness.ref_checkout import Ref, RefBench

FAILING = "F"  # a dataset whose job fails every time, so that each rerun relaunches one job


def inv_argv(*args: str) -> list[str]:
    """`.venv/bin/inv ARGS` as a user types it (the interpreter's own `inv` script)."""
    script = Path(sys.executable).parent / "inv"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "invoke", *args]


DEPLOY = inv_argv("deploy", "-i", "test")
RERUN = inv_argv("deploy", "rerun", "--failed")  # the README's one-line form, INVOKE_INVENTORY=test


def run(repeat: int = 5, against: Ref | None = None) -> dict[str, Any]:
    return on_loopback_sshd(measure, repeat, against)


def edited(bench: Bench) -> Path:
    """The module each one-file edit appends to."""
    return bench.checkout / "remote" / "tree" / "m000.py"


def edit(bench: Bench) -> None:
    edited(bench).write_text(edited(bench).read_text() + "# edit\n")


def run_quietly(bench: Bench, argv: list[str]) -> None:
    """`argv` from `bench`'s checkout, the inventory named as the README's one-line loop names it."""
    env = {**os.environ, "INVOKE_INVENTORY": "test"}
    subprocess.run(argv, cwd=bench.checkout, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def failed_again(bench: Bench) -> None:
    """Wait for the failing job to have failed (again, after a rerun)."""
    wait_for(lambda: bench.poll().get(f"{FAILING}/prep", {}).get("state") == "failed", 60, "the failing job to fail")


def prepare(bench: Bench) -> None:
    """The tree grown, deployed and launched, the failing job failed: where the loop starts."""
    bench.scripted({**{f"D{i:02d}": "records=1" for i in range(9)}, FAILING: "records=1 exit=3"})
    grow_tree(bench.checkout)
    bench.inv("deploy")  # the first deploy validates every dataset and sends everything
    bench.inv("launch", "--stage", "prep")
    failed_again(bench)


def measure(bench: Bench, work: Path, repeat: int, ref: RefBench | None = None) -> dict[str, Any]:
    assert bench.sshd is not None
    sshd = bench.sshd
    for side in [bench, ref] if ref else [bench]:
        prepare(side)
    run_here = lambda argv: run_quietly(bench, argv)  # noqa: E731

    destination = f"{sshd.destination}:{work / 'rsync-copy'}/"
    rsync = ["rsync", "-az", "-e", sshd.rsh(), "remote", "inventories", destination]
    run_here(rsync)
    run_quietly(bench, DEPLOY)

    noop = paired(lambda: run_here(DEPLOY), lambda: run_here(rsync), repeat)
    one_file = paired(lambda: (edit(bench), run_here(DEPLOY)), lambda: (edit(bench), run_here(rsync)), repeat)

    rerun = _rerun_failed_vs_scp(bench, work, repeat)
    figures = {
        "as_typed": {
            "deploy_noop_vs_rsync": noop,
            "deploy_one_file_vs_rsync": one_file,
            "deploy_rerun_failed_vs_scp_plus_ssh": rerun,
        },
    }
    if ref:
        figures["vs_ref"] = vs_ref(bench, ref, repeat)
    return {**figures, "phases": phases(bench, repeat)}


def vs_ref(bench: Bench, ref: RefBench, repeat: int) -> dict[str, Any]:
    """The loop's commands as typed, in this checkout and in REF's in turn: their ratio this/REF."""
    def both_failed() -> None:  # a rerun's relaunched job, running on the host, would slow the next command
        failed_again(bench)
        failed_again(ref)

    commands = {"deploy_noop_as_typed": (DEPLOY, False), "deploy_one_file_as_typed": (DEPLOY, True),
                "deploy_rerun_failed_as_typed": (RERUN, True)}
    figures: dict[str, Any] = {"ref": ref.ref.name, "commit": ref.ref.commit[:12]}
    for name, (argv, edits) in commands.items():
        figures[name] = against_ref(_typed(bench, argv, edits), _typed(ref, argv, edits), repeat, both_failed,
                                    meters=cpu_meters(bench))
    both_failed()
    return figures


def _typed(bench: Bench, argv: list[str], edits: bool) -> Callable[[], None]:
    """`argv` as typed in `bench`'s checkout, after one edit of the tree when `edits`."""
    def action() -> None:
        if edits:
            edit(bench)
        run_quietly(bench, argv)

    return action


def _rerun_failed_vs_scp(bench: Bench, work: Path, repeat: int) -> dict[str, float]:
    """The edit-and-rerun loop as typed (`inv deploy rerun --failed`) against its floor by hand
    (`scp` of the edited file, then `ssh host true`), each round after the job failed again."""
    assert bench.sshd is not None
    sshd = bench.sshd
    scp_options = ["-P" if option == "-p" else option for option in sshd.ssh_options()[1:]]  # scp's port flag is -P
    scp = ["scp", "-q", *scp_options, str(edited(bench)), f"{sshd.destination}:{work / 'scp-copy.py'}"]
    ssh_true = sshd.ssh_argv("true")

    def loop() -> None:
        edit(bench)
        run_quietly(bench, RERUN)

    def seed_loop() -> None:
        edit(bench)
        run_quietly(bench, scp)
        run_quietly(bench, ssh_true)

    timed_loop, timed_seed = [], []
    for _ in range(repeat):
        failed_again(bench)
        for action, times in ((loop, timed_loop), (seed_loop, timed_seed)):
            started = time.perf_counter()
            action()
            times.append(time.perf_counter() - started)
    return {"seconds": statistics.median(timed_loop), "baseline_seconds": statistics.median(timed_seed),
            "ratio": statistics.median(x / y for x, y in zip(timed_loop, timed_seed))}


def phases(bench: Bench, repeat: int) -> dict[str, float]:
    """Where an as-typed no-op deploy spends its time, each part timed on its own."""
    inventory = load(str(bench.checkout / "inventories" / "test.yaml"))
    quiet = Console(file=io.StringIO())
    listed = inv_argv("--list")
    startup = median_seconds(lambda: subprocess.run(listed, cwd=bench.checkout, check=True, capture_output=True), repeat)
    samples.check(inventory, quiet, cached=True)  # this process's cache (under this checkout's .aerie) filled
    cached = median_seconds(lambda: samples.check(inventory, quiet, cached=True), repeat)

    def connect() -> RemoteHost:  # rides the shared connection, as every command after the first does
        host = RemoteHost(inventory)
        host.transport.run("true")
        return host

    connected = median_seconds(lambda: connect().close(), repeat)
    host = connect()
    try:
        manifest = median_seconds(lambda: releases.diff(host, releases.manifest(bench.checkout)), repeat)
    finally:
        host.close()
    return {"startup_inv_list_s": startup, "validation_cached_s": cached, "one_command_s": connected,
            "manifest_and_plan_s": manifest}


if __name__ == "__main__":
    json.dump(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5), sys.stdout, indent=2)
    print()
