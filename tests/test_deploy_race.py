"""Two deploys at once: each says, as it ends, which release the host runs and whether it is this checkout's."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from local.tasks import deployment
from local.exceptions import AerieError
from local.host.verbs import RemoteHost
from local.inventory.schema import load
from local.transport.protocol import LocalTransport
from remote.control_plane.release import MANIFEST
from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from benchmarks.harness.process_tree import descendants, process_name


def switch_to_another_checkouts_release(root: Path) -> str:
    """What another checkout's deploy leaves: a whole release with one file edited, made current."""
    current = (root / "current").resolve()
    other = root / "releases" / "20991231-235959-0the0r00"
    subprocess.run(["cp", "-al", str(current), str(other)], check=True)  # releases share inodes, as a deploy's do
    edited = other / "remote" / "vocabulary" / "states.py"
    text = edited.read_bytes() + b"\n# another checkout's edit\n"
    edited.unlink()
    edited.write_bytes(text)
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["id"], manifest["files"]["remote/vocabulary/states.py"] = other.name, hashlib.sha256(text).hexdigest()
    (other / MANIFEST).unlink()
    (other / MANIFEST).write_text(json.dumps(manifest))
    (root / ".current.tmp").symlink_to(Path("releases") / other.name)
    os.replace(root / ".current.tmp", root / "current")
    return other.name


class SwitchedAfterApply:
    """The local transport, with another checkout's deploy switching the host right after this one's."""

    name = "localhost"

    def __init__(self, root: Path) -> None:
        self.root, self.inner = root, LocalTransport()

    def run(self, command: str, stdin: bytes | None = None, stream=None):  # noqa: ANN001, ANN201
        result = self.inner.run(command, stdin, stream)
        if " apply " in command:
            switch_to_another_checkouts_release(self.root)
        return result

    def close(self) -> None:
        pass


def test_a_deploy_replaced_by_another_before_it_ends_says_so_and_fails(tmp_path: Path) -> None:
    bench = Bench(tmp_path / "checkout", tmp_path / "root", "local")
    (tmp_path / "checkout" / "inventories").mkdir(parents=True)
    host = RemoteHost(load(str(bench.inventory({}))), transport=SwitchedAfterApply(bench.root))
    with pytest.raises(AerieError) as raised:
        deployment.deploy(host, Console(file=io.StringIO()))
    assert "another deploy replaced release" in str(raised.value)
    assert "the host runs 20991231-235959-0the0r00, not this checkout: `inv deploy` again" in str(raised.value)


@pytest.mark.e2e
def test_a_deploy_that_starts_while_another_switches_waits_for_it_and_sends_this_checkout(tmp_path: Path) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    bench.scripted({"A": "records=1"})
    bench.inv("deploy")
    ours = (bench.root / "current").resolve().name
    with open(bench.root / ".deploy.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another checkout's deploy, about to switch
        deploying = subprocess.Popen([sys.executable, "-m", "invoke", "deploy", "-i", "test"], cwd=bench.checkout,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "COLUMNS": "200"})
        # NOTE: without the shared lock this deploy reads the release being replaced and ends at once, saying
        # "Nothing to deploy ... identical to this checkout" while the host is about to run the other edit.
        wait_for(lambda: deploying.poll() is not None
                 or any(process_name(pid) == "flock" for pid in descendants(deploying.pid)), 60, "the deploy to read")
        theirs = switch_to_another_checkouts_release(bench.root)
    out, err = deploying.communicate(timeout=120)
    assert deploying.returncode == 0, out + err
    assert "Nothing to deploy" not in out and "0 added, 1 changed, 0 removed" in out, out
    live = (bench.root / "current").resolve().name
    assert live != theirs and f"Deployed release {live} to " in out and "1 changed, 0 removed; it is live." in out
    # This checkout's files are live: a new release, or, when both deploys fell in one second, its own
    # first release again (an id is the second and the files' digest).
    states = Path("remote") / "vocabulary" / "states.py"
    assert (bench.root / "current" / states).read_bytes() == (bench.checkout / states).read_bytes()
