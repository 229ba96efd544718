"""Slurm figures, against a throwaway single-node cluster and loopback sshd.

- launch of 40 jobs on Slurm (one remote command, 40 `sbatch`), as a ratio to the
  SSH backend's launch of the same 40 jobs (40 supervisors started on the host);
- status of those 40 Slurm jobs (one remote command, one `squeue`), as a ratio to
  `ssh host true`.

Both backends are reached over the same sshd, so the ratios compare the work on
the host, not the transports.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_control import JOBS, once
from benchmarks.harness.pairing import median_seconds
from local.jobs import specs
from local.inventory.schema import load
from benchmarks.harness.checkout import SAMPLES, SCRIPTED, Bench, copy_checkout, wait_for
from benchmarks.harness.slurm_cluster import start_cluster
from benchmarks.harness.sshd import start_server


def inventory(bench: Bench, backend: str, env: dict[str, str]) -> None:
    assert bench.sshd is not None
    server = bench.sshd
    document = {
        "backend": backend,
        "host": {"address": server.address, "port": server.port, "user": server.user, "identity": str(server.identity),
                 "known_hosts": str(server.known_hosts), "ssh_config": str(server.ssh_config), "root": str(bench.root),
                 "python": sys.executable, "env": env},
        "stages": {"prep": {"command": f"{{python}} {SCRIPTED}"}},
        "datasets": {f"D{i:02d}": {"source": "records=1", "kind": "native", "sample": str(SAMPLES["native"])}
                     for i in range(JOBS)},
    }
    if backend == "slurm":
        document["slurm"] = {"partition": "debug", "time": "5"}
    (bench.checkout / "inventories" / "test.yaml").write_text(yaml.safe_dump(document))


def launch_seconds(bench: Bench) -> tuple[float, int]:
    prep_specs = specs.specs(load(str(bench.checkout / "inventories" / "test.yaml")), "prep", None)
    commands = once(bench, lambda h: h.call("launch", specs=prep_specs, force=True))
    seconds = 0.0
    wait_for(lambda: sum(j["state"] == "succeeded" for j in bench.poll().values()) == JOBS, 300, "40 jobs")
    seconds = median_seconds(lambda: once(bench, lambda h: h.call("launch", specs=prep_specs, force=True)), 1)
    wait_for(lambda: sum(j["state"] == "succeeded" for j in bench.poll().values()) == JOBS, 300, "40 jobs again")
    return seconds, commands


def run(repeat: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        cluster = start_cluster(work / "slurm", cpus=2)
        sshd = start_server(work / "sshd")
        try:
            ssh_bench = Bench(copy_checkout(work / "ssh-checkout"), work / "ssh-root", "ssh", sshd)
            slurm_bench = Bench(copy_checkout(work / "slurm-checkout"), work / "slurm-root", "slurm", sshd)
            inventory(ssh_bench, "ssh", {})
            inventory(slurm_bench, "slurm", cluster.env)
            for bench in (ssh_bench, slurm_bench):
                bench.inv("deploy")
            ssh_launch, _ = launch_seconds(ssh_bench)
            slurm_launch, slurm_commands = launch_seconds(slurm_bench)
            ssh_true = median_seconds(lambda: __import__("subprocess").run(sshd.ssh_argv("true"), check=True), repeat)
            status_commands = once(slurm_bench, lambda h: h.call("status"))
            status = median_seconds(lambda: once(slurm_bench, lambda h: h.call("status")), repeat)
        finally:
            sshd.stop()
            cluster.stop()
    return {
        "launch_40_jobs": {"remote_commands": slurm_commands, "slurm_seconds": slurm_launch, "ssh_backend_seconds": ssh_launch,
                           "ratio_to_ssh_backend": slurm_launch / ssh_launch},
        "status_40_jobs": {"remote_commands": status_commands, "seconds": status, "ssh_true_s": ssh_true,
                           "ratio_to_ssh_true": status / ssh_true},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
