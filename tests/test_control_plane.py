"""The control plane end to end: the real `inv` tasks against this machine and a real loopback sshd.

Every verb runs on each backend (`local`: subprocesses; `ssh`: over the test sshd; `slurm`: jobs sbatched on
the test cluster); a test of what the host does with a job takes ssh and Slurm (`HOST`). Stages are
benchmarks/harness/scripted_stage.py, an ordinary stage command.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from benchmarks.harness.checkout import Bench, wait_for
from tests.helpers.ctrl_c import takes_ctrl_c

SYSTEM_PYTHON = "/usr/bin/python3"
# On ssh the host's bare Python, where there is one: the control plane needs nothing but the standard library.
BARE_PYTHON = {"python": SYSTEM_PYTHON} if os.path.exists(SYSTEM_PYTHON) else {}
pytestmark = [pytest.mark.e2e, pytest.mark.backends("local", "ssh", "slurm", ssh=BARE_PYTHON)]
#: A deploy is the same on a Slurm login node as on any host (no job is submitted): local and ssh.
DEPLOY = pytest.mark.backends("local", "ssh", ssh=BARE_PYTHON)
#: What the host does with a job (a failure, a stall, a kill, a stop, a second launch) is the same host code
#: whether ssh or the local backend carries the command: ssh (the user's way in) and Slurm (its own executor).
#: The local backend's transport is held by the tests of every verb's round trip (launch, status, logs, watch).
HOST = pytest.mark.backends("ssh", "slurm", ssh=BARE_PYTHON)


def released_files(bench: Bench) -> set[str]:
    current = bench.root / "current"
    return {p.relative_to(current).as_posix() for p in current.rglob("*") if p.is_file()}


# -- deploy --------------------------------------------------------------------


@DEPLOY
def test_deploy_sends_everything_then_nothing_then_only_the_changed_file(bench: Bench) -> None:
    bench.scripted({"A": "records=1"})
    first = bench.inv("deploy")
    assert "Deployed release" in first.stdout and "0 changed" in first.stdout
    assert "remote/control_plane/supervisor.py" in released_files(bench)
    release_one = (bench.root / "current").resolve()

    again = bench.inv("deploy")
    assert "Nothing to deploy" in again.stdout
    assert (bench.root / "current").resolve() == release_one

    (bench.checkout / "remote" / "vocabulary" / "states.py").write_text(
        (bench.checkout / "remote" / "vocabulary" / "states.py").read_text() + "\n# edited\n")
    (bench.checkout / "remote" / "extra.py").write_text("VALUE = 1\n")
    changed = bench.inv("deploy")
    assert "1 added, 1 changed, 0 removed" in changed.stdout
    assert changed.stdout.count("remote/") == 2  # exactly the two paths are listed
    release_two = (bench.root / "current").resolve()
    assert release_two != release_one and release_one.exists()  # the old release is kept
    assert (release_two / "remote" / "vocabulary" / "states.py").read_text().endswith("# edited\n")
    assert (release_two / "remote/control_plane/jobs.py").stat().st_ino == (release_one / "remote/control_plane/jobs.py").stat().st_ino


@DEPLOY
def test_dry_run_lists_changes_and_sends_nothing(bench: Bench) -> None:
    bench.scripted({"A": "records=1"})
    (bench.checkout / "remote" / "obsolete.py").write_text("OLD = 1\n")
    bench.inv("deploy")
    (bench.checkout / "remote" / "obsolete.py").unlink()
    dry = bench.inv("deploy", "--dry-run")
    assert "remove remote/obsolete.py" in " ".join(dry.stdout.split())
    assert "0 added, 0 changed, 1 removed" in dry.stdout
    assert (bench.root / "current" / "remote" / "obsolete.py").exists()
    bench.inv("deploy")
    assert not (bench.root / "current" / "remote" / "obsolete.py").exists()


@DEPLOY
def test_a_syntax_error_stops_the_deploy_before_anything_is_sent(bench: Bench) -> None:
    bench.scripted({"A": "records=1"})
    (bench.checkout / "remote" / "broken.py").write_text("def oops(:\n")
    done = bench.inv("deploy", check=False)
    assert done.returncode == 2
    assert "remote/broken.py:1" in done.stderr and "Traceback" not in done.stderr
    assert not (bench.root / "current").exists()


@DEPLOY
def test_an_interrupted_deploy_leaves_the_previous_release_whole_and_the_next_completes(bench: Bench) -> None:
    from local.host import releases
    from local.host.verbs import RemoteHost
    from local.inventory.schema import load

    bench.scripted({"A": "records=1"})
    bench.inv("deploy")
    before = (bench.root / "current").resolve()
    for index in range(30):
        (bench.checkout / "remote" / f"bulk_{index}.py").write_text(f"DATA = {os.urandom(4000).hex()!r}\n")

    class CutTransport:
        """The connection drops after half of the deploy stream has gone out."""

        def __init__(self, inner):  # noqa: ANN001
            self.inner, self.name = inner, inner.name

        def run(self, command, stdin=None, stream=None):  # noqa: ANN001
            return self.inner.run(command, stdin[: len(stdin) // 2] if stdin else stdin, stream)

        def close(self) -> None:
            self.inner.close()

    inventory = load(str(bench.checkout / "inventories" / "test.yaml"))
    host = RemoteHost(inventory)
    host.transport = CutTransport(host.transport)
    diff = releases.diff(host, releases.manifest(bench.checkout))
    with pytest.raises(Exception, match="previous release is untouched"):
        releases.push(host, diff, bench.checkout)
    host.close()
    assert (bench.root / "current").resolve() == before
    assert not (before / "remote" / "bulk_0.py").exists()

    done = bench.inv("deploy")
    assert "30 added" in done.stdout
    assert (bench.root / "current" / "remote" / "bulk_29.py").exists()
    assert not list((bench.root / "releases").glob(".incoming-*"))


# -- jobs ------------------------------------------------------------------------


def test_launch_then_status_shows_succeeded_and_empty_with_counts(bench: Bench) -> None:
    bench.scripted({"A": "records=3", "B": "records=0 skip=4 reason=no-assistant-turn"})
    bench.inv("deploy")
    launched = bench.inv("launch", "--stage", "prep")
    assert "launched A/prep" in launched.stdout and "launched B/prep" in launched.stdout
    a = bench.wait_state("A/prep", {"succeeded"})
    b = bench.wait_state("B/prep", {"empty"})
    assert a["records"] == 3 and a["exit_code"] == 0
    assert b["records"] == 0 and b["skip_reasons"] == {"no-assistant-turn": 4}
    assert "zero records" in b["message"] and "no-assistant-turn" in b["message"]
    listed = bench.status()  # the real `inv status --json`
    required = {"dataset", "stage", "state", "records", "skipped", "skip_reasons", "exit_code", "release",
                "started_at", "ended_at", "message"}
    assert required <= set(listed["B/prep"]) and listed["B/prep"]["skipped"] == 4
    table = bench.inv("status", check=False)
    assert table.returncode == 1  # an empty job is a failure
    assert "succeeded" in table.stdout and "empty" in table.stdout


def test_status_says_no_jobs_yet_and_exits_zero(bench: Bench) -> None:
    bench.scripted({"A": "records=1"})
    assert "No jobs yet." in bench.inv("status").stdout  # nothing deployed yet
    launched = bench.inv("launch", "--stage", "prep", check=False)
    assert launched.returncode == 2 and "nothing is deployed to" in launched.stderr and "inv deploy" in launched.stderr
    bench.inv("deploy")
    assert "No jobs yet." in bench.inv("status").stdout


@HOST
def test_a_failed_job_shows_its_error_and_rerun_relaunches_only_the_bad_ones(bench: Bench) -> None:
    fixed = bench.root.parent / "fixed"
    bench.scripted({"good": "records=2", "bad": f"records=1 exit=3 unless={fixed}", "empty": "records=0"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    bad = bench.wait_state("bad/prep", {"failed"})
    good = bench.wait_state("good/prep", {"succeeded"})
    bench.wait_state("empty/prep", {"empty"})
    assert bad["exit_code"] == 3 and "scripted failure for bad" in bad["message"]

    fixed.write_text("")  # the user's fix
    rerun = bench.inv("rerun", "--failed", "--dataset", "bad,good")
    assert "relaunched bad/prep" in rerun.stdout
    assert "good" not in rerun.stdout and "empty/prep" not in rerun.stdout
    assert bench.wait_state("bad/prep", {"succeeded"})["records"] == 1
    after = bench.status()
    assert after["good/prep"]["started_at"] == good["started_at"]  # untouched
    assert after["empty/prep"]["state"] == "empty"  # not selected by --dataset


@HOST
def test_launching_a_running_job_again_is_refused(bench: Bench) -> None:
    bench.scripted({"A": "records=50 sleep=0.2"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    again = bench.inv("launch", "--stage", "prep")
    assert "skipped A/prep: already running" in again.stdout
    bench.inv("stop", "--all")


@HOST
def test_two_concurrent_reruns_launch_the_job_once(bench: Bench) -> None:
    bench.scripted({"A": "records=1 exit=1"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    bench.wait_state("A/prep", {"failed"})
    bench.scripted({"A": "records=30 sleep=0.2"})
    outputs: list[str] = []
    threads = [threading.Thread(target=lambda: outputs.append(bench.inv("rerun").stdout)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(out.count("relaunched A/prep") for out in outputs) == 1, outputs
    bench.inv("stop", "-d", "A")


@HOST
def test_kill_9_of_the_supervisor_or_the_stage_is_died(bench: Bench) -> None:
    bench.scripted({"A": "records=100 sleep=0.1", "B": "records=100 sleep=0.1"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    wait_for(lambda: all(bench.poll()[job].get("pid") is not None for job in ("A/prep", "B/prep")), 30,
             "both supervisors")  # on Slurm: once allocated
    os.kill(_pid(bench, "A"), signal.SIGKILL)
    if bench.backend == "slurm":  # Slurm saw the batch script die: its own end state stands
        assert "Slurm: FAILED" in bench.wait_state("A/prep", {"failed", "died"})["message"]
    else:
        assert "without an exit code" in bench.wait_state("A/prep", {"died"})["message"]
    stage_pid = _stage_pid(bench, "B")
    os.kill(stage_pid, signal.SIGKILL)
    died = bench.wait_state("B/prep", {"died"})
    assert died["signal"] == "SIGKILL"
    assert bench.inv("status", check=False).returncode == 1
    bench.inv("stop", "--all")


def _pid(bench: Bench, dataset: str) -> int:
    return json.loads((bench.job_dir(dataset) / "state.json").read_text())["pid"]


def _stage_pid(bench: Bench, dataset: str) -> int:
    """The stage's python, a grandchild of the supervisor (via /bin/sh)."""
    supervisor = _pid(bench, dataset)
    found: list[int] = []

    def child_is_there() -> bool:
        found[:] = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_descendant(int(p), supervisor)
                    and "scripted_stage.py" in _cmdline(int(p)) and "/bin/sh" not in _cmdline(int(p))]
        return bool(found)

    wait_for(child_is_there, 10, "the stage process")
    return found[0]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid == ancestor:
            return True
    return False


@HOST
def test_a_job_without_progress_is_stalled_and_rerun_restarts_it(bench: Bench) -> None:
    bench.scripted({"A": "records=1 hold=120"}, stall_after=1.5)
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    stalled = bench.wait_state("A/prep", {"stalled"}, timeout=20)
    assert "no progress" in stalled["message"]
    old_pid = _pid(bench, "A")
    assert "relaunched A/prep" in bench.inv("rerun").stdout
    wait_for(lambda: not Path(f"/proc/{old_pid}").exists(), 15, "the stalled job to end")
    bench.inv("stop", "--all")


@HOST
def test_stop_ends_the_whole_process_group_and_records_stopped(bench: Bench) -> None:
    bench.scripted({"A": "records=100 sleep=0.1 child=1"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    child_file = bench.root / "data" / "A" / "prep" / "child.pid"
    wait_for(child_file.exists, 10, "the grandchild")
    grandchild = int(child_file.read_text())
    assert "stopped A/prep" in bench.inv("stop", "-d", "A").stdout
    assert bench.status()["A/prep"]["state"] == "stopped"
    wait_for(lambda: not Path(f"/proc/{grandchild}").exists() or "Z" in _state(grandchild), 10, "the grandchild to end")
    assert "Nothing to stop" in bench.inv("stop", "--all").stdout


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_logs_show_the_tail_and_follow_ends_with_the_job(bench: Bench) -> None:
    bench.scripted({"A": "records=15 sleep=0.1"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    followed = bench.inv("logs", "A", "--follow", timeout=60)
    assert "record 15" in followed.stdout and "succeeded" in followed.stdout
    tail = bench.inv("logs", "A", "-n", "2")
    assert tail.stdout.splitlines()[0] == "record 15"
    unknown = bench.inv("logs", "Z", check=False)
    assert unknown.returncode == 2 and "unknown dataset Z" in unknown.stderr


def test_a_job_outlives_the_connection_that_launched_it(bench: Bench) -> None:
    if bench.backend != "ssh":
        pytest.skip("only SSH has a connection to drop")
    assert bench.sshd is not None
    bench.scripted({"A": "records=20 sleep=0.1"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    # `inv launch` has hung up; what is left is the connection kept for the next command (local/transport/openssh.py)
    assert bench.sshd.kill_connections() <= 1
    time.sleep(0.5)
    assert bench.wait_state("A/prep", {"succeeded"})["records"] == 20


@HOST
def test_a_job_on_an_older_release_is_marked(bench: Bench) -> None:
    bench.scripted({"A": "records=1"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    first = bench.wait_state("A/prep", {"succeeded"})
    (bench.checkout / "remote" / "extra.py").write_text("X = 2\n")
    bench.inv("deploy")
    assert bench.status()["A/prep"]["release"] == first["release"]
    table = bench.inv("status", "-i", "test")
    assert "(old)" in table.stdout


def test_status_watch_refreshes_until_interrupted(bench: Bench) -> None:
    import subprocess
    import sys
    import threading

    bench.scripted({"A": "records=10 sleep=0.2"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    bench.wait_state("A/prep", {"running"})
    # TTY_COMPATIBLE: rich draws every frame, as on a terminal (into a pipe only the last, so this test
    # waited out its deadline).
    watcher = subprocess.Popen([sys.executable, "-m", "invoke", "status", "--watch", "0.5", "-i", "test"],
                               cwd=bench.checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "COLUMNS": "200", "TTY_COMPATIBLE": "1"},
                               preexec_fn=takes_ctrl_c)
    bench.wait_state("A/prep", {"succeeded"})
    # NOTE: wait for a frame that shows the end rather than a fixed time: on a loaded machine
    # the watcher's first fetch can take longer than any sleep chosen here.
    frames: list[str] = []
    reader = threading.Thread(target=lambda: frames.extend(watcher.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not any("succeeded" in line for line in list(frames)) and time.monotonic() < deadline:
        time.sleep(0.2)
    watcher.send_signal(signal.SIGINT)
    watcher.wait(timeout=20)
    reader.join(timeout=5)
    out, err = "".join(frames), watcher.stderr.read()
    assert "Traceback" not in err
    assert "succeeded" in out.splitlines()[-2]  # the last frame shows the end, not the first fetch


def test_arguments_too_long_for_one_command_line_argument_travel_on_stdin(bench: Bench) -> None:
    # Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN): the specs of a launch of about 120 jobs.
    if bench.slurm:
        pytest.skip("the transport is SSH's, tested here; on Slurm each refused copy would query squeue")
    from local.jobs import specs
    from local.host.verbs import RemoteHost
    from local.inventory.schema import load

    bench.scripted({"A": "records=1"})
    bench.inv("deploy")
    inventory = load(str(bench.checkout / "inventories" / "test.yaml"))
    many = specs.specs(inventory, "prep", None) * 200  # one job, 200 times: started once, refused 199 times
    host, log = RemoteHost(inventory), io.BytesIO()
    try:
        results = host.call("launch", specs=many)
        bench.wait_state("A/prep", {"succeeded"})
        host.stream("logs", log, dataset="A", stage="prep", unread=many)  # a streamed verb's arguments too
    finally:
        host.close()
    assert len(json.dumps(many)) > 128 * 1024
    launched = [r for r in results if r["launched"]]  # whichever of the host's threads took the job's lock first
    assert len(results) == 200 and len(launched) == 1
    assert all(r["reason"].startswith("already running") for r in results if not r["launched"])
    assert bench.status()["A/prep"]["records"] == 1
    assert b"record 1" in log.getvalue()
