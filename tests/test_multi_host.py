"""Several SSH hosts in one inventory: two real loopback sshd, each with its own root."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from benchmarks.harness.checkout import SAMPLES, SCRIPTED, Bench, copy_checkout, wait_for
from benchmarks.harness.sshd import SshServer

pytestmark = pytest.mark.e2e


def host_entry(server: SshServer, root: Path) -> dict:
    return {"address": server.address, "port": server.port, "user": server.user, "identity": str(server.identity),
            "known_hosts": str(server.known_hosts), "ssh_config": str(server.ssh_config), "root": str(root),
            "connect_timeout": 5}


@pytest.fixture
def two_hosts(tmp_path: Path, sshd: SshServer, ssh_server_factory) -> tuple[Bench, dict[str, SshServer]]:  # noqa: ANN001
    second = ssh_server_factory(identity=sshd.identity)
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root-g1", "ssh", sshd)
    servers = {"g1": sshd, "g2": second}
    document = {
        "backend": "ssh",
        "hosts": {name: host_entry(server, tmp_path / f"root-{name}") for name, server in servers.items()},
        "stages": {"prep": {"command": f"{{python}} {SCRIPTED}"}},
        "datasets": {
            "A": {"source": "records=2", "kind": "native", "sample": str(SAMPLES["native"])},
            "B": {"source": "records=3", "kind": "native", "sample": str(SAMPLES["native"])},
            "C": {"source": "records=4", "kind": "native", "sample": str(SAMPLES["native"]), "host": "g1"},
        },
    }
    (bench.checkout / "inventories" / "test.yaml").write_text(yaml.safe_dump(document))
    return bench, servers


def test_deploy_goes_to_every_host_and_status_merges_them(two_hosts) -> None:  # noqa: ANN001
    bench, _ = two_hosts
    root = {name: bench.root.parent / f"root-{name}" for name in ("g1", "g2")}
    deployed = bench.inv("deploy")
    assert deployed.stdout.count("Deployed release") == 2
    assert (root["g1"] / "current").exists() and (root["g2"] / "current").exists()

    bench.inv("launch", "--stage", "prep")
    # C is pinned to g1; A and B are spread: g2 takes A, then g1 and g2 tie and g1 takes B.
    wait_for(lambda: (root["g2"] / "jobs" / "A" / "prep" / "state.json").exists(), 20, "A on g2")
    assert {p.name for p in (root["g1"] / "jobs").iterdir()} == {"B", "C"}

    def all_done() -> bool:
        listed = json.loads(bench.inv("status", "--json", check=False).stdout)
        return len(listed) == 3 and all(j["state"] == "succeeded" for j in listed)

    wait_for(all_done, 60, "three jobs on two hosts")
    listed = {j["dataset"]: j for j in json.loads(bench.inv("status", "--json").stdout)}
    assert {d: (j["host"], j["records"]) for d, j in listed.items()} == {"A": ("g2", 2), "B": ("g1", 3), "C": ("g1", 4)}
    table = bench.inv("status").stdout
    assert "host" in table.splitlines()[2] and "g2" in table


def test_a_host_that_is_down_is_reported_in_its_rows_without_failing_the_others(two_hosts) -> None:  # noqa: ANN001
    bench, servers = two_hosts
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    servers["g2"].stop()
    started = time.monotonic()
    done = bench.inv("status", "--json", check=False)
    assert time.monotonic() - started < 15
    assert done.returncode == 1
    listed = json.loads(done.stdout)
    down = [j for j in listed if j["state"] == "unreachable"]
    assert len(down) == 1 and down[0]["host"] == "g2" and "connection refused" in down[0]["message"]
    assert {j["dataset"] for j in listed if j.get("host") == "g1"} == {"B", "C"}

    deploy = bench.inv("deploy", check=False)
    assert deploy.returncode == 2 and "failed on g2" in deploy.stderr
    assert "Nothing to deploy" in deploy.stdout  # g1 went ahead


def test_run_goes_on_with_the_reachable_hosts_and_names_the_one_that_is_down(two_hosts) -> None:  # noqa: ANN001
    bench, servers = two_hosts
    path = bench.checkout / "inventories" / "test.yaml"
    document = yaml.safe_load(path.read_text())
    document["stages"] = {stage: {"command": f"{{python}} {SCRIPTED}"} for stage in ("prep", "extract", "train")}
    path.write_text(yaml.safe_dump(document))
    bench.inv("deploy")
    servers["g2"].stop()

    done = bench.inv("run", check=False)

    assert done.returncode != 0
    assert "failed on g2 (not started:" in done.stderr and "connection refused" in done.stderr
    assert "pipeline started on" in done.stdout  # g1 went ahead
    assert "GiB free on " in done.stdout  # the room on its root, said at the run's start
    runner = bench.root.parent / "root-g1" / "jobs" / "pipeline" / "run" / "state.json"
    wait_for(runner.exists, 20, "g1's runner")
