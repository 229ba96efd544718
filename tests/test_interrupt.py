"""Ctrl-C on a live view, typed at a real terminal (a pseudo-terminal from Python's pty module): the table ends
with the terminal whole, one line says that the run goes on and how to follow and stop it, the exit status is
130 (the shell's for SIGINT), and the run goes on on the host. Ctrl-C during a deploy leaves a whole release live.

Real parts: the tasks as typed, the runner and the supervisor on this machine (backend local); every stage is
benchmarks/harness/scripted_stage.py (tests/test_pipeline.py's inventory)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from local.tasks import deployment
from tests.helpers.ctrl_c import takes_ctrl_c
from tests.helpers.pipelines import pipeline_inventory

pytestmark = pytest.mark.e2e

HIDE_CURSOR, SHOW_CURSOR = b"\x1b[?25l", b"\x1b[?25h"


def on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, int]:
    """`argv` started on a new pseudo-terminal of 120 x 40 (its session's controlling terminal, as a shell's
    job is): its pid and the terminal's master side."""
    pid, master = pty.fork()
    if pid == 0:  # the child: never returns
        os.chdir(cwd)
        os.environ.pop("COLUMNS", None)
        os.environ.pop("TTY_COMPATIBLE", None)
        takes_ctrl_c()
        os.execv(argv[0], argv)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    return pid, master


def read_until(master: int, screen: bytearray, wanted: bytes, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while wanted not in screen and time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            try:
                screen += os.read(master, 65536)
            except OSError:  # EIO: the child has ended and closed the terminal
                return wanted in screen
    return wanted in screen


def read_to_the_end(master: int, screen: bytearray, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen += chunk


def exit_status(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    return None


@pytest.mark.parametrize("backend", ["local", "ssh"])
def test_ctrl_c_on_run_follow_exits_130_with_one_line_and_the_run_goes_on(
        request: pytest.FixtureRequest, tmp_path: Path, free_port: int, backend: str) -> None:
    # over SSH, the terminal's SIGINT reaches the ssh client of a status request in flight too
    sshd = request.getfixturevalue("sshd") if backend == "ssh" else None
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", backend, sshd)
    plans = tmp_path / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native"})
    (plans / "A.extract").write_text("records=600 sleep=0.5")  # minutes: it runs long after the Ctrl-C
    bench.inv("deploy")

    pid, master = on_a_terminal([sys.executable, "-m", "invoke", "run", "--follow", "-i", "test"], bench.checkout)
    screen, code = bytearray(), None
    try:
        assert read_until(master, screen, b"A/extract", 120), bytes(screen)
        bench.wait_state("A/extract", {"running"}, timeout=120)
        os.write(master, b"\x03")  # Ctrl-C as typed: the terminal sends SIGINT to its foreground process group
        read_to_the_end(master, screen, 60)
        code = exit_status(pid, 60)

        text = bytes(screen).decode(errors="replace")
        said = ("aerie: stopped watching; the run goes on on the host: `inv status --watch -i test` follows it, "
                "`inv stop --all -i test` stops it")
        assert code == 130, text
        assert text.count(said) == 1 and "Traceback" not in text, text
        assert text.rstrip().endswith(said), "the line comes last, after the table"
        assert screen.rfind(SHOW_CURSOR) > screen.rfind(HIDE_CURSOR), "the cursor was left hidden"

        jobs = bench.poll()
        assert (jobs["pipeline/run"]["state"], jobs["A/extract"]["state"]) == ("running", "running")
        time.sleep(1.5)
        assert bench.poll()["A/extract"]["records"] > jobs["A/extract"]["records"], "the run stood still"
        watched = interrupted([sys.executable, "-m", "invoke", "status", "--watch", "-i", "test"], bench.checkout)
        assert (watched[0], plain(watched[1].rstrip().splitlines()[-1])) == (130, (
            "aerie: stopped watching; the jobs go on on the host: `inv status --watch -i test` follows them, "
            "`inv stop --all -i test` stops them")), watched[1]  # the line's own command follows the run
        assert watched[1].rfind(SHOW_CURSOR.decode()) > watched[1].rfind(HIDE_CURSOR.decode())
        logs = interrupted([sys.executable, "-m", "invoke", "logs", "A", "--stage", "extract", "--follow", "-i", "test"],
                           bench.checkout, shown=b"record")
        assert (logs[0], plain(logs[1].rstrip().splitlines()[-1])) == (130, (
            "aerie: stopped following the log; the job goes on on the host: `inv logs A --follow -i test` follows it, "
            "`inv stop -d A -i test` stops it")), logs[1]
    finally:
        if code is None and exit_status(pid, 0.5) is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(master)
        stopped = bench.inv("stop", "--all", check=False)  # the line's own command; never a run left behind
    assert "stopped pipeline/run" in stopped.stdout


def plain(line: str) -> str:
    """A line without its terminal's control sequences (the cursor shown again, colours) and the `^C` the
    terminal echoes where the cursor was."""
    return re.sub(r"\x1b\[[?0-9;]*[A-Za-z]", "", line).removeprefix("^C")


def interrupted(argv: list[str], cwd: Path, shown: bytes = b"running") -> tuple[int | None, str]:
    """`argv` on a terminal, Ctrl-C once it has shown `shown` (a table: perhaps while its first frame is still
    being drawn): its exit status and all it wrote."""
    pid, master = on_a_terminal(argv, cwd)
    screen, code = bytearray(), None
    try:
        read_until(master, screen, shown, 60)
        os.write(master, b"\x03")
        read_to_the_end(master, screen, 60)
        code = exit_status(pid, 60)
    finally:
        if code is None and exit_status(pid, 0.5) is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(master)
    return code, bytes(screen).decode(errors="replace")


def whole(root: Path) -> str:
    """The live release's id, once every file its manifest names is there with its digest."""
    release = (root / "current").resolve()
    manifest = json.loads((release / ".aerie-release.json").read_text())
    for path, digest in manifest["files"].items():
        assert hashlib.sha256((release / path).read_bytes()).hexdigest() == digest, f"{release.name}: {path} torn"
    return release.name


def test_ctrl_c_during_a_deploy_leaves_the_live_release_whole_and_says_so(tmp_path: Path) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    shipped = bench.checkout / "big"
    shipped.mkdir()
    (shipped / "blob.bin").write_bytes(b"small")
    bench.inventory({"A": {"source": "x", "kind": "native"}}, deploy={"ship": ["big"]})
    bench.inv("deploy")
    before = whole(bench.root)
    (shipped / "blob.bin").write_bytes(os.urandom(4 << 20))

    # NOTE: the host's side of a deploy takes the root's deploy lock first (two deploys take turns; a reader of
    # the live manifest shares it): shared here, it holds this deploy in the middle of its push, so that Ctrl-C
    # comes there, not before or after it.
    with open(bench.root / ".deploy.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        deploy = subprocess.Popen([sys.executable, "-m", "invoke", "deploy", "-i", "test"], cwd=bench.checkout,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                  env={**os.environ, "COLUMNS": "200"},
                                  preexec_fn=takes_ctrl_c)
        wait_for(lambda: deploy.poll() is not None or agent_applying(bench.root), 120, "the deploy to push")
        os.killpg(deploy.pid, signal.SIGINT)  # as a terminal's Ctrl-C: inv and the host's side of the deploy alike
        out, err = deploy.communicate(timeout=60)

    assert deploy.returncode == 130, out + err
    assert err.splitlines() == [f"aerie: {deployment.INTERRUPTED}"]
    assert whole(bench.root) == before
    again = bench.inv("deploy")  # as the line says: it sends what is missing
    assert "it is live" in again.stdout
    assert whole(bench.root) != before and (bench.root / "current" / "big" / "blob.bin").stat().st_size == 4 << 20


def agent_applying(root: Path) -> bool:
    """Whether the host's side of a deploy to `root` has started (and waits for the deploy lock)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"apply" in words and str(root).encode() in words:
            return True
    return False
