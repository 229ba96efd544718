"""The train stage: a draft that learns, checkpoints SGLang loads, refusals, SpecForge's command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from remote.eagle3 import StageInputError, checkpoint
from remote.eagle3.model import Eagle3Draft
from remote.eagle3.shards import ShardStore, load_sample
from remote.eagle3.target import read_embed_and_head, read_shape
from remote.eagle3 import trainer
from remote.eagle3.vocab import build_mapping
from remote.control_plane.progress import Progress
from remote.stages import train
from tests.pipeline_fixtures import (
    TINY_LAYERS, context, crash_after, extract_again, extracted, read_progress, run_stage, stage_env, tiny_target,
)

__all__ = ["extracted", "tiny_target"]  # fixtures used below

TRAIN_SETTINGS = {"draft_vocab_size": 200, "epochs": 6, "batch_size": 2, "learning_rate": 3e-3, "ttt_steps": 3,
                  "eval_records": 2}


@pytest.fixture(scope="module")
def trained(extracted: dict, tiny_target: Path) -> dict:
    """The train stage, run once as a subprocess on the extracted states."""
    root = extracted["root"]
    env = stage_env(root, "train", TRAIN_SETTINGS, {"target": {"model": str(tiny_target)}})
    result = run_stage("train", env)
    assert result.returncode == 0, result.stderr
    return {"env": env, "output": Path(env["AERIE_OUTPUT"])}


def test_a_tiny_training_run_lowers_the_loss_and_reports_every_step(trained: dict) -> None:
    history = json.loads((trained["output"] / "history.json").read_text())
    losses = [h["loss"] for h in history]
    assert len(history) == 6 * 4  # 6 epochs of 8 records (2 of 10 held out) in batches of 2
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    progress = read_progress(trained["env"])
    assert progress["records"] == 8
    assert progress["metrics"]["step"] == 24
    assert set(progress["metrics"]) >= {"loss", "acc_0", "acc_1", "acc_2"}
    assert history[-1]["acc_0"] > history[0]["acc_0"]


def test_every_epoch_measures_the_draft_on_held_out_records_and_plots_the_curves(trained: dict) -> None:
    manifest = json.loads((trained["output"] / "manifest.json").read_text())
    metrics = read_progress(trained["env"])["metrics"]

    assert manifest["eval_records"] == 2 and manifest["records"] == 8 and manifest["eval_steps"] == 3
    assert [e["epoch"] for e in manifest["epoch_history"]] == [0, 1, 2, 3, 4, 5, 6]  # 0: before training
    assert 1.0 <= manifest["accept_length"] <= 4.0 and len(manifest["eval_accuracies"]) == 3
    assert metrics["accept_length"] == manifest["accept_length"]  # what `inv status --json` shows
    assert [metrics[f"eval_acc_{k}"] for k in range(3)] == manifest["eval_accuracies"]
    plot = trained["output"] / "training.png"
    assert manifest["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.parent == (trained["output"] / "draft").parent  # beside the draft


def test_inv_eval_asks_the_server_the_prompts_of_the_held_out_records(trained: dict) -> None:
    from remote.eval import prompt_source

    held = json.loads((trained["output"] / "heldout.json").read_text())
    asked = prompt_source.from_training(trained["output"], limit=10)

    assert len(held) == 2 and len(asked) == 2
    for name, prompt in zip(held, asked):
        sample = load_sample(Path(name))
        first_trained = int(sample["loss_mask"].nonzero()[0])
        assert prompt == {"input_ids": sample["input_ids"][:first_trained].tolist()}  # everything before the answer


def test_held_out_records_are_never_trained_on_and_stay_the_same_when_data_is_added(tmp_path: Path) -> None:
    from remote.eagle3 import heldout

    files = [tmp_path / "data" / "A1" / "extract" / "shard-00000" / f"data_{i:09d}.ckpt" for i in range(40)]
    more = files + [tmp_path / "data" / "B5" / "extract" / "shard-00000" / f"data_{i:09d}.ckpt" for i in range(40)]

    trained, held = heldout.split(files, None, 0.2)
    _, held_more = heldout.split(more, None, 0.2)

    assert 2 <= len(held) <= 16 and not set(held) & set(trained) and set(held) | set(trained) == set(files)
    assert set(held_more) & set(files) == set(held)
    assert heldout.split(files[:1], None, 0.05)[1] == [] and heldout.split(files, 0, 0.05)[1] == []
    assert len(heldout.split(files, 100, 0.05)[0]) == 1  # training always keeps a record


def test_the_checkpoint_has_the_config_and_weight_names_sglang_loads(trained: dict, tiny_target: Path) -> None:
    from safetensors import safe_open

    draft = trained["output"] / "draft"
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 200 and config["vocab_size"] == 785
    assert config["target_hidden_size"] == 64 and config["hidden_size"] == 64
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": TINY_LAYERS, "use_aux_hidden_state": True}
    assert config["tie_word_embeddings"] is False and config["num_hidden_layers"] == 1
    with safe_open(str(draft / "model.safetensors"), framework="pt") as weights:
        tensors = {name: weights.get_tensor(name) for name in weights.keys()}
    proj = [f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"] + [f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    norms = [f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")]
    assert set(tensors) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", *proj, *norms}
    assert tensors["fc.weight"].shape == (64, 3 * 64)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * 64)  # attention reads 2H
    assert tensors["lm_head.weight"].shape == (200, 64)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    # SGLang: hot_token_id = d2t + arange(draft_vocab_size), the kept target ids.
    hot = tensors["d2t"] + torch.arange(200)
    assert torch.equal(torch.nonzero(tensors["t2d"]).flatten(), hot)


def test_a_saved_draft_reloads_with_identical_outputs(extracted: dict, tiny_target: Path, tmp_path: Path) -> None:
    shape = read_shape(tiny_target)
    embed, head = read_embed_and_head(shape)
    config = json.loads((tiny_target / "config.json").read_text())
    from remote.eagle3 import draft_config

    draft = Eagle3Draft(draft_config.build(config, TINY_LAYERS, 100))
    torch.manual_seed(0)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed)
        d2t, t2d = build_mapping(torch.arange(785, 0, -1), 100)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    files = ShardStore(Path(extracted["env"]["AERIE_OUTPUT"])).sample_files()[:4]
    trainer.train(draft, head, files, load_sample, epochs=1, batch_size=2, learning_rate=1e-3, steps=2, max_length=64,
          on_step=lambda *a: None, on_epoch=lambda e: None)  # fmt: skip

    reloaded = checkpoint.load(checkpoint.save(draft, tmp_path / "draft"), embed)

    sample = load_sample(files[0])
    with torch.no_grad():
        before = draft(sample["input_ids"][None], sample["aux_hidden_state"], steps=3)
        after = reloaded(sample["input_ids"][None], sample["aux_hidden_state"], steps=3)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(reloaded.d2t, draft.d2t) and torch.equal(reloaded.t2d, draft.t2d)


def test_step_zero_never_looks_at_later_tokens(tiny_target: Path) -> None:
    from remote.eagle3 import draft_config

    config = json.loads((tiny_target / "config.json").read_text())
    torch.manual_seed(0)
    draft = Eagle3Draft(draft_config.build(config, TINY_LAYERS, 50)).eval()
    ids = torch.randint(0, 785, (1, 12))
    aux = torch.randn(1, 12, 192)
    changed_ids, changed_aux = ids.clone(), aux.clone()
    changed_ids[0, 9:] = 1
    changed_aux[0, 8:] = 0
    with torch.no_grad():
        first = draft(ids, aux, steps=2)
        second = draft(changed_ids, changed_aux, steps=2)
    # Step k at position t reads token t+k+1: positions up to 7 see none of the changes in either step.
    assert torch.allclose(first[0][0, :8], second[0][0, :8]) and torch.allclose(first[1][0, :7], second[1][0, :7])
    assert not torch.allclose(first[0][0, 8], second[0][0, 8])


def test_the_draft_vocabulary_keeps_the_most_frequent_tokens_in_id_order() -> None:
    counts = torch.tensor([5, 0, 9, 9, 1, 7])

    d2t, t2d = build_mapping(counts, 3)

    assert t2d.tolist() == [False, False, True, True, False, True]
    assert (d2t + torch.arange(3)).tolist() == [2, 3, 5]


def test_train_refuses_states_narrower_than_the_draft_expects(tmp_path: Path, tiny_target: Path) -> None:
    extract_dir = tmp_path / "data" / "A1" / "extract"
    extract_dir.mkdir(parents=True)
    (extract_dir / "manifest.json").write_text(json.dumps({"release": "r", "layers": [2], "hidden_states": [3], "hidden_size": 64, "width": 64}))
    env = stage_env(tmp_path, "train", {}, {"target": {"model": str(tiny_target)}})

    with pytest.raises(StageInputError, match=r"states are 64 wide .* expects 192"):
        train.run(context(env), Progress())


def test_train_refuses_states_kept_under_the_old_meaning_of_the_layer_ids(tmp_path: Path, tiny_target: Path) -> None:
    # An extract manifest without `hidden_states` predates SGLang's per-architecture rule: on a
    # Kimi target its states are one layer off from what the server feeds the draft.
    extract_dir = tmp_path / "data" / "A1" / "extract"
    extract_dir.mkdir(parents=True)
    (extract_dir / "manifest.json").write_text(json.dumps({"release": "r", "layers": [0, 1, 2], "hidden_size": 64, "width": 192}))
    env = stage_env(tmp_path, "train", {}, {"target": {"model": str(tiny_target)}})

    with pytest.raises(StageInputError, match=r"lacks hidden_states: it comes from an older aerie; rerun extract"):
        train.run(context(env), Progress())


def test_train_refuses_when_extract_has_not_succeeded(tmp_path: Path, tiny_target: Path) -> None:
    env = stage_env(tmp_path, "train", {}, {"target": {"model": str(tiny_target)}})

    result = run_stage("train", env)

    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "extract has not succeeded" in result.stderr.strip()


def test_a_train_run_stopped_mid_epoch_resumes_to_the_same_draft_as_an_unbroken_run(
    extracted: dict, tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {**TRAIN_SETTINGS, "epochs": 2, "checkpoint_every": 3, "eval_records": 0}  # all 10 records trained
    shared = {"target": {"model": str(tiny_target)}}
    unbroken = stage_env(extracted["root"], "train", settings, shared, dataset="unbroken")
    broken = stage_env(extracted["root"], "train", settings, shared, dataset="broken")
    for env in (unbroken, broken):  # both read A1's states
        env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})
    train.run(context(unbroken), Progress())

    crash_after(monkeypatch, 7)  # epoch 2's second batch; the last checkpoint is step 6 (epoch 2, batch 1)
    with pytest.raises(KeyboardInterrupt):
        train.run(context(broken), Progress())
    monkeypatch.undo()
    progress = Progress()
    manifest = train.run(context(broken), progress)

    assert manifest["resumed_from_step"] == 6 and manifest["steps"] == 10
    history = json.loads((Path(broken["AERIE_OUTPUT"]) / "history.json").read_text())
    assert [h["step"] for h in history] == list(range(1, 11))
    assert progress.records == 10  # the first epoch's records were counted before the stop
    first = load_file(str(Path(unbroken["AERIE_OUTPUT"]) / "draft" / "model.safetensors"))
    second = load_file(str(Path(broken["AERIE_OUTPUT"]) / "draft" / "model.safetensors"))
    # Same batches, same optimizer state, same schedule: the same weights, to the bit.
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_finished_train_run_rerun_takes_no_step_and_keeps_its_draft(
    extracted: dict, tiny_target: Path
) -> None:
    # As the chunked route runs it: one pass named by `chunk_pass`, run again after a stop that
    # came between the trainer's end and the driver's record of it, then the next pass, same files.
    def env_of(name: str) -> dict:
        settings = {**TRAIN_SETTINGS, "epochs": 1, "eval_records": 0, "chunk_pass": name}
        env = stage_env(extracted["root"], "train", settings, {"target": {"model": str(tiny_target)}}, dataset="again")
        env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})
        return env

    first = train.run(context(env_of("epoch 1, chunk 1")), Progress())

    again = train.run(context(env_of("epoch 1, chunk 1")), Progress())
    next_pass = train.run(context(env_of("epoch 2, chunk 1")), Progress())

    assert first["steps"] == again["steps"] == 5 and again["resumed_from_step"] == 5
    assert again["last_loss"] == first["last_loss"]
    assert next_pass["resumed_from_step"] == 5 and next_pass["steps"] == 10  # the same records, a new pass


def test_a_resumed_run_keeps_the_held_out_figures_of_the_epochs_measured_before_it(
    extracted: dict, tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second `inv demo` (or `inv run` after a deploy) runs train again: it resumes after the last step
    # and measures nothing; its manifest used to say accept_length None and forget every epoch.
    settings = {**TRAIN_SETTINGS, "epochs": 2, "checkpoint_every": 3}  # 8 records trained, 4 steps an epoch
    env = stage_env(extracted["root"], "train", settings, {"target": {"model": str(tiny_target)}}, dataset="kept")
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})
    crash_after(monkeypatch, 7)  # in epoch 2; the last checkpoint is step 6, after epoch 1 was measured
    with pytest.raises(KeyboardInterrupt):
        train.run(context(env), Progress())
    monkeypatch.undo()

    resumed = train.run(context(env), Progress())
    shown = Progress()
    again = train.run(context(env), shown)

    assert resumed["resumed_from_step"] == 6 and again["resumed_from_step"] == 8 == again["steps"]
    assert [e["epoch"] for e in resumed["epoch_history"]] == [0, 1, 2]  # 0 and 1 kept, epoch 2 measured now
    assert again["epoch_history"] == resumed["epoch_history"]
    assert again["accept_length"] == resumed["accept_length"] == resumed["epoch_history"][-1]["accept_length"]
    assert again["eval_accuracies"] == resumed["eval_accuracies"] and len(again["eval_accuracies"]) == 3
    assert shown.values["accept_length"] == again["accept_length"]  # `inv status` shows it too
    assert shown.message == "trained before: 2 epochs, 8 steps; the saved draft stands"


def test_a_finished_run_trains_on_states_extracted_again_under_the_same_names_and_stands_on_the_same_ones(
        extracted: dict, tiny_target: Path, tmp_path: Path) -> None:
    # The user's loop: stages.infer.max_tokens edited, new answers extracted under the same names, and train
    # resumed the finished run over them: "the saved draft stands", a draft of the old answers.
    import shutil

    states = tmp_path / "extract"
    shutil.copytree(extracted["env"]["AERIE_OUTPUT"], states)
    env = stage_env(extracted["root"], "train", {**TRAIN_SETTINGS, "epochs": 1}, {"target": {"model": str(tiny_target)}},
                    dataset="extracted-again")
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [str(states)]})
    first = train.run(context(env), Progress())
    same = train.run(context(env), Progress())

    extract_again(states)
    again = train.run(context(env), Progress())

    assert same["resumed_from_step"] == same["steps"] == first["steps"] > 0  # the same states: the draft stands
    assert again["resumed_from_step"] == first["steps"] and again["steps"] == 2 * first["steps"]  # one more epoch


def test_a_finished_run_whose_state_fingerprints_the_names_alone_stands_as_before(
        extracted: dict, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from remote.eagle3 import resume

    env = stage_env(extracted["root"], "train", {**TRAIN_SETTINGS, "epochs": 1}, {"target": {"model": str(tiny_target)}},
                    dataset="older")
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})
    with monkeypatch.context() as older:  # saved by an aerie whose fingerprint was the samples' names alone
        older.setattr(resume, "fingerprint", resume.names_fingerprint)
        first = train.run(context(env), Progress())
    same = train.run(context(env), Progress())
    assert same["resumed_from_step"] == same["steps"] == first["steps"] > 0


def test_a_resume_state_of_another_drafts_shape_is_refused_in_one_line_naming_what_differs(
        tiny_target: Path, tmp_path: Path) -> None:
    from remote.eagle3 import draft_config, resume

    config = json.loads((tiny_target / "config.json").read_text())
    saved = Eagle3Draft(draft_config.build(config, TINY_LAYERS, 100))
    resume.save(tmp_path / "resume", saved, resume.TrainState(epoch=1, step=5))
    assert resume.load(tmp_path / "resume", Eagle3Draft(draft_config.build(config, TINY_LAYERS, 100))).step == 5

    with pytest.raises(StageInputError) as refused:  # draft_vocab_size edited since: lm_head and d2t change shape
        resume.load(tmp_path / "resume", Eagle3Draft(draft_config.build(config, TINY_LAYERS, 200)))
    assert "d2t [100] saved, [200] now" in str(refused.value) and "delete the resume/ folder" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_run_again_at_another_learning_rate_is_refused_in_one_line_and_resumes_once_it_is_set_back(
        extracted: dict, tiny_target: Path) -> None:
    # A finished run, its learning rate edited, `inv deploy run`: train was out of date, ran, and kept the old draft
    # ("the saved draft stands"), its optimizer carrying the old rate on.
    def env_at(rate: float) -> dict:
        settings = {**TRAIN_SETTINGS, "epochs": 1, "learning_rate": rate}
        env = stage_env(extracted["root"], "train", settings, {"target": {"model": str(tiny_target)}}, dataset="rate")
        env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})
        return env

    first = train.run(context(env_at(3e-3)), Progress())
    with pytest.raises(StageInputError) as refused:
        train.run(context(env_at(3e3)), Progress())
    again = train.run(context(env_at(3e-3)), Progress())

    message = str(refused.value)
    assert "stages.train.learning_rate is 3000, but the run to resume was trained at 0.003" in message
    assert "delete its resume/ folder" in message and "\n" not in message
    assert again["resumed_from_step"] == first["steps"] == again["steps"]


def test_a_run_whose_loss_turns_nan_fails_in_one_line_and_keeps_no_draft_of_it(extracted: dict, tiny_target: Path) -> None:
    # The user's mistake: learning_rate 3.0e+3 for 3.0e-3. Every job succeeded, each keeping a draft of NaN weights.
    settings = {**TRAIN_SETTINGS, "epochs": 2, "learning_rate": 3e3}
    env = stage_env(extracted["root"], "train", settings, {"target": {"model": str(tiny_target)}}, dataset="nan")
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})

    with pytest.raises(StageInputError) as refused:
        train.run(context(env), Progress())

    message = str(refused.value)
    assert message.startswith("the training loss is nan at step ") and "\n" not in message, message
    assert "lower stages.train.learning_rate (3000 now)" in message
    kept = Path(env["AERIE_OUTPUT"]) / "draft" / "model.safetensors"  # an epoch measured before it diverged, if any
    assert not kept.exists() or all(torch.isfinite(t).all() for t in load_file(kept).values())


def test_a_draft_with_a_nan_weight_is_never_written(tiny_target: Path, tmp_path: Path) -> None:
    from remote.eagle3 import draft_config

    config = json.loads((tiny_target / "config.json").read_text())
    draft = Eagle3Draft(draft_config.build(config, TINY_LAYERS, 100))
    checkpoint.save(draft, tmp_path / "draft")
    with torch.no_grad():
        draft.fc.weight[0, 0] = float("nan")

    with pytest.raises(StageInputError) as refused:
        checkpoint.save(draft, tmp_path / "draft")
    assert "fc.weight holds NaN or infinite values" in str(refused.value)
    assert "lower stages.train.learning_rate and delete its resume/ folder" in str(refused.value)
    assert not any(torch.isnan(t).any() for t in load_file(tmp_path / "draft" / "model.safetensors").values())
