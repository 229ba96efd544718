"""The host side under faults: a killed supervisor, two runs of one job, a full disk, corrupt job files.

These drive the host's own functions (remote.control_plane.jobs, `python -m remote`'s verbs) on a
root whose release is this checkout, with the real supervisor and
benchmarks/harness/scripted_stage.py as the stage: no SSH and no deploy, so each takes seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import remote.__main__
from remote.control_plane import jobs, pool
from remote.control_plane.logfile import CappedLog
from remote.vocabulary.states import JobState
from remote.control_plane.store import JobStore
from benchmarks.harness.checkout import REPO, SCRIPTED, wait_for

#: Tests that start real supervisors and stages (seconds each): the end-to-end tier.
E2E = pytest.mark.e2e


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "current").symlink_to(REPO)  # this checkout is the release
    return root


def spec(dataset: str, plan: str, command: str | None = None) -> dict[str, Any]:
    return {"dataset": dataset, "stage": "prep", "command": command or f"{{python}} {SCRIPTED}", "source": plan,
            "kind": "native", "stall_after": 600, "executor": "process", "config": {}}


def state_of(root: Path, dataset: str) -> dict[str, Any]:
    return next(j for j in jobs.status(root)["jobs"] if j["dataset"] == dataset)


def record(root: Path, dataset: str) -> dict[str, Any]:
    return json.loads((root / "jobs" / dataset / "prep" / "state.json").read_text())


def is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int, needle: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            pgrp = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[2])
        except OSError:
            continue
        if pgrp == pid and needle in cmdline and int(entry) != pid:
            found.append(int(entry))
    return found


def wait_ended(root: Path, dataset: str, timeout: float = 60) -> dict[str, Any]:
    wait_for(lambda: JobState(state_of(root, dataset)["state"]).is_terminal(), timeout, f"{dataset} to end")
    return state_of(root, dataset)


# -- process groups ------------------------------------------------------------


@E2E
def test_the_stage_dies_with_its_supervisor(root: Path) -> None:
    jobs.launch(root, spec("A", "records=1000 sleep=0.1"))
    supervisor = record(root, "A")["pid"]
    stage: list[int] = []
    wait_for(lambda: bool(stage.extend(descendants(supervisor, "scripted_stage.py")) or stage), 15, "the stage")
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not any(is_running(p) for p in stage), 10, "the stage to die with its supervisor")
    assert state_of(root, "A")["state"] == "died"


@E2E
def test_stop_and_rerun_end_what_a_killed_supervisor_left_running(root: Path) -> None:
    jobs.launch(root, spec("A", "records=1000 sleep=0.1 child=1"))
    child_file = root / "data" / "A" / "prep" / "child.pid"
    wait_for(child_file.exists, 15, "the stage's child")
    grandchild = int(child_file.read_text())
    os.kill(record(root, "A")["pid"], signal.SIGKILL)
    wait_for(lambda: state_of(root, "A")["state"] == "died", 10, "A to be died")
    assert "still runs" in state_of(root, "A")["message"]
    assert jobs.stop(root, "A", "prep")["stopped"]
    wait_for(lambda: not is_running(grandchild), 10, "stop to end the left-over group")
    assert state_of(root, "A")["state"] == "stopped"

    # The same through a rerun: the old group ends before the new run starts.
    jobs.launch(root, spec("B", "records=1000 sleep=0.1 child=1"))
    child_file = root / "data" / "B" / "prep" / "child.pid"
    wait_for(child_file.exists, 15, "B's child")
    grandchild = int(child_file.read_text())
    os.kill(record(root, "B")["pid"], signal.SIGKILL)
    # NOTE: kill returns before the kernel has ended the supervisor; a rerun of a live one is refused.
    wait_for(lambda: state_of(root, "B")["state"] == "died", 10, "B to be died")
    relaunched = remote.__main__.rerun({"root": str(root), "datasets": ["B"], "specs": {"B/prep": spec("B", "records=1")}})
    assert [r["dataset"] for r in relaunched if r["launched"]] == ["B"]
    assert not is_running(grandchild)
    assert wait_ended(root, "B")["state"] == "succeeded"


def test_two_runs_of_a_job_never_take_each_others_temporary_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from remote.prep.normalise import Record
    from remote.prep.preparer import Prepared, Summary
    from remote.prep.tokenise import Tokens
    from remote.prep.write import OutputWriter

    def batch(name: str, width: int) -> Prepared:
        tokens = Tokens(np.full(width, 7, dtype=np.int32), np.ones(width, dtype=np.int8),
                        np.zeros(width, dtype=bool))
        return Prepared([Record(name, [{"role": "user", "content": name}])], [tokens], Summary())

    monkeypatch.setenv("AERIE_RUN", "first")
    first = OutputWriter(tmp_path, "native", shard_size=1)
    first(batch("first-0", 3))
    monkeypatch.setenv("AERIE_RUN", "second")
    second = OutputWriter(tmp_path, "native", shard_size=1)  # a rerun while the first run still writes
    second(batch("second-0", 5))
    first(batch("first-1", 3))  # the first run's shard 1, written before the second writes its own
    second(batch("second-1", 5))
    second.commit({})
    import pyarrow.parquet as pq

    ids = [i for name in ("tokens-00000.parquet", "tokens-00001.parquet")
           for i in pq.read_table(tmp_path / name).column("id").to_pylist()]
    assert ids == ["second-0", "second-1"]
    with pytest.raises(FileNotFoundError):
        first.commit({})  # its files were cleared: it cannot publish a mix


# -- a full disk -----------------------------------------------------------------


FILL = ("import os, pathlib; from remote.control_plane.scratch import temporary_name; "
        "out = pathlib.Path(os.environ['AERIE_OUTPUT']); "
        "f = open(out / temporary_name('conversations.jsonl'), 'wb'); "
        "[f.write(b'x' * 65536) or f.flush() for _ in iter(int, 1)]")


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@E2E
def test_a_full_disk_is_failed_with_no_space_left_and_the_temporary_files_are_removed(small_disk: Path) -> None:
    root = small_disk / "root"
    root.mkdir()
    (root / "current").symlink_to(REPO)
    jobs.launch(root, spec("A", "", command=f"{{python}} -c {json.dumps(FILL)}"))
    ended = wait_ended(root, "A")
    assert ended["state"] == "failed", ended
    assert "no space left" in ended["message"], ended
    output = root / "data" / "A" / "prep"
    assert not [p.name for p in output.iterdir() if p.name.startswith(".tmp-")]


# -- corrupt job files -------------------------------------------------------------

CORRUPTIONS = {
    "a directory where state.json was": lambda d: (d / "state.json").mkdir(),
    "an unknown state": lambda d: (d / "state.json").write_text('{"state": "exploded", "pid": 1}'),
    "binary bytes in progress.json": lambda d: ((d / "state.json").write_text('{"state": "succeeded"}'),
                                                (d / "progress.json").write_bytes(b"\xff\xfe\x00garbage")),
    "JSON of the wrong type": lambda d: (d / "state.json").write_text('[1, 2, 3]'),
    "a half-written state.json": lambda d: (d / "state.json").write_text('{"state": "running", "pid": 12'),
    "a pid that is not a number": lambda d: (d / "state.json").write_text('{"state": "running", "pid": "abc"}'),
}


def test_every_corrupt_job_is_listed_broken_with_its_reason_beside_a_good_one(root: Path) -> None:
    good = root / "jobs" / "A" / "prep"
    good.mkdir(parents=True)
    (good / "state.json").write_text(json.dumps({"dataset": "A", "stage": "prep", "state": "succeeded"}))
    for index, corrupt in enumerate(CORRUPTIONS.values()):
        bad = root / "jobs" / f"B{index}" / "prep"
        bad.mkdir(parents=True)
        corrupt(bad)
    shown = {j["dataset"]: j for j in jobs.status(root)["jobs"]}
    assert shown.pop("A")["state"] == "succeeded"
    reasons = [job["message"] for job in shown.values() if job["state"] == "broken"]
    assert reasons == [
        "broken: state.json is a directory, not a file",
        "broken: state.json has an unknown state 'exploded'",
        "broken: progress.json holds bytes that are not UTF-8 text",
        "broken: state.json holds a JSON list, not an object",
        "broken: state.json is not valid JSON (torn or half-written?): Expecting ',' delimiter at byte 30",
        "broken: state.json: pid 'abc' is not a process id",
    ]


@E2E
@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_one_corrupt_job_is_listed_broken_and_status_and_rerun_carry_on(root: Path, corruption: str) -> None:
    good = root / "jobs" / "A" / "prep"
    good.mkdir(parents=True)
    (good / "state.json").write_text(json.dumps({"dataset": "A", "stage": "prep", "state": "succeeded"}))
    (good / "progress.json").write_text(json.dumps({"records": 3}))
    bad = root / "jobs" / "B" / "prep"
    bad.mkdir(parents=True)
    CORRUPTIONS[corruption](bad)

    shown = {j["dataset"]: j for j in jobs.status(root)["jobs"]}
    assert shown["A"]["state"] == "succeeded" and shown["A"]["records"] == 3
    assert shown["B"]["state"] == "broken" and shown["B"]["message"].startswith("broken: "), shown["B"]

    relaunched = remote.__main__.rerun({"root": str(root), "specs": {"B/prep": spec("B", "records=2")}})
    assert [r["dataset"] for r in relaunched if r["launched"]] == ["B"]
    assert wait_ended(root, "B")["state"] == "succeeded"


def test_the_host_command_answers_with_a_broken_job_listed(root: Path) -> None:
    bad = root / "jobs" / "B" / "prep"
    bad.mkdir(parents=True)
    (bad / "state.json").write_bytes(b"\x00\x01")
    done = subprocess.run([sys.executable, "-m", "remote", "status", json.dumps({"root": str(root)})],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from remote.vocabulary.wire import decode

    assert [j["state"] for j in decode(done.stdout)["jobs"]] == ["broken"]


# -- many jobs at once -----------------------------------------------------------------


@E2E
def test_a_launch_of_many_jobs_answers_before_their_supervisors_start_and_all_run(root: Path) -> None:
    answer = remote.__main__.launch({"root": str(root), "specs": [spec(f"J{i}", "records=2") for i in range(4)]})
    assert [r["launched"] for r in answer] == [True] * 4 and all(r["where"].startswith("starting") for r in answer)
    for i in range(4):
        assert wait_ended(root, f"J{i}", timeout=90)["state"] == "succeeded"
        # NOTE: a supervisor writes its last state just before it exits; until it has, a relaunch is refused.
        wait_for(lambda: not is_running(record(root, f"J{i}")["pid"]), 10, f"J{i}'s supervisor to exit")
    again = remote.__main__.launch({"root": str(root), "force": True,  # over succeeded jobs: `inv launch --force`
                                    "specs": [spec("J0", "records=1 hold=120"), spec("J1", "records=1 hold=120")]})
    refused = remote.__main__.launch({"root": str(root), "specs": [spec("J0", "records=1"), spec("J1", "records=1")]})
    assert [r["launched"] for r in again] == [True, True] and [r["launched"] for r in refused] == [False, False]
    assert all("already running" in r["reason"] for r in refused)
    for i in range(2):
        jobs.stop(root, f"J{i}", "prep")


def test_each_works_every_job_at_once_in_order_and_raises_a_failure_after_the_rest() -> None:
    import threading

    together = threading.Barrier(8, timeout=10)  # one at a time would never let it pass

    def work(index: int) -> int:
        if index < 8:
            together.wait()
        return index * index

    assert pool.each(work, list(range(20))) == [i * i for i in range(20)]

    done: list[int] = []

    def fails_once(index: int) -> None:
        if index == 3:
            raise OSError("No space left on device")
        done.append(index)

    with pytest.raises(OSError, match="No space left"):
        pool.each(fails_once, list(range(20)))
    assert sorted(done) == [i for i in range(20) if i != 3]  # one job's failure never skips another's
    assert pool.each(fails_once, []) == []


def test_the_host_s_status_and_launch_load_only_what_they_use(tmp_path: Path) -> None:
    # Every `inv status` and `inv launch` starts Python on the host. concurrent.futures (with the logging
    # it imports) took longer to import than 40 jobs took to record; typing is 5-10% of the host's
    # status; a dataclass would bring inspect.
    probe = ("import sys; import remote.__main__; from remote.control_plane import pool; print(pool.each(abs, [-1, -2]), "
             "remote.__main__.status({'root': sys.argv[1]})['jobs'], "
             "sorted(m for m in ('concurrent.futures', 'logging', 'typing', 'inspect', 'dataclasses') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-S", "-c", probe, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[1, 2] [] []"


def test_a_relaunch_of_the_same_spec_leaves_its_file_as_it_is_and_a_new_spec_replaces_it(tmp_path: Path) -> None:
    store, directory = JobStore(tmp_path), tmp_path / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    first = spec("A", "records=1")
    store.prepare(directory, first)
    written = (directory / "spec.json").stat()
    store.prepare(directory, json.loads(json.dumps(first)))  # as it comes back from the workstation
    assert (directory / "spec.json").stat().st_ino == written.st_ino
    changed = spec("A", "records=2")
    store.prepare(directory, changed)
    assert (directory / "spec.json").stat().st_ino != written.st_ino and store.spec(directory) == changed
    (directory / "spec.json").write_bytes(b"\xff{")  # a torn or foreign file is replaced, never kept
    store.prepare(directory, changed)
    assert store.spec(directory) == changed


@E2E
def test_a_job_whose_starter_died_before_starting_it_is_died_and_can_be_rerun(root: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    directory = root / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    (directory / "spec.json").write_text(json.dumps(spec("A", "records=1")))
    (directory / "state.json").write_text(json.dumps({
        "dataset": "A", "stage": "prep", "executor": "process", "state": "running", "stall_after": 600,
        "starting": {"pid": gone.pid, "pid_start": "1"}, "started_at": 1.0}))
    died = state_of(root, "A")
    assert died["state"] == "died" and "its starter" in died["message"]
    assert [r["launched"] for r in remote.__main__.rerun({"root": str(root)})] == [True]
    assert wait_ended(root, "A")["state"] == "succeeded"


def test_corrupt_job_files_never_take_down_a_deploys_pruning(root: Path) -> None:
    import runpy

    for index, corrupt in enumerate(CORRUPTIONS.values()):
        bad = root / "jobs" / f"B{index}" / "prep"
        bad.mkdir(parents=True)
        corrupt(bad)
    (root / "jobs" / "stray-file").write_text("not a dataset directory")
    live = root / "jobs" / "A" / "prep"
    live.mkdir(parents=True)
    (live / "state.json").write_text(json.dumps({"state": "running", "release": "r1"}))
    agent = runpy.run_path(str(REPO / "remote" / "control_plane" / "release.py"), run_name="agent")  # run as deploy sends it
    assert agent["in_use"](str(root)) == {"r1"}


def _apply(agent: dict[str, Any], root: Path, release_id: str, files: dict[str, bytes]) -> dict[str, Any]:
    """One `release.py apply`, as a deploy sends it: a JSON line, then a gzip tar of the files."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    line = json.dumps({"id": release_id, "send": list(files), "keep": 5,
                       "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}).encode()
    stdin, out = sys.stdin, io.StringIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(line + b"\n" + archive.getvalue()))
    try:
        with contextlib.redirect_stdout(out):
            code = agent["main"](["apply", str(root)])
    finally:
        sys.stdin = stdin
    return {"code": code, **json.loads(out.getvalue().split("<aerie-payload>")[1].split("</aerie-payload>")[0])}


def test_the_same_release_deployed_again_within_its_second_is_kept_and_made_live(tmp_path: Path) -> None:
    # The id is the second and the files' digest: deploy X, another checkout switches to Y, X again in
    # the same second. The rename onto X's own release failed (Directory not empty) and the deploy with it.
    import runpy

    agent = runpy.run_path(str(REPO / "remote" / "control_plane" / "release.py"), run_name="agent")
    ours, theirs = {"remote/a.py": b"A = 1\n"}, {"remote/a.py": b"A = 2\n"}
    assert _apply(agent, tmp_path, "20261201-000000-aaaa", ours)["code"] == 0
    assert _apply(agent, tmp_path, "20261201-000000-bbbb", theirs)["code"] == 0
    again = _apply(agent, tmp_path, "20261201-000000-aaaa", ours)
    assert again["code"] == 0 and again["id"] == "20261201-000000-aaaa"
    assert (tmp_path / "current").resolve().name == "20261201-000000-aaaa"
    assert (tmp_path / "current" / "remote" / "a.py").read_bytes() == b"A = 1\n"
    assert [p.name for p in (tmp_path / "releases").iterdir() if p.name.startswith(".incoming")] == []
    # An id whose release holds other files is refused, and the live release stays.
    refused = _apply(agent, tmp_path, "20261201-000000-aaaa", {"remote/a.py": b"A = 3\n"})
    assert refused["code"] == 1 and "exists with other files" in refused["error"]
    assert (tmp_path / "current" / "remote" / "a.py").read_bytes() == b"A = 1\n"
    # A release torn by a prune killed halfway (its manifest gone) is replaced, not taken for this one.
    torn = tmp_path / "releases" / "20261201-000000-bbbb"
    (torn / ".aerie-release.json").unlink()
    assert _apply(agent, tmp_path, "20261201-000000-bbbb", theirs)["code"] == 0
    assert (tmp_path / "current" / "remote" / "a.py").read_bytes() == b"A = 2\n"


def test_the_logs_end_line_is_written_before_the_end_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `inv logs --follow` stops at the end state: the log must hold its last line by then.
    from remote.control_plane import supervisor

    directory = tmp_path / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    log = directory / "log"
    seen_at_end: list[str] = []

    def write_state(path: Path, state: dict[str, Any]) -> None:
        seen_at_end.append(log.read_text())

    ran = supervisor.Supervisor(directory)
    ran.output, ran.run_id, ran.log = tmp_path / "data", "run-1", CappedLog(log, None)
    monkeypatch.setattr(supervisor, "write_state_last", write_state)
    assert ran._finish({"state": "running"}, 0) == JobState.EMPTY  # no progress file: no records
    assert len(seen_at_end) == 1 and "[aerie] empty: exit 0, 0 records" in seen_at_end[0]


def _ended_between_read_and_check(root: Path, running: dict[str, Any], ended: dict[str, Any]) -> tuple[Path, Any]:
    """A job read while running, whose supervisor then recorded its end (`ended`) and exited: the
    record on disk is the final one, the one in hand is not."""
    directory = root / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(json.dumps(running))
    read_first = jobs.JobStore(root).read(directory)
    (directory / "state.json").write_text(json.dumps(ended))
    return directory, read_first


def test_a_job_that_ends_between_status_s_read_and_its_liveness_check_is_not_called_died(root: Path) -> None:
    # Seen in CI on Slurm: `bad/prep` failed with exit code None, "without the supervisor's record". On one
    # host the same interleaving read `died`, which `rerun --failed` relaunches and `inv run` blocks on.
    gone = subprocess.Popen(["true"])
    gone.wait()
    base = {"dataset": "A", "stage": "prep", "executor": "process", "pid": gone.pid, "pgid": gone.pid,
            "pid_start": "1", "started_at": 1.0, "stall_after": 600}
    directory, read_first = _ended_between_read_and_check(
        root, {**base, "state": "running"}, {**base, "state": "failed", "exit_code": 3, "ended_at": 2.0})
    shown = jobs.describe(directory, 3.0, job=read_first)
    assert (shown["state"], shown["exit_code"]) == ("failed", 3)
    again, reading = jobs.read(read_first, 3.0)
    assert (reading.state, again.state["exit_code"]) == (JobState.FAILED, 3)


def test_a_slurm_job_that_ends_between_status_s_read_and_slurm_s_answer_keeps_its_record(root: Path) -> None:
    from remote.control_plane.slurm import SlurmJob

    base = {"dataset": "A", "stage": "prep", "executor": "slurm", "slurm_job_id": "7", "started_at": 1.0,
            "stall_after": 600}
    directory, read_first = _ended_between_read_and_check(
        root, {**base, "state": "running"}, {**base, "state": "failed", "exit_code": 3, "ended_at": 2.0,
                                               "message": "scripted failure for A"})
    views = {"slurm": {"7": SlurmJob("7", "FAILED", node="n1", exit_code=3, source="jobcomp")}}
    shown = jobs.describe(directory, 3.0, views, job=read_first)
    assert (shown["state"], shown["exit_code"]) == ("failed", 3)
    assert "without the supervisor's record" not in shown["message"]


# -- whose process it is ------------------------------------------------------------------


@pytest.fixture
def bystander() -> Any:
    """An unrelated process leading a session of its own (a tmux session, a login shell, another
    user's run): what a recorded pid may belong to after a reboot."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def _records_of(process: subprocess.Popen[bytes]) -> dict[str, dict[str, Any]]:
    """Records naming `process`'s pid that it cannot satisfy: each must make aerie leave it alone."""
    from remote.control_plane import processes

    real = processes.identity(process.pid)
    return {
        "only a pid, as older releases recorded the server": {"pid": process.pid},
        "the pid handed on (another start time)": {**real, "pid_start": "1"},
        "another boot, with the same start time": {**real, "boot_id": "0000-another-boot"},
    }


@pytest.mark.parametrize("case", ["only a pid, as older releases recorded the server",
                                  "the pid handed on (another start time)", "another boot, with the same start time"])
def test_the_pipelines_server_record_never_gets_a_process_that_is_not_ours_signalled(
        tmp_path: Path, bystander: subprocess.Popen[bytes], case: str, capsys: pytest.CaptureFixture[str]) -> None:
    from remote.control_plane import inference_server

    record = tmp_path / "server.json"
    record.write_text(json.dumps(_records_of(bystander)[case]))
    managed = inference_server.ManagedServer({"command": "sleep 300", "url": "http://127.0.0.1:9/v1"}, tmp_path / "log", record)
    assert managed.stop() is None
    assert bystander.poll() is None
    assert "is not our server" in capsys.readouterr().out and not record.exists()


@pytest.mark.parametrize("case", ["the pid handed on (another start time)", "another boot, with the same start time"])
def test_a_job_record_of_a_process_that_is_not_ours_is_never_signalled(bystander: subprocess.Popen[bytes],
                                                                       case: str) -> None:
    from remote.control_plane import processes

    state = {**_records_of(bystander)[case], "pgid": bystander.pid, "state": "running", "executor": "process"}
    assert not processes.is_ours(state)
    assert not processes.end_group(state, grace=0.1)
    assert not jobs.executors.of(state).cancel(state)
    assert bystander.poll() is None


def test_a_job_recorded_before_a_reboot_is_died_whatever_its_pid_is_now(root: Path, bystander: subprocess.Popen[bytes]) -> None:
    from remote.control_plane import processes

    directory = root / "jobs" / "A" / "prep"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(json.dumps({
        "dataset": "A", "stage": "prep", "executor": "process", "state": "running", "stall_after": 600,
        **processes.identity(bystander.pid), "boot_id": "0000-another-boot", "pgid": bystander.pid,
        "started_at": 1.0}))
    shown = state_of(root, "A")
    assert shown["state"] == "died" and "the host has rebooted" in shown["message"]
    assert not jobs.stop(root, "A", "prep")["stopped"]
    assert bystander.poll() is None


def test_a_process_is_ours_only_with_its_start_time_and_boot(bystander: subprocess.Popen[bytes]) -> None:
    from remote.control_plane import processes

    assert processes.is_ours(processes.identity(bystander.pid))
    assert processes.is_ours({k: v for k, v in processes.identity(bystander.pid).items() if k != "boot_id"})
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not processes.is_ours({"pid": gone.pid})  # no start time proves nothing, even of a pid that is free


# -- stopped only by `inv stop` ------------------------------------------------------------


@E2E
@pytest.mark.parametrize("target", ["supervisor", "stage"])
def test_a_sigterm_not_from_inv_stop_ends_the_job_died_with_the_signal_named_and_rerun_relaunches_it(
        root: Path, target: str) -> None:
    # systemd at shutdown, an operator's `kill`: not a stop the user asked for, so `inv status` must
    # exit non-zero and `inv rerun --failed` must pick the job up.
    jobs.launch(root, spec("A", "records=1000 sleep=0.1"))
    supervisor = record(root, "A")["pid"]
    stage: list[int] = []
    wait_for(lambda: bool(stage.extend(descendants(supervisor, "scripted_stage.py")) or stage), 15, "the stage")
    os.kill(supervisor if target == "supervisor" else stage[0], signal.SIGTERM)
    ended = wait_ended(root, "A")
    assert (ended["state"], ended["signal"]) == ("died", "SIGTERM"), ended
    assert ended["message"].startswith("killed by SIGTERM, not by `inv stop`"), ended["message"]
    assert JobState(ended["state"]).is_bad()
    wait_for(lambda: not is_running(supervisor), 10, "the supervisor to exit")
    relaunched = remote.__main__.rerun({"root": str(root), "specs": {"A/prep": spec("A", "records=1")}})
    assert [r["dataset"] for r in relaunched if r["launched"]] == ["A"]
    assert wait_ended(root, "A")["state"] == "succeeded"


@E2E
def test_inv_stop_ends_the_job_stopped_and_its_request_does_not_outlive_the_run(root: Path) -> None:
    jobs.launch(root, spec("A", "records=1000 sleep=0.1"))
    wait_for(lambda: state_of(root, "A")["records"] > 0, 15, "A to write")
    assert jobs.stop(root, "A", "prep")["stopped"]
    ended = wait_ended(root, "A")
    assert ended["state"] == "stopped" and not JobState.STOPPED.is_bad(), ended
    wait_for(lambda: not is_running(record(root, "A")["pid"]), 10, "the supervisor to exit")
    jobs.launch(root, spec("A", "records=1000 sleep=0.1"))  # a new run: a later SIGTERM is not that stop
    assert not (root / "jobs" / "A" / "prep" / "stop.json").exists()
    wait_for(lambda: state_of(root, "A")["records"] > 0, 15, "A to write again")
    os.kill(record(root, "A")["pid"], signal.SIGTERM)
    assert wait_ended(root, "A")["state"] == "died"


# -- a job's last words ---------------------------------------------------------------------


@E2E
def test_a_failed_jobs_error_keeps_its_last_words_in_its_state(root: Path) -> None:
    long_line = "infer C3: " + "120 of 83288 prompts not answered, " * 30 + "continues where this stopped"
    huge_line = "x" * 100_000 + " the very end"
    for name, line in (("A", long_line), ("B", huge_line)):
        command = f"{{python}} -c {json.dumps(f'import sys; print({line!r}); sys.exit(3)')}"
        jobs.launch(root, spec(name, "", command=command))
    for name, line in (("A", long_line), ("B", huge_line)):
        ended = wait_ended(root, name)
        message = record(root, name)["message"]
        assert ended["state"] == "failed" and ended["message"] == message
        assert message.endswith(line[-2000:]) and len(message) <= 8192
    assert record(root, "A")["message"] == f"exit 3: {long_line}"
    assert record(root, "B")["message"].startswith("exit 3: …x")


def test_a_slurm_job_cancelled_by_anyone_but_inv_stop_is_died() -> None:
    from remote.control_plane import slurm_jobs
    from remote.control_plane.slurm import SlurmJob

    cancelled = SlurmJob("7", "CANCELLED by 0", node="n1", source="jobcomp")
    state = {"slurm_job_id": "7", "stall_after": 600, "started_at": 1.0}
    for recorded, seen in (("running", JobState.DIED), ("died", JobState.DIED), ("stopped", JobState.STOPPED)):
        shown, note = slurm_jobs.effective({**state, "state": recorded}, {}, 2.0, cancelled)
        assert shown == seen and note.startswith("Slurm: CANCELLED on n1"), (recorded, shown, note)
        assert ("not by `inv stop`" in note) == (seen == JobState.DIED)


@pytest.mark.parametrize("case", ["the pid handed on (another start time)", "another boot, with the same start time"])
def test_evals_leftover_server_record_never_gets_a_process_that_is_not_ours_signalled(
        tmp_path: Path, bystander: subprocess.Popen[bytes], case: str) -> None:
    import remote.stages.eval

    record = tmp_path / "server.json"
    record.write_text(json.dumps(_records_of(bystander)[case]))
    remote.stages.eval.stop_leftover_server(record)
    assert bystander.poll() is None and not record.exists()
