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

from benchmarks.bench_control import grow_tree, median_seconds, on_loopback_sshd, paired
from local.host import releases
from local.validation import samples
from local.host.verbs import RemoteHost
from local.inventory.schema import load
from benchmarks.harness.checkout import Bench, wait_for

FAILING = "F"  # a dataset whose job fails every time, so that each rerun relaunches one job


def inv_argv(*args: str) -> list[str]:
    """`.venv/bin/inv ARGS` as a user types it (the interpreter's own `inv` script)."""
    script = Path(sys.executable).parent / "inv"
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "invoke", *args]


def run(repeat: int = 5) -> dict[str, Any]:
    return on_loopback_sshd(measure, repeat)


def measure(bench: Bench, work: Path, repeat: int) -> dict[str, Any]:
    assert bench.sshd is not None
    sshd = bench.sshd
    datasets = {f"D{i:02d}": "records=1" for i in range(9)}
    bench.scripted({**datasets, FAILING: "records=1 exit=3"})
    grow_tree(bench.checkout)
    edited = bench.checkout / "remote" / "tree" / "m000.py"

    def edit() -> None:
        edited.write_text(edited.read_text() + "# edit\n")

    def run_quietly(argv: list[str]) -> None:
        env = {**os.environ, "INVOKE_INVENTORY": "test"}
        subprocess.run(argv, cwd=bench.checkout, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    bench.inv("deploy")  # the first deploy validates every dataset and sends everything
    bench.inv("launch", "--stage", "prep")
    wait_for(lambda: bench.poll().get(f"{FAILING}/prep", {}).get("state") == "failed", 60, "the failing job")

    destination = f"{sshd.destination}:{work / 'rsync-copy'}/"
    rsync = ["rsync", "-az", "-e", sshd.rsh(), "remote", "inventories", destination]
    run_quietly(rsync)
    deploy_inv = inv_argv("deploy", "-i", "test")
    run_quietly(deploy_inv)

    noop = paired(lambda: run_quietly(deploy_inv), lambda: run_quietly(rsync), repeat)
    one_file = paired(lambda: (edit(), run_quietly(deploy_inv)), lambda: (edit(), run_quietly(rsync)), repeat)

    rerun = _rerun_failed_vs_scp(bench, work, edited, edit, run_quietly, repeat)
    return {
        "as_typed": {
            "deploy_noop_vs_rsync": noop,
            "deploy_one_file_vs_rsync": one_file,
            "deploy_rerun_failed_vs_scp_plus_ssh": rerun,
        },
        "phases": phases(bench, repeat),
    }


def _rerun_failed_vs_scp(bench: Bench, work: Path, edited: Path, edit: Callable[[], None],
                         run_quietly: Callable[[list[str]], None], repeat: int) -> dict[str, float]:
    """The edit-and-rerun loop as typed (`inv deploy rerun --failed`) against its floor by hand
    (`scp` of the edited file, then `ssh host true`), each round after the job failed again."""
    assert bench.sshd is not None
    sshd = bench.sshd
    loop_inv = inv_argv("deploy", "rerun", "--failed")  # the README's one-line form, INVOKE_INVENTORY=test
    scp_options = ["-P" if option == "-p" else option for option in sshd.ssh_options()[1:]]  # scp's port flag is -P
    scp = ["scp", "-q", *scp_options, str(edited), f"{sshd.destination}:{work / 'scp-copy.py'}"]
    ssh_true = sshd.ssh_argv("true")

    def failed_again() -> None:  # outside the timing: the relaunched job must have failed again
        wait_for(lambda: bench.poll().get(f"{FAILING}/prep", {}).get("state") == "failed", 60, "the job to fail again")

    def loop() -> None:
        edit()
        run_quietly(loop_inv)

    def seed_loop() -> None:
        edit()
        run_quietly(scp)
        run_quietly(ssh_true)

    timed_loop, timed_seed = [], []
    for _ in range(repeat):
        failed_again()
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
