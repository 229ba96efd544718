"""Checked states: extract keeps each file's size and checksum, every reader checks them, a bad file is
named in one line and its shard redone; and a full disk ends a stage and the runner in one line.

The stages run as the supervisor runs them (subprocesses over a root whose jobs are recorded), the
full-disk tests on a small tmpfs mounted for them (skipped, saying why, where mounting is refused).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import remote.__main__
from remote import preflight
from remote.control_plane import disk, jobs
from remote.vocabulary.states import JobState
from remote.eagle3 import shards
from remote.eagle3.shards import BadState, ShardStore, load_sample
from benchmarks.harness.checkout import REPO, wait_for
from benchmarks.harness.stage_settings import complete
from tests.pipeline_fixtures import (
    EXTRACT_SETTINGS, extracted, make_records, run_stage, stage_env, tiny_target, vocab_size, write_prep,
)

__all__ = ["extracted", "tiny_target"]  # fixtures used below

E2E = pytest.mark.e2e
TRAIN_SETTINGS = {"draft_vocab_size": 200, "epochs": 1, "batch_size": 2, "ttt_steps": 2, "eval_records": 1}


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_bits(path: Path) -> None:
    """4 KiB of flipped bytes in the file's middle (the hidden states' tensors): it still loads."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle - min(2048, middle // 2), middle + min(2048, middle // 2)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS: dict[str, Callable[[Path], None]] = {"truncated": truncate, "bit-flipped": flip_bits}


def record_job(root: Path, dataset: str, stage: str, state: str) -> Path:
    directory = root / "jobs" / dataset / stage
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "state.json").write_text(json.dumps({"dataset": dataset, "stage": stage, "executor": "process",
                                                      "state": state, "exit_code": 0, "stall_after": 600}))
    return directory


def extract_into(root: Path, extracted: dict) -> dict[str, str]:
    """The session's extraction of 10 records (`extracted`: the extract stage run once) copied under `root`,
    for a test to read or damage; the extract stage's environment there, to run it again."""
    assert extracted["result"].returncode == 0, extracted["result"].stderr
    for stage in ("prep", "extract"):  # not what other tests made of it since (test_train trains there)
        shutil.copytree(extracted["root"] / "data" / "A1" / stage, root / "data" / "A1" / stage)
    shared = json.loads(extracted["env"]["AERIE_CONFIG"])["inventory"]  # the tiny target it was extracted with
    return stage_env(root, "extract", EXTRACT_SETTINGS, shared)


# -- what extract keeps, and what a reader checks ----------------------------------------------------


def test_every_shard_keeps_each_files_size_and_checksum_and_a_clean_read_passes(tmp_path: Path, extracted: dict) -> None:
    env = extract_into(tmp_path, extracted)
    store = ShardStore(Path(env["AERIE_OUTPUT"]))
    for index in store.complete_shards():
        meta = store.meta(index)
        assert meta["checksum"] == shards.ALGORITHM == "xxh3_64"
        for name, size, sum_ in zip(meta["files"], meta["sizes"], meta["sums"]):
            path = store.shard_dir(index) / name
            assert path.stat().st_size == size
            assert shards.checksum(path.read_bytes()) == sum_
            assert set(load_sample(path)) == {"id", "input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
    assert shards.verify(store.root) == {"files": 10, "bytes": sum(p.stat().st_size for p in store.sample_files())}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_bad_file_is_named_in_one_line_and_its_shard_marked_for_extract_again(tmp_path: Path, extracted: dict,
                                                                                corruption: str) -> None:
    env = extract_into(tmp_path, extracted)
    job = record_job(tmp_path, "A1", "extract", "succeeded")
    out = Path(env["AERIE_OUTPUT"])
    bad = out / "shard-00001" / "data_000000005.ckpt"
    CORRUPTIONS[corruption](bad)

    with pytest.raises(BadState) as raised:
        load_sample(bad)

    line = str(raised.value)
    assert len(line.splitlines()) == 1
    assert str(bad) in line and "shard shard-00001 of dataset A1" in line and "inv rerun --failed" in line
    assert ("truncated" in line) == (corruption == "truncated")
    assert not (out / "shard-00001").exists() and (out / ".shard-00001.tmp").is_dir()  # a torn shard: redone alone
    assert not (out / "manifest.json").exists()
    recorded = json.loads((job / "state.json").read_text())
    assert recorded["state"] == "failed" and str(bad) in recorded["message"]
    assert ShardStore(out).complete_shards() == [0, 2]


def test_verify_finds_a_bad_file_among_good_ones(tmp_path: Path, extracted: dict) -> None:
    env = extract_into(tmp_path, extracted)
    out = Path(env["AERIE_OUTPUT"])
    flip_bits(out / "shard-00002" / "data_000000009.ckpt")
    with pytest.raises(BadState, match="data_000000009.ckpt does not match its xxh3_64 checksum"):
        shards.verify(out)


def test_shards_from_before_checksums_are_refused_with_extract_again(tmp_path: Path, extracted: dict) -> None:
    env = extract_into(tmp_path, extracted)
    out = Path(env["AERIE_OUTPUT"])
    meta = out / "shard-00000" / "meta.json"
    old = {k: v for k, v in json.loads(meta.read_text()).items() if k in ("shard", "files", "ids")}
    meta.write_text(json.dumps(old))

    with pytest.raises(BadState, match="has no checksums .extracted by an older aerie.*extract .* again"):
        ShardStore(out).sample_files()
    assert ShardStore(out).complete_shards() == [1, 2]


def test_the_hosts_check_verifies_a_datasets_states_on_demand(tmp_path: Path, extracted: dict) -> None:
    extract_into(tmp_path, extracted)
    [good] = preflight.states(tmp_path, ["A1"])
    assert good["name"] == "states A1" and good["status"] == "ok" and good["detail"].startswith("10 files")
    truncate(tmp_path / "data" / "A1" / "extract" / "shard-00000" / "data_000000001.ckpt")
    [bad] = preflight.states(tmp_path, ["A1"])
    assert bad["status"] == "fail" and "data_000000001.ckpt is" in bad["detail"] and "truncated" in bad["detail"]
    [redo] = preflight.states(tmp_path, ["A1"])  # marked for extract again: nothing left to verify
    assert redo["status"] == "warn" and "has not succeeded" in redo["detail"]


# -- through the train stage -------------------------------------------------------------------------


@E2E
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_train_fails_in_one_line_on_a_bad_file_and_extract_again_restores_a_clean_runs_states(
        tmp_path: Path, tiny_target: Path, extracted: dict, corruption: str) -> None:
    env = extract_into(tmp_path, extracted)
    record_job(tmp_path, "A1", "extract", "succeeded")
    out = Path(env["AERIE_OUTPUT"])
    clean = {i: ShardStore(out).meta(i)["sums"] for i in ShardStore(out).complete_shards()}
    bad = out / "shard-00001" / "data_000000006.ckpt"
    CORRUPTIONS[corruption](bad)
    train_env = stage_env(tmp_path, "train", TRAIN_SETTINGS, {"target": {"model": str(tiny_target)}})

    failed = run_stage("train", train_env)

    assert failed.returncode != 0
    assert "Traceback" not in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert str(bad) in failed.stderr and "dataset A1" in failed.stderr and "shard-00001" in failed.stderr
    assert not (Path(train_env["AERIE_OUTPUT"]) / "draft").exists()  # nothing trained on it was kept

    again = run_stage("extract", env)
    assert again.returncode == 0, again.stderr
    assert {i: ShardStore(out).meta(i)["sums"] for i in ShardStore(out).complete_shards()} == clean
    assert run_stage("train", train_env).returncode == 0


# -- a full disk ---------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)


def test_a_failed_write_is_one_line_naming_the_path_and_the_room_left(tmp_path: Path) -> None:
    exc = OSError(28, "No space left on device", str(tmp_path / "x.json"))
    line = disk.failed_write("extract", exc)
    assert line.startswith(f"extract: cannot write {tmp_path / 'x.json'}: No space left on device (")
    assert " left of " in line and line.endswith(f" on {disk.mount_of(tmp_path)})")


@E2E
def test_extract_on_a_disk_that_fills_fails_in_one_line_naming_the_file_and_leaves_no_torn_shard(
        small_disk: Path, tiny_target: Path) -> None:
    root = small_disk / "root"
    write_prep(root / "data" / "A1", make_records(60, vocab_size(tiny_target)))
    env = stage_env(root, "extract", EXTRACT_SETTINGS, {"target": {"model": str(tiny_target)}})

    result = run_stage("extract", env)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]  # above it, only transformers' loading bar
    assert line.startswith(f"extract: cannot write {root / 'data' / 'A1' / 'extract'}/")
    assert "No space left on device" in line and f"left of 1.0 MiB on {small_disk}" in line
    assert not list((root / "data" / "A1" / "extract").glob(".shard-*"))


def node(key: str, needs: list[str], stage: str, settings: dict[str, Any], shared: dict[str, Any],
         command: str | None = None) -> dict[str, Any]:
    dataset = key.split("/")[0]
    spec = {"dataset": dataset, "stage": stage, "source": "unused", "kind": "native", "stall_after": 600,
            "executor": "process", "config": {"dataset": {}, "stage": complete(stage, settings), "inventory": shared}}
    if command:
        spec["command"] = command
    return {"key": key, "needs": needs, "gpu": False, "server": False, "spec": spec}


def launch_runner(root: Path, plan: list[dict[str, Any]]) -> None:
    runner = {"dataset": "pipeline", "stage": "run", "source": "", "kind": "native", "stall_after": 600,
              "executor": "process", "config": {"stage": {"plan": plan, "fresh": True}}}
    jobs.launch(root, runner)


def states(root: Path) -> dict[str, dict[str, Any]]:
    return {f"{j['dataset']}/{j['stage']}": j for j in jobs.status(root)["jobs"]}


def runner_ended(root: Path, timeout: float = 240) -> dict[str, dict[str, Any]]:
    wait_for(lambda: JobState(states(root).get("pipeline/run", {}).get("state", "running")).is_terminal(),
             timeout, "the runner to end")
    return states(root)


def disk_root(mount: Path) -> Path:
    root = mount / "root"
    root.mkdir()
    (root / "current").symlink_to(REPO)  # this checkout is the release
    return root


@E2E
def test_a_pipeline_whose_extract_fills_the_disk_ends_failed_and_rerun_finishes_once_there_is_room(
        small_disk: Path, tiny_target: Path) -> None:
    root = disk_root(small_disk)
    write_prep(root / "data" / "A1", make_records(60, vocab_size(tiny_target)))
    shared = {"target": {"model": str(tiny_target)}}
    launch_runner(root, [node("A1/extract", [], "extract", EXTRACT_SETTINGS, shared),
                         node("A1/train", ["A1/extract"], "train", TRAIN_SETTINGS, shared)])

    ended = runner_ended(root)

    extract = ended["A1/extract"]
    assert extract["state"] == "failed"
    assert f"cannot write {root / 'data' / 'A1' / 'extract'}/" in extract["message"], extract
    assert "left of 1.0 MiB" in extract["message"]
    assert ended["pipeline/run"]["state"] == "failed" and "A1/extract" in ended["pipeline/run"]["message"]
    assert not [key for key, job in ended.items() if job["state"] == "waiting"]
    assert "Traceback" not in (root / "jobs" / "pipeline" / "run" / "log").read_text()

    grow(small_disk)
    remote.__main__.rerun({"root": str(root)})
    wait_for(lambda: states(root)["pipeline/run"].get("started_at", 0) > ended["pipeline/run"]["started_at"], 30,
             "the runner to start again")
    again = runner_ended(root)
    assert {k: j["state"] for k, j in again.items()} == {k: "succeeded" for k in again}


#: A stage that succeeds having filled the disk, and leaves it full (its file is its output).
HOG = """import json, os, pathlib
out = pathlib.Path(os.environ["AERIE_OUTPUT"])
pathlib.Path(os.environ["AERIE_PROGRESS"]).write_text(json.dumps({"records": 1}))
f = open(out / "hog", "wb", buffering=0)
try:
    while True:
        f.write(b"x" * 4096)
except OSError:
    os._exit(0)
"""
DONE = """import json, os, pathlib
pathlib.Path(os.environ["AERIE_PROGRESS"]).write_text(json.dumps({"records": 1}))
"""


@E2E
def test_a_runner_that_cannot_write_its_own_records_ends_failed_in_one_line_and_leaves_no_job_waiting(
        small_disk: Path) -> None:
    root = disk_root(small_disk)
    scripts = small_disk.parent
    (scripts / "hog.py").write_text(HOG)
    (scripts / "done.py").write_text(DONE)
    launch_runner(root, [node("A1/prep", [], "prep", {}, {}, f"{sys.executable} {scripts / 'hog.py'}"),
                         node("A1/train", ["A1/prep"], "train", {}, {}, f"{sys.executable} {scripts / 'done.py'}")])

    ended = runner_ended(root)

    runner = ended["pipeline/run"]
    assert ended["A1/prep"]["state"] == "succeeded", ended["A1/prep"]["message"]
    assert runner["state"] == "failed", runner
    assert "pipeline: cannot write " in runner["message"] and "No space left on device" in runner["message"], runner
    assert f"on {small_disk})" in runner["message"]
    assert ended["A1/train"]["state"] == "blocked" and ended["A1/train"]["blocked_by"] == ["pipeline/run"]
    assert "Traceback" not in (root / "jobs" / "pipeline" / "run" / "log").read_text()

    (root / "data" / "A1" / "prep" / "hog").unlink()
    remote.__main__.rerun({"root": str(root)})
    wait_for(lambda: states(root)["pipeline/run"].get("started_at", 0) > runner["started_at"], 30,
             "the runner to start again")
    assert runner_ended(root)["A1/train"]["state"] == "succeeded"


def test_specforges_inputs_are_verified_before_specforge_reads_them(tmp_path: Path, tiny_target: Path, extracted: dict) -> None:
    from remote.control_plane.progress import Progress
    from remote.eagle3 import specforge_engine
    from tests.pipeline_fixtures import context

    extract_into(tmp_path, extracted)
    record_job(tmp_path, "A1", "extract", "succeeded")
    bad = tmp_path / "data" / "A1" / "extract" / "shard-00002" / "data_000000008.ckpt"
    flip_bits(bad)
    ctx = context(stage_env(tmp_path, "train", {**TRAIN_SETTINGS, "engine": "specforge"}, {"target": {"model": str(tiny_target)}}))

    with pytest.raises(BadState, match=f"{bad} does not match"):
        specforge_engine.verify_states(ctx, Progress())


def test_a_file_its_shard_lists_but_that_is_gone_is_named_as_missing(tmp_path: Path, extracted: dict) -> None:
    env = extract_into(tmp_path, extracted)
    gone = Path(env["AERIE_OUTPUT"]) / "shard-00000" / "data_000000002.ckpt"
    gone.unlink()
    with pytest.raises(BadState, match=f"{gone} is missing .* shard shard-00000 of "):
        load_sample(gone)
