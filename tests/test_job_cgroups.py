"""A job's processes, all of them: where the host has a writable cgroup v2 tree, each job runs in a cgroup
of its own, so `inv stop` ends a child that left the job's process group (`setsid`) and ignores SIGTERM;
elsewhere the job is its process group, and `inv check` says which one the host gets.

Real parts: the loopback sshd, the tasks as typed, the supervisor and the kernel's cgroups (this machine is
the host); the stage is a script that leaves its process group the way a daemonising tool does.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from benchmarks.harness.checkout import Bench, copy_checkout, wait_for
from remote import preflight
from remote.control_plane import cgroups
from remote.control_plane.processes import end_group, process_start

ESCAPER = '''\
"""A stage whose grandchild leaves the job's session (setsid), ignores SIGTERM and keeps writing."""
import os, signal, sys, time
pid_file = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork():
        os._exit(0)
    with open(pid_file + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    while True:
        with open(pid_file + ".beat", "w") as out:
            out.write(str(time.time()))
        time.sleep(0.2)
os.wait()
while True:
    time.sleep(1)
'''


def _no_cgroups_reason() -> str | None:
    ok, why = cgroups.probe()
    return None if ok else why


@pytest.mark.e2e
def test_inv_stop_ends_a_child_that_called_setsid_and_ignores_sigterm(tmp_path: Path, sshd) -> None:  # noqa: ANN001
    why = _no_cgroups_reason()
    if why:
        pytest.skip(f"this host has no cgroup of its own for a job ({why}): a job is its process group there")
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "ssh", sshd)
    escaper, pid_file = tmp_path / "escaper.py", tmp_path / "escaped.pid"
    escaper.write_text(ESCAPER)
    bench.inventory({"A": {"source": "a.data", "kind": "native"}}, {"prep": {"command": f"{{python}} {escaper} {pid_file}"}})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep", "-d", "A")
    wait_for(pid_file.exists, 30, "the escaped grandchild")
    escaped = int(pid_file.read_text())
    state = json.loads((bench.job_dir("A") / "state.json").read_text())
    assert state["cgroup"] and Path(state["cgroup"]).name.startswith("aerie-A.prep.")
    assert escaped in cgroups.members(state)  # it left the group, not the cgroup
    assert os.getpgid(escaped) != state["pgid"]

    assert "stopped A/prep" in bench.inv("stop", "-d", "A", timeout=60).stdout
    assert process_start(escaped) is None  # gone (or a zombie), not writing on
    beat = (tmp_path / "escaped.pid.beat").stat().st_mtime
    time.sleep(1)
    assert (tmp_path / "escaped.pid.beat").stat().st_mtime == beat
    assert bench.poll()["A/prep"]["state"] == "stopped"
    assert not Path(state["cgroup"]).exists()  # removed once empty


def test_inv_check_says_which_way_this_host_ends_a_jobs_processes() -> None:
    result = preflight.job_processes()
    why = _no_cgroups_reason()
    if why is None:
        assert result["status"] == "ok" and "each job in a cgroup of its own" in result["detail"]
    else:
        assert result["status"] == "warn" and "each job is its process group" in result["detail"] and why in result["detail"]


def test_without_a_cgroup_v2_mount_a_job_is_its_process_group_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("24 1 0:21 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")
    monkeypatch.setattr(cgroups, "MOUNTINFO", mountinfo)
    assert cgroups.where() == (None, "no cgroup v2 mounted") and cgroups.probe() == (False, "no cgroup v2 mounted")
    assert cgroups.enter("A.prep.run-1") is None
    assert cgroups.members({"cgroup": "/sys/fs/cgroup/unified/aerie-A.prep.run-1"}) == []


def test_a_recorded_cgroup_that_is_not_one_of_aerie_s_is_never_signalled() -> None:
    mount = cgroups.mount_point()
    if mount is None:
        pytest.skip("no cgroup v2 mounted here")
    for path in (str(mount), str(mount / "system.slice"), str(mount / "x" / ".." / "aerie-y"), "/tmp/aerie-x"):
        assert cgroups.recorded({"cgroup": path}) is None, path


def test_the_empty_cgroup_of_a_job_killed_with_its_stage_is_removed_when_it_is_ended() -> None:
    parent, why = cgroups.where()
    if parent is None:
        pytest.skip(f"no cgroup for a job here: {why}")
    left = parent / f"aerie-A.prep.test-{os.getpid()}"
    left.mkdir()
    try:
        record = {"pid": 2 ** 22 + 1, "pid_start": "1", "cgroup": str(left)}  # a supervisor long gone
        assert end_group(record) is False
        assert not left.exists()
    finally:
        if left.exists():
            left.rmdir()


LAUNCHER = '''\
"""A launcher in a job cgroup of aerie's (as the pipeline runner is): it submits one job and says where all is."""
import json, os, sys
from pathlib import Path
from remote.control_plane import cgroups
from remote.control_plane.executors import ProcessExecutor
mine = cgroups.enter(f"pipeline.run.test-{os.getpid()}")
directory = Path(sys.argv[1])
submitted = ProcessExecutor().submit(directory, {"dataset": "A", "stage": "prep", "stall_after": 60}, Path(sys.argv[2]), [])
print(json.dumps({"launcher": mine, "job": json.loads((directory / "state.json").read_text())}))
cgroups.leave(mine)
'''


def test_a_job_started_by_a_launcher_in_a_cgroup_is_out_of_it_before_its_supervisor_runs(tmp_path: Path) -> None:
    """Stopping the pipeline runner signals its cgroup: a job it has just started must not be in it then,
    or the job dies with the runner while its supervisor is still starting (and reads `died`, not `stopped`)."""
    import fcntl
    import signal
    import subprocess
    import sys

    parent, why = cgroups.where()
    if parent is None:
        pytest.skip(f"no cgroup for a job here: {why}")
    release = Path(__file__).resolve().parents[1]
    directory = tmp_path / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    with open(directory / "launch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # its supervisor waits for the launcher's lock: it stays starting
        said = subprocess.run([sys.executable, str(tmp_path / "launcher.py"), str(directory), str(release)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(release)},
                              timeout=60, check=True)
        where = json.loads(said.stdout)
        job = where["job"]
        try:
            assert job["cgroup"] and job["cgroup"] != where["launcher"]
            assert cgroups.members(job) == [job["pid"]], "the job's supervisor, alone in a cgroup of its own"
            # The runner stopped now: every process left in its cgroup is signalled, as `inv stop` does.
            cgroups.signal_all({"cgroup": where["launcher"]}, signal.SIGTERM)
            time.sleep(0.5)
            assert os.path.exists(f"/proc/{job['pid']}"), "the starting supervisor died with its launcher"
        finally:
            end_group(job, grace=2)
            for path in (where["launcher"], job["cgroup"]):
                if path and os.path.isdir(path):
                    os.rmdir(path)
