"""The extract stage: checks before work, stored states, SpecForge's layout, resuming."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from remote.eagle3 import StageInputError
from remote.eagle3.shards import ShardStore, load_sample
from remote.control_plane.progress import Progress
from remote.stages import extract
from tests.pipeline_fixtures import (
    EXTRACT_SETTINGS,
    RECORDS,
    TINY_LAYERS,
    context,
    extracted,
    make_records,
    read_progress,
    run_stage,
    stage_env,
    tiny_target,
    write_prep,
)

__all__ = ["extracted", "tiny_target"]  # fixtures used below


def test_width_mismatch_is_refused_in_one_line_before_any_weight_is_read(tmp_path: Path, tiny_target: Path) -> None:
    # A target with a config and no weights: reaching the weights would fail differently.
    target = tmp_path / "config-only"
    target.mkdir()
    shutil.copy(tiny_target / "config.json", target / "config.json")
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"hidden_size": 64, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2]}}))
    write_prep(tmp_path / "data" / "A1", make_records(2, 100))
    env = stage_env(tmp_path, "extract", {"layers": [2], "draft_config": str(draft)}, {"target": {"model": str(target)}})

    result = run_stage("extract", env)

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert "extraction writes 64" in message and "expects 192" in message
    assert sorted(p.name for p in Path(env["AERIE_OUTPUT"]).iterdir()) == []
    assert "192" in read_progress(env)["message"]


def test_a_kimi_shaped_one_layer_extraction_is_refused_naming_7168_and_21504(tmp_path: Path) -> None:
    target = tmp_path / "kimi"
    target.mkdir()
    text = {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}
    (target / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text}))
    draft = tmp_path / "kimi-k25-eagle3.json"  # SpecForge's draft config, abridged
    draft.write_text(json.dumps({"hidden_size": 7168, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}))
    write_prep(tmp_path / "data" / "A1", make_records(2, 100))
    env = stage_env(tmp_path, "extract", {"layers": [59], "draft_config": str(draft)}, {"target": {"model": str(target)}})

    with pytest.raises(StageInputError, match=r"extraction writes 7168 \(1 x hidden 7168, layers \[59\]\) .* expects 21504"):
        extract.plan(context(env))


def test_layer_ids_sglang_never_captures_are_refused(tmp_path: Path, tiny_target: Path) -> None:
    write_prep(tmp_path / "data" / "A1", make_records(2, 100))
    env = stage_env(tmp_path, "extract", {"layers": [1, 2, 3]}, {"target": {"model": str(tiny_target)}})

    with pytest.raises(StageInputError, match=r"\[3\] out of range for a 4-layer LlamaForCausalLM target.*0\.\.2"):
        extract.plan(context(env))


def test_prep_output_without_a_release_is_refused_as_older_or_failed(tmp_path: Path, tiny_target: Path) -> None:
    write_prep(tmp_path / "data" / "A1", make_records(2, 100), release=None)
    env = stage_env(tmp_path, "extract", EXTRACT_SETTINGS, {"target": {"model": str(tiny_target)}})

    with pytest.raises(StageInputError, match="lacks release: it comes from an older aerie"):
        extract.plan(context(env))
    (tmp_path / "data" / "A1" / "prep" / "manifest.json").unlink()
    with pytest.raises(StageInputError, match="prep has not succeeded"):
        extract.plan(context(env))


def test_stored_states_equal_a_direct_forward_pass_for_the_chosen_layers(extracted: dict, tiny_target: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert extracted["result"].returncode == 0, extracted["result"].stderr
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()
    files = ShardStore(Path(extracted["env"]["AERIE_OUTPUT"])).sample_files()
    assert len(files) == RECORDS

    for path, record in zip(files, extracted["records"]):
        sample = load_sample(path)
        ids = torch.tensor([record["input_ids"]])
        with torch.no_grad():
            states = model(ids, output_hidden_states=True).hidden_states
        expected_aux = torch.cat([states[i + 1] for i in TINY_LAYERS], dim=-1)
        assert sample["id"] == record["id"]
        assert sample["input_ids"].tolist() == record["input_ids"]
        assert sample["loss_mask"].tolist() == record["loss_mask"]
        assert sample["aux_hidden_state"].shape == (1, len(record["input_ids"]), 3 * 64)
        # NOTE: the stage ran batches of 3 with padding, this one by one: float32
        # sums in another order, hence a tolerance rather than bit equality.
        torch.testing.assert_close(sample["aux_hidden_state"], expected_aux, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(sample["hidden_state"], states[-1], rtol=1e-3, atol=1e-4)
        # The final state is post-norm: the target's lm_head turns it into the target's logits.
        torch.testing.assert_close(model.lm_head(sample["hidden_state"]), model(ids).logits, rtol=1e-3, atol=1e-3)


def test_output_is_in_specforge_offline_layout_with_a_manifest_and_counts(extracted: dict) -> None:
    output = Path(extracted["env"]["AERIE_OUTPUT"])
    # SpecForge walks the directory for *.ckpt and sorts the paths.
    found = sorted(str(p) for p in output.rglob("*.ckpt"))
    assert [Path(p).parent.name for p in found] == ["shard-00000"] * 4 + ["shard-00001"] * 4 + ["shard-00002"] * 2
    assert set(load_sample(Path(found[0]))) == {"id", "input_ids", "loss_mask", "aux_hidden_state", "hidden_state"}
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["records"] == RECORDS and manifest["shards"] == 3
    assert manifest["width"] == 192 and manifest["layers"] == TINY_LAYERS and manifest["prep_release"] == "rel-1"
    assert read_progress(extracted["env"])["records"] == RECORDS


def copied(extracted: dict, root: Path) -> dict[str, str]:
    """The extract stage's environment over a copy of the extracted root, for a test that changes it."""
    shutil.copytree(extracted["root"], root)
    return {**extracted["env"], "AERIE_ROOT": str(root), "AERIE_DATA": str(root / "data" / "A1"),
            "AERIE_OUTPUT": str(root / "data" / "A1" / "extract")}


def test_a_restart_keeps_complete_shards_and_redoes_a_torn_one(extracted: dict, tmp_path: Path) -> None:
    env = copied(extracted, tmp_path / "root")
    output = Path(env["AERIE_OUTPUT"])
    kept = {p.name: p.stat().st_mtime_ns for p in (output / "shard-00000").iterdir()}
    # A killed run: shard 1 half-written, shard 2 and the manifest never written.
    torn = output / ".shard-00001.tmp"
    os.replace(output / "shard-00001", torn)
    (torn / "meta.json").unlink()
    (torn / "data_000000005.ckpt").write_bytes(b"half a file")
    shutil.rmtree(output / "shard-00002")
    (output / "manifest.json").unlink()
    progress = Progress()

    manifest = extract.run(context(env), progress)

    assert {p.name: p.stat().st_mtime_ns for p in (output / "shard-00000").iterdir()} == kept
    assert not torn.exists()
    assert len(list((output / "shard-00001").glob("*.ckpt"))) == 4
    assert load_sample(output / "shard-00001" / "data_000000005.ckpt")["id"] == "r0005"
    assert manifest["records"] == RECORDS and progress.records == RECORDS


def test_shards_stored_under_the_old_meaning_of_the_ids_are_redone(extracted: dict, tmp_path: Path) -> None:
    env = copied(extracted, tmp_path / "root")
    output = Path(env["AERIE_OUTPUT"])
    plan = json.loads((output / "plan.json").read_text())
    assert plan["hidden_states"] == [1, 2, 3] and plan["architecture"] == "LlamaForCausalLM"
    # What an aerie before per-architecture ids wrote: the same ids, nothing on what they captured.
    old = {k: v for k, v in plan.items() if k not in ("hidden_states", "architecture")}
    (output / "plan.json").write_text(json.dumps(old))
    (output / "manifest.json").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in (output / "shard-00000").iterdir()}
    progress, notes = Progress(), []
    progress.note = lambda message, note=progress.note: (notes.append(message), note(message))

    manifest = extract.run(context(env), progress)

    assert "inputs changed since the last run: starting over" in notes
    assert all(p.stat().st_mtime_ns != before[p.name] for p in (output / "shard-00000").iterdir() if p.name in before)
    assert manifest["records"] == RECORDS and json.loads((output / "plan.json").read_text()) == plan


def test_prep_written_again_on_the_same_release_makes_the_shards_stale_and_an_older_plan_is_taken_at_its_word(
        extracted: dict, tmp_path: Path) -> None:
    # The user's loop: stages.infer fixed, the prompts answered again, tokenize run again on the same release with
    # the same count of records: extract kept every shard of the old answers ("3 resumed").
    env = copied(extracted, tmp_path / "root")
    root, output = Path(env["AERIE_ROOT"]), Path(env["AERIE_OUTPUT"])
    plan = json.loads((output / "plan.json").read_text())
    (output / "plan.json").write_text(json.dumps({k: v for k, v in plan.items() if k != "prep_created"}))  # an older aerie's
    (output / "manifest.json").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in (output / "shard-00000").iterdir()}

    extract.run(context(env), Progress())
    kept = {p.name: p.stat().st_mtime_ns for p in (output / "shard-00000").iterdir()}
    prep = root / "data" / "A1" / "prep" / "manifest.json"
    prep.write_text(json.dumps({**json.loads(prep.read_text()), "created_at": 1796691781.36}))  # written again
    progress, notes = Progress(), []
    progress.note = lambda message, note=progress.note: (notes.append(message), note(message))
    manifest = extract.run(context(env), progress)

    assert kept == before  # the older plan's shards stand
    assert "inputs changed since the last run: starting over" in notes
    assert all(p.stat().st_mtime_ns != kept[p.name] for p in (output / "shard-00000").iterdir() if p.name in kept)
    assert manifest["records"] == RECORDS and manifest["prep_created"] == 1796691781.36
