"""Running the real tasks as a user does, for the tests and the benchmarks: a copy of the checkout, inventories, `inv` in a subprocess."""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from local.host.verbs import RemoteHost
from local.inventory.schema import load
from benchmarks.harness.sshd import SshServer

REPO = Path(__file__).resolve().parents[2]
#: What a user's checkout holds that the tasks need (tests and the venv stay behind).
CHECKOUT_PARTS = ("tasks.py", "invoke.yaml", "pyproject.toml", "local", "remote", "inventories")
SCRIPTED = Path(__file__).resolve().parent / "scripted_stage.py"
SAMPLES = {"native": REPO / "inventories/samples/sharegpt.jsonl", "prompts": REPO / "inventories/samples/prompts_alpaca.jsonl"}


def compile_checkout() -> None:
    """Cache the bytecode of the checkout's Python, for `copy_checkout` to carry (needed where
    PYTHONDONTWRITEBYTECODE kept Python from caching it)."""
    for part in CHECKOUT_PARTS:
        source = REPO / part
        if source.is_dir():
            compileall.compile_dir(source, quiet=2)
        elif source.suffix == ".py":
            compileall.compile_file(source, quiet=2)


def copy_checkout(target: Path) -> Path:
    """A private copy of the checkout, so a test may edit remote/ and deploy the change.

    The bytecode Python cached for the checkout comes along, the sources' times kept: Python takes
    it as current, so a copy's first `inv` does not compile aerie's modules again (an edited module,
    its time and size changed, is compiled afresh). Nothing deployed carries it: a deploy sends sources.
    """
    target.mkdir(parents=True, exist_ok=True)
    for part in CHECKOUT_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, target / part)
        else:
            shutil.copy2(source, target / part)
    return target


@dataclass
class Bench:
    """One test's checkout and host: write an inventory, run `inv`, look at the host's root."""

    checkout: Path
    root: Path
    backend: str
    sshd: SshServer | None = None
    python: str = sys.executable
    slurm: Any = None
    """The test cluster, for backend slurm (its `env` reaches the login node's commands)."""
    host_settings: dict[str, Any] = field(default_factory=dict)
    """More `host:` keys for every inventory this bench writes."""

    def inventory(self, datasets: dict[str, Any], stages: dict[str, Any] | None = None, **extra: Any) -> Path:
        host: dict[str, Any] = {"root": str(self.root), "python": self.python}
        if self.backend == "ssh":
            assert self.sshd is not None
            host.update(address=self.sshd.address, port=self.sshd.port, user=self.sshd.user,
                        identity=str(self.sshd.identity), known_hosts=str(self.sshd.known_hosts),
                        ssh_config=str(self.sshd.ssh_config), connect_timeout=5)
        host.update(self.host_settings)
        for entry in datasets.values():  # what `inv validate` (run by every deploy) reads here
            entry.setdefault("sample", str(SAMPLES[entry["kind"]]))
        if self.backend == "slurm":
            host["env"] = self.slurm.env
            extra = {"slurm": {"partition": self.slurm.partition, "time": "5"}, **extra}
        document = {"backend": self.backend, "host": host, "datasets": datasets, "stages": stages or {}, **extra}
        path = self.checkout / "inventories" / "test.yaml"
        path.write_text(yaml.safe_dump(document))
        return path

    def scripted(self, datasets: dict[str, str], stage: str = "prep", stall_after: float = 600) -> Path:
        """An inventory whose `stage` runs benchmarks/harness/scripted_stage.py; `datasets` maps name to its plan."""
        command = f"{{python}} {SCRIPTED}"
        return self.inventory(
            {name: {"source": plan, "kind": "native"} for name, plan in datasets.items()},
            {stage: {"command": command, "stall_after": stall_after}},
        )

    def inv(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`inv ARGS -i test` from the checkout, as a user would type it."""
        argv = [sys.executable, "-m", "invoke", *args]
        if "-i" not in args and "--inventory" not in args and args[0] not in ("--list", "--version"):
            argv += ["-i", "test"]
        env = {**os.environ, "COLUMNS": "200"}  # wide enough that rich truncates no cell
        done = subprocess.run(argv, cwd=self.checkout, capture_output=True, text=True, timeout=timeout, env=env)
        if check and done.returncode != 0:
            raise AssertionError(f"inv {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def status(self) -> dict[str, dict[str, Any]]:
        """`inv status --json`, keyed by "dataset/stage"."""
        done = self.inv("status", "--json", check=False)
        assert done.returncode in (0, 1), done.stderr
        return {f"{job['dataset']}/{job['stage']}": job for job in json.loads(done.stdout)}

    def poll(self) -> dict[str, dict[str, Any]]:
        """What the host's `status` verb answers, asked from this process (cheap enough to poll), keyed by
        "dataset/stage". On the local backend the verb's own function runs here, its answer through JSON as
        the wire carries it: the same code as `python -m remote status`, without a Python started per poll
        (a test that waits polls hundreds of times). Over SSH and Slurm, the verb itself."""
        if self.backend == "local" and not self.host_settings.get("env"):
            from remote.__main__ import status

            answer = json.loads(json.dumps(status({"root": str(self.root)})))
        else:
            host = RemoteHost(load(str(self.checkout / "inventories" / "test.yaml")))
            try:
                answer = host.call("status")
            finally:
                host.close()
        return {f"{job['dataset']}/{job['stage']}": job for job in answer["jobs"]}

    def wait_state(self, job: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal seen
            seen = self.poll().get(job, {})
            return seen.get("state") in states

        wait_for(reached, timeout, f"{job} to reach {states}")
        return seen

    def job_dir(self, dataset: str, stage: str = "prep") -> Path:
        return self.root / "jobs" / dataset / stage


#: The pause between polls grows from the first to the last: a poll may be an SSH connection and a Python
#: on the host, and on a loaded machine the polls of a long wait cost more than what it waits for.
POLL_PAUSES = (0.1, 0.5)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, every: float | None = None) -> None:
    """Poll `predicate` until it holds; `every`: a fixed pause instead, to catch a state that lasts less than the
    longest (a phase of a second)."""
    deadline = time.monotonic() + timeout
    pause, longest = (every, every) if every else POLL_PAUSES
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(pause)
        pause = min(pause * 1.5, longest)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
