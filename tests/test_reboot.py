"""After a host reboot: aerie signals only processes that prove they are its own, and resumes the rest.

The reboot is simulated the way it looks from the job store: every job's process group
and the pipeline's inference server SIGKILLed, and the server's recorded pid given to
an unrelated process (a `sleep` in a session of its own, as a tmux session or a login
shell would be). Then `inv rerun --failed`, through the real tasks over the loopback sshd
(what it proves is the host's; the local backend's transport is test_control_plane.py's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.checkout import SCRIPTED, Bench, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.backends("ssh")]


def pipeline_inventory(bench: Bench, plans: Path, port: int) -> None:
    """One prompts dataset (prep, infer under the managed server, tokenize, extract) and train, every stage
    the scripted one; the "server" is Python's http.server."""
    plans.mkdir(exist_ok=True)
    (plans / "health").write_text("ok")
    command = f"{{python}} {SCRIPTED} {plans}"
    stages = {name: {"command": command} for name in ("prep", "extract", "train")}
    stages["infer"] = {"command": command, "server_url": f"http://127.0.0.1:{port}/v1", "server_start_timeout": 30,
                       "server_command": f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {plans}"}
    bench.inventory({"A": {"source": "A.data", "kind": "prompts"}}, stages)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def is_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_rerun_after_a_reboot_never_signals_the_process_that_took_the_servers_pid(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port)
    (plans / "A.infer").write_text("records=1 hold=300")  # the server is up while an infer job runs
    bench.inv("deploy")
    bench.inv("run")
    bench.wait_state("A/infer", {"running"}, timeout=90)
    record_path = bench.root / "jobs" / "pipeline" / "server.json"
    server = json.loads(record_path.read_text())

    # The reboot: every job's group and the server end at once, without a word to their records.
    groups = [json.loads((bench.root / "jobs" / key / "state.json").read_text())["pgid"]
              for key in ("pipeline/run", "A/infer")]
    for pgid in [*groups, server["pid"]]:
        kill_group(pgid)
    wait_for(lambda: all(is_gone(p) for p in [*groups, server["pid"]]), 10, "the 'reboot' to end everything")
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)  # another user's session leader
    try:
        record_path.write_text(json.dumps({**server, "pid": bystander.pid}))  # the pid, handed on
        (plans / "A.infer").write_text("records=1")

        status = bench.inv("status", check=False)
        assert status.returncode == 1 and "died" in status.stdout, status.stdout
        assert "relaunched pipeline/run" in bench.inv("rerun", "--failed").stdout
        bench.wait_state("pipeline/run", {"succeeded", "failed", "died", "stopped"}, timeout=120)
        jobs = bench.poll()
        assert {k: j["state"] for k, j in jobs.items()} == {
            "A/prep": "succeeded", "A/infer": "succeeded", "A/tokenize": "succeeded", "A/extract": "succeeded",
            "draft/train": "succeeded", "pipeline/run": "succeeded"}
        assert bystander.poll() is None, f"aerie signalled a process it did not start (it ended {bystander.returncode})"
        runner_log = (bench.root / "jobs" / "pipeline" / "run" / "log").read_text()
        assert "is not our server (that pid is another process now): left alone, never signalled" in runner_log
        assert not record_path.exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_inv_stop_of_a_pipeline_stops_its_inference_server_too(bench: Bench, free_port: int) -> None:
    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port)
    (plans / "A.infer").write_text("records=1 hold=300")
    bench.inv("deploy")
    bench.inv("run")
    bench.wait_state("A/infer", {"running"}, timeout=90)
    server = json.loads((bench.root / "jobs" / "pipeline" / "server.json").read_text())
    try:
        bench.inv("stop", "--all")
        jobs = bench.poll()
        assert jobs["pipeline/run"]["state"] == "stopped" and jobs["A/infer"]["state"] == "stopped", jobs
        wait_for(lambda: is_gone(server["pid"]), 20, "the server to be stopped with its runner")
        assert not (bench.root / "jobs" / "pipeline" / "server.json").exists()
    finally:
        if not is_gone(server["pid"]):  # it failed: leave nothing running on the machine
            kill_group(server["pid"])
