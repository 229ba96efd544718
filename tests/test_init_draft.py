"""stages.train.init_draft: training goes on from a draft (the demo's own, SpecForge's export, a published one).

On the demo's target (the wired reciting Llama) with the demo's train settings
(inventories/local.yaml): the 10-epoch draft the demo trains is the draft to go
on from; each run measures the draft it starts from as epoch 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from remote.control_plane.progress import Progress
from remote.eagle3 import StageInputError
from remote.eagle3.init_draft import aerie_name
from remote.stages import train
from tests.pipeline_fixtures import context, demo_target, run_stage, vocab_size
from tests.helpers.recital import demo_states, train_env

__all__ = ["demo_states", "demo_target"]  # fixtures


def run_train(states: dict, name: str, **settings) -> dict:
    torch.set_num_threads(1)  # tiny tensors: a second thread only contends (inventories/local.yaml)
    return train.run(context(train_env(states, name, **settings)), Progress())


@pytest.fixture(scope="module")
def ten_epochs(demo_states: dict) -> dict:
    """The demo's draft: 10 epochs from scratch."""
    manifest = run_train(demo_states, "ten")
    return {"manifest": manifest, "draft": Path(manifest["draft"])}


def test_a_one_epoch_run_from_the_demo_s_ten_epoch_draft_keeps_its_accept_length_and_beats_one_from_scratch(
    demo_states: dict, ten_epochs: dict
) -> None:
    continued = run_train(demo_states, "continued", epochs=1, init_draft=str(ten_epochs["draft"]))
    scratch = run_train(demo_states, "scratch", epochs=1)
    figures = {name: [e["accept_length"] for e in m["epoch_history"]]
               for name, m in (("10 epochs", ten_epochs["manifest"]), ("init_draft + 1", continued), ("scratch 1", scratch))}
    print("held-out accept length per epoch (epoch 0 first):", json.dumps(figures))

    base = ten_epochs["manifest"]["accept_length"]
    assert continued["accept_length"] >= 0.95 * base, figures
    assert continued["accept_length"] > scratch["accept_length"], figures
    # Epoch 0 is the draft as each run starts: the demo's draft itself (same held-out records), or a new one.
    assert [e["epoch"] for e in continued["epoch_history"]] == [0, 1] and continued["epoch_history"][0]["loss"] is None
    assert continued["epoch_history"][0]["accept_length"] == pytest.approx(base, abs=1e-6)
    assert scratch["epoch_history"][0]["accept_length"] < base
    assert continued["steps"] > 0 and continued["draft_vocab_size"] == ten_epochs["manifest"]["draft_vocab_size"]
    assert continued["init_draft"] == str(ten_epochs["draft"]) and scratch["init_draft"] is None


def test_the_draft_s_vocabulary_map_is_kept_and_its_weights_trained_on(demo_states: dict, ten_epochs: dict) -> None:
    from safetensors.torch import load_file

    run_train(demo_states, "kept", epochs=1, init_draft=str(ten_epochs["draft"]))

    before = load_file(str(ten_epochs["draft"] / "model.safetensors"))
    after = load_file(str(demo_states["root"] / "data" / "kept" / "train" / "draft" / "model.safetensors"))
    assert torch.equal(before["d2t"], after["d2t"]) and torch.equal(before["t2d"], after["t2d"])
    assert not torch.equal(before["fc.weight"], after["fc.weight"])  # trained on, not copied


def full_vocabulary_copy(draft: Path, target: Path, out: Path, prefix: str = "language_model.") -> Path:
    """`draft` as some published drafts ship: the target's full vocabulary (its lm_head's rows at every
    token, the draft's own at its tokens), no d2t/t2d, every name under `prefix`."""
    from safetensors.torch import load_file, save_file

    from remote.eagle3.target import read_embed_and_head, read_shape

    state = load_file(str(draft / "model.safetensors"))
    _, head = read_embed_and_head(read_shape(target))
    full = head.float().clone()
    full[state["t2d"]] = state["lm_head.weight"]
    state["lm_head.weight"] = full
    for name in ("d2t", "t2d"):
        del state[name]
    out.mkdir(parents=True)
    save_file({prefix + name: t.contiguous() for name, t in state.items()}, str(out / "model.safetensors"))
    config = json.loads((draft / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "draft_vocab_size": config["vocab_size"]}))
    return out


def test_a_full_vocabulary_draft_without_d2t_t2d_is_cut_to_the_data_s_tokens_and_trained_on(
    demo_states: dict, ten_epochs: dict, tmp_path: Path
) -> None:
    published = full_vocabulary_copy(ten_epochs["draft"], demo_states["target"], tmp_path / "published")

    manifest = run_train(demo_states, "full-cut", epochs=1, init_draft=str(published))

    # Cut to the demo's 256: the data's most frequent tokens, the ten-epoch draft's own, with its own rows.
    assert manifest["draft_vocab_size"] == 256 and manifest["steps"] > 0
    assert manifest["epoch_history"][0]["accept_length"] == pytest.approx(ten_epochs["manifest"]["accept_length"], abs=1e-6)
    assert manifest["accept_length"] >= 0.95 * ten_epochs["manifest"]["accept_length"]


def test_a_full_vocabulary_draft_is_kept_whole_when_the_draft_vocabulary_is_the_target_s(
    demo_states: dict, ten_epochs: dict, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    published = full_vocabulary_copy(ten_epochs["draft"], demo_states["target"], tmp_path / "published", prefix="model.")
    vocab = vocab_size(demo_states["target"])

    manifest = run_train(demo_states, "full-whole", epochs=1, init_draft=str(published), draft_vocab_size=vocab)

    weights = load_file(str(Path(manifest["draft"]) / "model.safetensors"))
    assert manifest["draft_vocab_size"] == vocab and weights["lm_head.weight"].shape[0] == vocab
    assert bool(weights["t2d"].all()) and not weights["d2t"].any()  # every draft id is its target id
    assert manifest["steps"] > 0 and manifest["accept_length"] > 1.5


def test_a_draft_of_the_wrong_width_is_refused_in_one_line_before_training(
    demo_states: dict, ten_epochs: dict, tmp_path: Path
) -> None:
    wide = tmp_path / "wide"
    shutil.copytree(ten_epochs["draft"], wide)
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "target_hidden_size": 128}))
    env = train_env(demo_states, "wide", init_draft=str(wide))

    result = run_stage("train", env)

    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (f"stages.train.init_draft {wide}: hidden_size 128 but the target's hidden size is 64: "
        "a draft of another target (or width) cannot go on training here") in result.stderr.strip().splitlines()[-1]
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (Path(env["AERIE_OUTPUT"]) / "history.json").exists()  # nothing trained


def _edited(draft: Path, out: Path, **changes) -> Path:
    shutil.copytree(draft, out)
    config = json.loads((out / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return out


@pytest.mark.parametrize(("changes", "settings", "expected"), [
    ({"target_hidden_size": 32}, {}, r": target_hidden_size 32 but the target's hidden size is 64"),
    ({"vocab_size": 999}, {}, r": vocab_size 999 but the target's vocabulary is \d+$"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}, {},
     r": serves aux layers \[1, 2, 3\] but stages.extract.layers is \[0, 1, 2\]; extract the layers"),
    ({}, {"draft_vocab_size": 200},
     r": its draft vocabulary is 256 \(d2t/t2d\) but stages.train.draft_vocab_size is 200; set stages.train.draft_vocab_size: 256"),
    ({"architectures": ["Eagle3DeepseekV2ForCausalLM"], "kv_lora_rank": 512}, {},
     r": an MLA draft \(Eagle3DeepseekV2ForCausalLM; kv_lora_rank\): aerie trains LlamaForCausalLMEagle3 drafts"),
    ({"architectures": ["LlamaForCausalLMEagle"]}, {}, r": architectures \['LlamaForCausalLMEagle'\], not"),
    ({"num_hidden_layers": 2}, {}, r": 2 decoder layers; aerie trains one-layer drafts"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, {}, r": rope_scaling yarn: aerie's draft applies plain RoPE"),
    ({"intermediate_size": 99}, {}, r": has shapes midlayer.mlp.down_proj.weight \[64, \d+\] \(config.json: \[64, 99\]\)"),
])
def test_a_draft_that_does_not_fit_the_target_or_the_settings_is_refused_in_one_line(
    demo_states: dict, ten_epochs: dict, tmp_path: Path, changes: dict, settings: dict, expected: str
) -> None:
    draft = _edited(ten_epochs["draft"], tmp_path / "draft", **changes)

    with pytest.raises(StageInputError, match=rf"^stages\.train\.init_draft {draft}{expected}") as refused:
        run_train(demo_states, "refused", init_draft=str(draft), **settings)
    assert "\n" not in str(refused.value)


def test_a_missing_draft_or_one_beside_a_draft_config_is_refused_in_one_line(demo_states: dict, tmp_path: Path) -> None:
    with pytest.raises(StageInputError, match=rf"^stages\.train\.init_draft '{tmp_path}/none': no config.json in"):
        run_train(demo_states, "none", init_draft=str(tmp_path / "none"))
    with pytest.raises(StageInputError, match=r"^stages\.train\.init_draft and stages\.train\.draft_config are both set"):
        run_train(demo_states, "both", init_draft=str(tmp_path), draft_config=str(tmp_path / "x.json"))


def test_published_weight_names_are_read_under_aerie_s_names() -> None:
    assert aerie_name("language_model.model.layers.0.self_attn.q_proj.weight") == "midlayer.self_attn.q_proj.weight"
    assert aerie_name("model.fc.weight") == "fc.weight" and aerie_name("language_model.lm_head.weight") == "lm_head.weight"
    assert aerie_name("midlayer.hidden_norm.weight") == "midlayer.hidden_norm.weight" and aerie_name("d2t") == "d2t"


def test_a_warm_start_whose_every_epoch_measures_below_its_start_keeps_the_draft_it_began_with_and_says_so(
    demo_states: dict, ten_epochs: dict
) -> None:
    from safetensors.torch import load_file

    progress = Progress()
    # A learning rate a thousand times the demo's, at full rate from the first step: it wrecks the draft.
    env = train_env(demo_states, "too-high", epochs=2, init_draft=str(ten_epochs["draft"]), learning_rate=3.0,
                    warmup_fraction=0.0)
    manifest = train.run(context(env), progress)

    history = manifest["epoch_history"]
    assert all(e["accept_length"] < history[0]["accept_length"] for e in history[1:]), history
    assert manifest["kept_epoch"] == 0 and manifest["last_epoch"] == 2
    assert manifest["accept_length"] == history[0]["accept_length"]
    assert progress.message.startswith("kept epoch 0's draft (the one training started from)"), progress.message
    assert "every epoch measured below it" in manifest["kept_reason"]
    output = Path(env["AERIE_OUTPUT"])
    kept, began = (load_file(str(p / "model.safetensors")) for p in (output / "draft", ten_epochs["draft"]))
    assert all(torch.equal(kept[k], began[k]) for k in began)  # draft/ is the draft it began with, bit for bit
    last = load_file(str(output / "last" / "model.safetensors"))
    assert not torch.equal(last["fc.weight"], began["fc.weight"])  # last/ is what the two epochs made of it
    assert json.loads((output / "draft" / "aerie.json").read_text())["epoch"] == 0


def test_the_learning_rate_of_a_warm_start_rises_over_its_first_steps_and_a_new_draft_s_does_not() -> None:
    from remote.eagle3.trainer import rate_factor
    from remote.eagle3.train_settings import TrainSettings
    from benchmarks.harness.stage_settings import complete

    warm = TrainSettings.from_config(complete("train", {"init_draft": "/somewhere"}))
    new = TrainSettings.from_config(complete("train", {}))

    assert warm.warmup_steps(100) == 10 and new.warmup_steps(100) == 0
    # A linear rise over the cosine: a tenth of its rate at the first step, all of it from the tenth on.
    assert [rate_factor(i, 100, 10) / rate_factor(i, 100, 0) for i in (0, 4, 9, 50)] == pytest.approx([0.1, 0.5, 1.0, 1.0])
    assert rate_factor(0, 100, 0) == 1.0
