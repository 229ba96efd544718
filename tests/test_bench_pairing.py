"""`inv bench --against REF`: the pairing of this checkout's commands with REF's, and a bad REF refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.run
from benchmarks.harness.pairing import against_ref
from benchmarks.harness.ref_checkout import archive, resolve
from local.exceptions import AerieError

REPO = Path(__file__).resolve().parents[1]


class Clock:
    """A clock that moves only when a side's command says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_against_ref_runs_ref_then_this_in_turn_each_after_ready_and_quotes_this_over_ref() -> None:
    clock, cpu, order = Clock(), Clock(), []
    took = {"ref": iter([2.0, 2.0, 4.0]), "this": iter([3.0, 6.0, 4.0])}
    used = {"ref": iter([1.0, 1.0, 1.0]), "this": iter([1.0, 1.5, 0.5])}

    def side(name: str) -> None:
        order.append(name)
        clock.now += next(took[name])
        cpu.now += next(used[name])

    figures = against_ref(lambda: side("this"), lambda: side("ref"), 3, ready=lambda: order.append("ready"), clock=clock,
                          meters={"cpu": cpu})

    assert order == ["ready", "ref", "ready", "this"] * 3
    # pair by pair: wall 3/2, 6/2, 4/4; CPU 1/1, 1.5/1, 0.5/1
    assert figures == {"seconds": 4.0, "ref_seconds": 2.0, "ratio": 1.5, "ratio_min": 1.0, "ratio_max": 3.0,
                       "cpu_ratio": 1.0, "cpu_ratio_min": 0.5, "cpu_ratio_max": 1.5}


def test_inv_bench_against_an_unknown_ref_fails_in_one_line_before_measuring_anything() -> None:
    done = subprocess.run([sys.executable, "-m", "invoke", "bench", "--only", "control,loop", "--against", "no-such-ref"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("aerie: --against 'no-such-ref' names no commit of this repository")


@pytest.mark.parametrize("name", ["", "--all", "HEAD~100000"])
def test_a_ref_that_names_no_commit_is_refused(name: str) -> None:
    with pytest.raises(AerieError, match="names no commit"):
        resolve(name)


def test_against_is_refused_for_a_suite_that_times_nothing_as_typed() -> None:
    with pytest.raises(AerieError, match=r"as-typed suites only \(control, loop\), not view: `inv bench --only control,loop"):
        benchmarks.run.run(["loop", "view"], against="HEAD")


def test_a_ref_checkout_holds_the_commits_files_and_only_what_a_users_checkout_holds(tmp_path: Path) -> None:
    ref = resolve("HEAD")
    checkout = archive(ref, tmp_path / "ref")
    committed = subprocess.run(["git", "-C", str(REPO), "show", f"{ref.commit}:tasks.py"], capture_output=True,
                               check=True).stdout
    assert (checkout / "tasks.py").read_bytes() == committed
    held = {path.name for path in checkout.iterdir()} - {"__pycache__"}  # bytecode compiled, as after a first `inv`
    assert held == {"tasks.py", "invoke.yaml", "pyproject.toml", "local", "remote", "inventories"}
