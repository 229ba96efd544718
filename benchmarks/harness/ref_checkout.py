"""The checkout of another commit beside this one (`inv bench --against REF`): the "before" of a before/after.

It holds what a user's checkout holds (`CHECKOUT_PARTS`, taken from REF with `git archive`) and runs
with the same venv, over the same sshd, deployed to a host root of its own: only the code differs.
"""

from __future__ import annotations

import compileall
import io
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.checkout import CHECKOUT_PARTS, REPO, Bench
from local.exceptions import AerieError


@dataclass(frozen=True)
class Ref:
    """A commit to measure against: as the user named it, and the commit it names."""

    name: str
    commit: str


def resolve(name: str) -> Ref:
    """The commit `name` names in this repository; one line naming the fix when it names none."""
    done = None
    if name and not name.startswith("-"):  # never an option of git's
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                              capture_output=True, text=True)
    if done is None or done.returncode != 0:
        raise AerieError(f"--against {name!r} names no commit of this repository ({REPO}): give a commit, "
                         f"branch or tag that `git show` knows, e.g. `--against HEAD~1`")
    return Ref(name, done.stdout.strip())


def archive(ref: Ref, target: Path) -> Path:
    """REF's checkout parts unpacked under `target`, its bytecode compiled (as after a user's first command)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", ref.commit],
                            capture_output=True, text=True, check=True).stdout.split()
    parts = [part for part in CHECKOUT_PARTS if part in listed]
    tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref.commit, "--", *parts],
                         capture_output=True, check=True).stdout
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as unpacked:
        unpacked.extractall(target, filter="data")
    compileall.compile_dir(target, quiet=1)
    return target


@dataclass
class RefBench(Bench):
    """REF's checkout and host root; it reads its jobs with its own `inv status --json`, since the host
    code it deployed may answer this checkout's reader in another shape."""

    ref: Ref = field(kw_only=True)

    def poll(self) -> dict[str, dict[str, Any]]:
        return self.status()


def ref_bench(ref: Ref, this: Bench, work: Path) -> RefBench:
    """REF's checkout under `work`, on `this` bench's sshd, with a host root of its own."""
    checkout = archive(ref, work / "ref-checkout")
    return RefBench(checkout, work / "ref-root", this.backend, this.sshd, this.python, ref=ref)
