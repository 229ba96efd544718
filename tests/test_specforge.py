"""engine: specforge -- SpecForge's current CLI and its legacy script, offline and online, exported for SGLang.

SpecForge needs GPUs, so these tests drive a stand-in (tests/stages/specforge_standin.py) on PATH as
`specforge` and `torchrun`: it checks the arguments and run config the way SpecForge would and
writes checkpoints in SpecForge's layouts. What is tested is aerie's side: detection, the config,
the commands, resuming, and that train's output is a draft SGLang loads with the captured layers.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from remote.eagle3 import StageInputError, checkpoint, draft_config
from remote.eagle3.target import read_embed_and_head, read_shape
from remote.progress import Progress
from remote.stages import train as train_stage
from tests.pipeline_fixtures import REPO, TINY_LAYERS, context, extracted, stage_env, tiny_target

__all__ = ["extracted", "tiny_target"]  # fixtures used below

STANDIN = REPO / "tests" / "stages" / "specforge_standin.py"


@pytest.fixture
def host(tmp_path: Path, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A bin directory on PATH with the stand-in `specforge` and `torchrun`, a draft config and conversations."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, sub in (("specforge", ""), ("torchrun", "torchrun ")):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} {sub}\"$@\"\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    config = json.loads((tiny_target / "config.json").read_text())
    draft = tmp_path / "tiny-eagle3.json"  # like SpecForge's configs/*-eagle3.json
    draft.write_text(json.dumps({k: v for k, v in draft_config.build(config, TINY_LAYERS, 200).items() if k != "eagle_config"}))
    conversations = tmp_path / "conversations.jsonl"
    conversations.write_text(json.dumps({"id": "c1", "conversations": [{"role": "user", "content": "hi"}]}) + "\n")
    return {"bin": bin_dir, "log": log, "draft": draft, "conversations": conversations}


def run_train(root: Path, target: Path, name: str, settings: dict, **config) -> tuple[dict, Path]:
    env = stage_env(root, "train", {"engine": "specforge", "epochs": 2, **settings}, {"target": {"model": str(target)}}, dataset=name)
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), **config})
    return train_stage.run(context(env), Progress()), Path(env["AERIE_OUTPUT"])


def calls(host: dict) -> list[dict]:
    return [json.loads(line) for line in host["log"].read_text().splitlines()]


def assert_sglang_draft(out: Path, target: Path) -> None:
    """The draft SGLang loads: LlamaForCausalLMEagle3, the captured layers, every weight under SGLang's names."""
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == TINY_LAYERS
    embed, _ = read_embed_and_head(read_shape(target))
    checkpoint.load(out / "draft", embed)  # strict: a missing or renamed weight fails


def test_the_current_cli_trains_offline_from_extract_s_states_exports_for_sglang_and_resumes(
    host: dict, extracted: dict, tiny_target: Path
) -> None:
    inputs = {"inputs": [extracted["env"]["AERIE_OUTPUT"]]}
    manifest, out = run_train(extracted["root"], tiny_target, "sf-current", {"draft_config": str(host["draft"])}, **inputs)

    train, export = calls(host)
    assert train["cli"] == "train" and train["mode"] == "offline" and train["samples"] == 10
    config = train["config"]
    assert config["data"]["hidden_states_path"] == extracted["env"]["AERIE_OUTPUT"]
    assert config["model"]["aux_hidden_state_layer_ids"] == TINY_LAYERS and config["model"]["target_backend"] == "sglang"
    assert config["model"]["embedding_key"] == "model.embed_tokens.weight"
    assert config["training"]["num_epochs"] == 2 and "resume_from" not in config["training"]
    assert config["deployment"]["mode"] == "local_colocated"
    assert export["args"]["to"] == "sglang" and export["args"]["checkpoint"].endswith("aerie-eagle3-step20")
    assert manifest["specforge"] == "current" and manifest["mode"] == "offline"
    assert_sglang_draft(out, tiny_target)

    run_train(extracted["root"], tiny_target, "sf-current", {"draft_config": str(host["draft"])}, **inputs)
    assert calls(host)[2]["config"]["training"]["resume_from"] == str(out / "specforge")


def test_the_current_cli_trains_online_with_the_sglang_target_backend(host: dict, tmp_path: Path, tiny_target: Path) -> None:
    prep = tmp_path / "root" / "data" / "A1" / "prep"
    prep.mkdir(parents=True)
    (prep / "conversations.jsonl").write_text(host["conversations"].read_text())
    settings = {"draft_config": str(host["draft"]), "layers": TINY_LAYERS, "specforge_server_urls": ["http://127.0.0.1:30000"]}

    manifest, out = run_train(tmp_path / "root", tiny_target, "draft", settings, prep_inputs={"A1": str(prep)})

    config = calls(host)[0]["config"]
    assert calls(host)[0]["mode"] == "online" and config["data"]["train_data_path"] == str(prep / "conversations.jsonl")
    assert config["deployment"]["mode"] == "disaggregated"
    assert config["deployment"]["disaggregated"]["server_urls"] == ["http://127.0.0.1:30000"]
    assert manifest["mode"] == "online"
    assert_sglang_draft(out, tiny_target)


@pytest.mark.parametrize("online", [False, True])
def test_an_older_checkout_s_train_eagle3_script_trains_and_its_checkpoint_becomes_the_draft(
    host: dict, extracted: dict, tiny_target: Path, tmp_path: Path, online: bool
) -> None:
    checkout = tmp_path / "SpecForge"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "train_eagle3.py").write_text("# the legacy trainer (the stand-in runs in its place)\n")
    settings = {"draft_config": str(host["draft"]), "specforge_dir": str(checkout), "nproc": 8,
                "specforge_train_data": str(host["conversations"]), "layers": TINY_LAYERS}
    config = {"prep_inputs": {"A1": str(tmp_path)}} if online else {"inputs": [extracted["env"]["AERIE_OUTPUT"]]}

    manifest, out = run_train(extracted["root"], tiny_target, f"sf-legacy-{online}", settings, **config)

    (legacy,) = calls(host)
    assert legacy["cli"] == "legacy" and legacy["nproc"] == 8 and legacy["mode"] == ("online" if online else "offline")
    assert legacy["args"]["train_data_path"] == str(host["conversations"])
    assert (legacy["args"]["target_model_backend"] == "sglang") is online
    assert manifest["specforge"] == "legacy"
    assert_sglang_draft(out, tiny_target)
    assert not list((out / "draft").glob("training_state*"))  # the optimizer state stays behind


def test_a_host_without_specforge_is_told_how_to_install_it(host: dict, extracted: dict, tiny_target: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(StageInputError, match=r"SpecForge is not installed: no `specforge` on PATH; pip install SpecForge"):
        run_train(extracted["root"], tiny_target, "sf-none", {"draft_config": str(host["draft"])},
                  inputs=[extracted["env"]["AERIE_OUTPUT"]])


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_inv_run_on_the_online_route_trains_with_specforge_and_no_states_on_disk(host: dict, tmp_path: Path) -> None:
    from remote import tiny_model, tiny_tokenizer
    from tests.harness import SAMPLES, Bench, copy_checkout

    target = tmp_path / "target"
    tiny_tokenizer.build_tokenizer(target)
    tiny_model.main([str(target), "--tokenizer", str(target)])
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    stages = {"prep": {"max_length": 256}, "extract": {"route": "online", "layers": TINY_LAYERS},
              "train": {"engine": "specforge", "draft_config": str(host["draft"]), "draft_vocab_size": 200,
                        "specforge_server_urls": ["http://127.0.0.1:30000"]}}
    bench.inventory({"chat": {"source": str(SAMPLES["native"]), "kind": "native"}}, stages,
                    target={"tokenizer": str(target), "model": str(target)})
    bench.inv("deploy")

    bench.inv("run")
    final = bench.wait_state("pipeline/run", {"succeeded", "failed"}, timeout=400)

    assert final["state"] == "succeeded", bench.inv("logs", "draft", "--stage", "train", check=False).stdout
    assert set(bench.poll()) == {"chat/prep", "draft/train", "pipeline/run"}  # no extract
    (train,) = [c for c in calls(host) if c["cli"] == "train"]
    assert train["mode"] == "online" and train["config"]["model"]["aux_hidden_state_layer_ids"] == TINY_LAYERS
    assert_sglang_draft(bench.root / "data" / "draft" / "train", target)
