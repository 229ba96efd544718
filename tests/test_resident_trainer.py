"""The chunked route's resident trainer (`remote.orchestration.resident.Trainer`): the train stage's
session (`remote.eagle3.session`), epoch 0 held aside as the train stage holds it, and one GPU said
or refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.stage_settings import complete
from remote.control_plane.progress import Progress
from remote.eagle3 import StageInputError, kept
from remote.eagle3.shards import ShardStore
from remote.orchestration import chunked, resident
from remote.stages import StageContext
from tests.pipeline_fixtures import TINY_LAYERS, extracted, tiny_target
from tests.helpers.notes import Notes

__all__ = ["extracted", "tiny_target"]  # fixtures used below

TRAIN = {"draft_vocab_size": 200, "epochs": 1, "batch_size": 2, "learning_rate": 3e-3, "ttt_steps": 2, "checkpoint_every": 2}


def chunked_context(tmp_path: Path, train: dict, target: Path | None = None) -> StageContext:
    return StageContext(root=tmp_path, release="r", dataset="draft", stage="chunked", source="", kind="native",
                        output=tmp_path / "out", data=tmp_path, config={
                            "prep_inputs": {"A1": str(tmp_path)}, "inventory": {"target": {"model": str(target or tmp_path)}},
                            "stage": {"disk_budget": "1G", "extract": complete("extract", {"layers": TINY_LAYERS}),
                                      "train": complete("train", train)}})


def test_the_chunked_route_refuses_more_than_one_training_process_in_one_line_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StageInputError) as refused:
        chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 2}), Progress())

    assert str(refused.value) == (
        "stages.train.nproc 2: the chunked route trains in the process that holds the target, on one GPU; set nproc: 1 "
        "for it, or give stages.extract.disk_budget room for every state (the offline route trains on nproc GPUs)")
    chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 1}), Progress())  # one is what it does
    chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": 2, "command": "python my_train.py"}), Progress())


def test_with_nproc_unset_on_a_host_of_several_gpus_the_chunked_route_says_it_trains_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remote.eagle3 import distributed

    notes = Notes()
    monkeypatch.setattr(distributed, "visible_gpus", lambda env=None: 8)
    chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": None}), notes)
    monkeypatch.setattr(distributed, "visible_gpus", lambda env=None: 1)
    chunked.Chunked(chunked_context(tmp_path, {**TRAIN, "nproc": None}), notes)

    assert notes.lines == ["training on one GPU: the chunked route trains beside the loaded target "
                           "(stages.train.nproc applies to the offline route)"]


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
