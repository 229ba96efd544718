"""The chunked route's resident trainer (`remote.orchestration.resident.Trainer`): the train stage's
session (`remote.eagle3.session`), epoch 0 held aside as the train stage holds it, its ranks said in one line
and another count than the checkpoint's refused in one; a resident group of ranks that never outlives the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from benchmarks.harness.stage_settings import complete
from remote.control_plane.progress import Progress
from remote.eagle3 import StageInputError, kept
from remote.eagle3.shards import ShardStore
from remote.orchestration import chunked, resident
from remote.stages import StageContext
from tests.pipeline_fixtures import REPO, TINY_LAYERS, extracted, tiny_target
from tests.helpers.notes import Notes

__all__ = ["extracted", "tiny_target"]  # fixtures used below

TRAIN = {"draft_vocab_size": 200, "epochs": 1, "batch_size": 2, "learning_rate": 3e-3, "ttt_steps": 2, "checkpoint_every": 2}


def chunked_context(tmp_path: Path, train: dict, target: Path | None = None) -> StageContext:
    return StageContext(root=tmp_path, release="r", dataset="draft", stage="chunked", source="", kind="native",
                        output=tmp_path / "out", data=tmp_path, config={
                            "prep_inputs": {"A1": str(tmp_path)}, "inventory": {"target": {"model": str(target or tmp_path)}},
                            "stage": {"disk_budget": "1G", "extract": complete("extract", {"layers": TINY_LAYERS}),
                                      "train": complete("train", train)}})


def test_resuming_with_another_count_of_ranks_than_trained_the_checkpoint_is_one_line_before_anything_runs(
    tmp_path: Path
) -> None:
    import torch

    from remote.eagle3 import resume

    resume.save(tmp_path / "train" / "resume", torch.nn.Linear(2, 2), resume.TrainState(step=3, world=2))

    with pytest.raises(StageInputError) as refused:
        chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 1}), Progress())

    assert str(refused.value) == (
        "stages.train.nproc is 1, but the run to resume was trained by 2 processes (its batches count 2 ranks' records): "
        "set nproc: 2 to resume it, or delete its resume/ folder to start over")
    assert chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 2}), Progress()).batch == 4  # as many: it goes on
    resume.save(tmp_path / "train" / "resume", torch.nn.Linear(2, 2), resume.TrainState(step=3, world=1))
    with pytest.raises(StageInputError, match="stages.train.nproc is 2, but the run to resume was trained by 1 process "):
        chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 2}), Progress())
    # a train command of the user's keeps its own checkpoints: nothing of aerie's to refuse
    chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 2, "command": "python my_train.py"}), Progress())


def test_with_nproc_unset_on_a_host_of_several_gpus_the_chunked_route_says_it_trains_on_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remote.eagle3 import distributed

    notes = Notes()
    monkeypatch.setattr(distributed, "visible_gpus", lambda env=None: 8)
    eight = chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": None}), notes)
    monkeypatch.setattr(distributed, "visible_gpus", lambda env=None: 1)
    one = chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": None}), notes)

    assert notes.lines == ["training on 8 GPUs, one rank each, beside the loaded target "
                           "(stages.train.nproc: 1 trains in the chunked job's own process)"]
    assert (eight.nproc, eight.batch, one.nproc, one.batch) == (8, 16, 1, 2)  # a step takes batch_size from each rank


def test_the_resident_trainer_holds_epoch_0_aside_until_an_epoch_is_measured_as_the_train_stage_does(
    extracted: dict, tiny_target: Path, tmp_path: Path
) -> None:
    root = extracted["root"]
    files = ShardStore(Path(extracted["env"]["AERIE_OUTPUT"])).sample_files()
    ctx = chunked_context(tmp_path, TRAIN, tiny_target)
    output = tmp_path / "train"
    trainer = resident.Trainer(ctx, complete("train", {**TRAIN, "eval_records": 0}), output, files[:2], 5,
                               tmp_path / "evaluations.json", Progress(),
                               {"preps": {"A1": root / "data" / "A1" / "prep"}, "heldout": {"A1": [0, 1]}})

    trainer.run([Path(extracted["env"]["AERIE_OUTPUT"])], 1, "pass 1, chunk 1", seed=0)

    # trained on a chunk, no epoch measured yet: the draft it began with waits in .start/, never draft/
    assert (output / kept.START / "model.safetensors").is_file() and not (output / kept.DRAFT).exists()
    assert (output / kept.LAST / "model.safetensors").is_file()
    assert [e.epoch for e in trainer.evaluation.epochs] == [0]

    trainer.measure(1)

    assert not (output / kept.START).exists()  # settled: draft/ is epoch 0's or epoch 1's, whichever measured better
    chosen = trainer.evaluation.kept_epoch().epoch
    assert json.loads((output / kept.DRAFT / "aerie.json").read_text())["epoch"] == chosen
    manifest = trainer.manifest(1, len(files), 1.0)
    assert manifest["route"] == "chunked" and manifest["kept_epoch"] == chosen
    assert [e["epoch"] for e in manifest["epoch_history"]] == [0, 1]


#: A chunked job reduced to its group of ranks: started, said ready, then waiting on them as it does mid-command.
GROUP_JOB = """
from remote.control_plane import logfile
from remote.control_plane.progress import Progress
from remote.orchestration.rank_group import RankGroup

logfile.whole_lines()  # as the job's stage entry does: its lines and its ranks' share one pipe
group = RankGroup.start(2, Progress())
print("ready", flush=True)
for _ in group._messages(lambda: False):
    pass
"""


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (zombies are dead), read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    return {pid for pid in pids if running(pid)}


def printed(job: subprocess.Popen, wanted: str, timeout: float = 120.0) -> bool:
    """Whether the job printed the line `wanted` within `timeout` s: a job that hangs fails the test, not waits."""
    found = threading.Event()

    def read() -> None:
        for line in job.stdout:
            if line.strip() == wanted:
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return found.is_set()


@contextmanager
def group_job() -> Iterator[tuple[subprocess.Popen, set[int]]]:
    """The group's job, once its ranks joined, and the launcher and ranks under it; all of them gone after."""
    job = subprocess.Popen([sys.executable, "-c", GROUP_JOB], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    group: set[int] = set()
    try:
        assert printed(job, "ready"), "the job ended, or hung, before its ranks joined"
        group = descendants(job.pid)
        assert len(group) >= 3  # the launcher and its two ranks
        yield job, group
    finally:
        for pid in alive({job.pid} | group | descendants(job.pid)):
            os.kill(pid, signal.SIGKILL)
        job.wait()


def wait_gone(pids: set[int], timeout: float = 60.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


@pytest.mark.e2e  # a launcher and two ranks, started: seconds, not the unit tier's milliseconds
def test_a_resident_group_of_ranks_ends_when_its_chunked_job_is_killed() -> None:
    with group_job() as (job, group):
        os.kill(job.pid, signal.SIGKILL)  # the job alone, as the OOM killer would: not its process group
        job.wait()

        assert wait_gone(group) == set()  # no rank left behind it


@pytest.mark.e2e  # a launcher and two ranks, started: seconds, not the unit tier's milliseconds
def test_a_rank_that_dies_ends_the_group_and_the_job_in_one_line_naming_it() -> None:
    with group_job() as (job, group):
        ranks = {pid: Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in group
                 if b"resident_rank" in Path(f"/proc/{pid}/cmdline").read_bytes()}
        os.kill(next(pid for pid, env in ranks.items() if b"RANK=1" in env), signal.SIGKILL)
        _, err = job.communicate(timeout=240)

        assert job.returncode != 0
        assert err.strip().splitlines()[-1] == ("resident_rank: rank 1 of 2 was killed by SIGKILL; the others were "
                                                "stopped (`inv rerun --failed` goes on from the last checkpoint)")
        assert wait_gone(group) == set()
