"""engine: specforge -- checked against the real SpecForge 0.2.0 (the pinned wheel `.ci/setup` installs).

- The offline route runs the real `specforge train` and `specforge export --to sglang` on a CPU
  (tests/specforge_cpu.py swaps its Triton loss for the same math in torch), through aerie's own
  train stage, and the draft it exports loads strictly into aerie's draft model.
- The online route needs SGLang capture servers and Mooncake (GPUs), so a stand-in
  (tests/stages/specforge_standin.py) takes SpecForge's place; the run config aerie writes for it
  goes through SpecForge's own schema and launch plan, and the stand-in refuses every bad config the
  real package refuses (the same configs are fed to both here).
- The legacy script (older checkouts, not in 0.2.0) is the stand-in's alone.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.harness.stage_settings import complete
from remote.eagle3 import StageInputError, checkpoint, draft_config
from remote.eagle3 import specforge
from remote.eagle3.target import read_embed_and_head, read_shape
from remote.control_plane.progress import Progress
from remote.stages import train
from tests.helpers.notes import Notes
from tests.pipeline_fixtures import (
    EXTRACT_SETTINGS, REPO, TINY_LAYERS, context, extract_again, extracted, make_records, run_stage, stage_env,
    tiny_target, vocab_size, write_prep,
)

__all__ = ["extracted", "tiny_target"]  # fixtures used below

STANDIN = REPO / "tests" / "stages" / "specforge_standin.py"
CPU_SPECFORGE = REPO / "tests" / "specforge_cpu.py"
MOONCAKE = {"metadata_server": "http://127.0.0.1:8080/metadata", "master_server_addr": "127.0.0.1:50051"}
ONLINE = {"specforge_server_urls": ["http://127.0.0.1:30000"], "specforge_mooncake": MOONCAKE}
#: The online route's train job carries extract's settings (no extract job names the layers SGLang captures).
EXTRACT_ONLINE = complete("extract", {"layers": TINY_LAYERS})


def on_path(bin_dir: Path, name: str, argv: str) -> None:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {argv} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def host(tmp_path: Path, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A bin directory on PATH with the stand-in `specforge` and `torchrun`, a draft config and conversations."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    on_path(bin_dir, "specforge", str(STANDIN))
    on_path(bin_dir, "torchrun", f"{STANDIN} torchrun")
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


@pytest.fixture
def real(host: dict) -> dict:
    """`specforge` on PATH is the real SpecForge 0.2.0 (on a CPU) instead of the stand-in."""
    on_path(host["bin"], "specforge", str(CPU_SPECFORGE))
    return host


@pytest.fixture(scope="module")
def bf16_extracted(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """extract over 10 records stored as bfloat16, the states SpecForge trains on."""
    root = tmp_path_factory.mktemp("aerie-root-bf16")
    write_prep(root / "data" / "A1", make_records(10, vocab_size(tiny_target)))
    env = stage_env(root, "extract", {**EXTRACT_SETTINGS, "dtype": "bfloat16"}, {"target": {"model": str(tiny_target)}})
    result = run_stage("extract", env)
    assert result.returncode == 0, result.stderr
    return {"root": root, "env": env}


def run_train(root: Path, target: Path, name: str, settings: dict, progress: Progress | None = None, **config) -> tuple[dict, Path]:
    env = stage_env(root, "train", {"engine": "specforge", "epochs": 2, **settings}, {"target": {"model": str(target)}}, dataset=name)
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), **config})
    return train.run(context(env), progress or Progress()), Path(env["AERIE_OUTPUT"])


def calls(host: dict) -> list[dict]:
    return [json.loads(line) for line in host["log"].read_text().splitlines()] if host["log"].exists() else []


def assert_sglang_draft(out: Path, target: Path) -> None:
    """The draft SGLang loads: LlamaForCausalLMEagle3, the captured layers, every weight under SGLang's names."""
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == TINY_LAYERS
    embed, _ = read_embed_and_head(read_shape(target))
    checkpoint.load(out / "draft", embed)  # strict: a missing or renamed weight fails


@pytest.mark.timeout(900)
def test_the_real_specforge_trains_offline_checkpoints_every_n_steps_exports_starts_afresh_on_new_settings_and_resumes(
    real: dict, bf16_extracted: dict, tiny_target: Path
) -> None:
    inputs = {"inputs": [bf16_extracted["env"]["AERIE_OUTPUT"]]}
    # every record trained on (none held out), so the steps count all 10
    settings = {"draft_config": str(real["draft"]), "epochs": 1, "checkpoint_every": 4, "learning_rate": 1e-3,
                "eval_records": 0}
    first, out = run_train(bf16_extracted["root"], tiny_target, "sf-real", settings, **inputs)

    config = json.loads((out / "run.yaml").read_text())
    assert config["training"]["save_interval"] == 4 and "resume_from" not in config["training"]
    run_id = first["run_id"]
    # 10 records, batch 1: steps 4, 8 and the end's 10, of which the newest two are kept
    assert sorted(p.name for p in (out / "specforge").glob(f"{run_id}-step*")) == [f"{run_id}-step10", f"{run_id}-step8"]
    assert first["specforge"] == "current" and first["checkpoint"].endswith(f"{run_id}-step10")
    assert_sglang_draft(out, tiny_target)

    notes = Notes()  # the user edits epochs: SpecForge would refuse to resume ("written with num_epochs=1 ...")
    changed, _ = run_train(bf16_extracted["root"], tiny_target, "sf-real", {**settings, "epochs": 2}, notes, **inputs)
    assert changed["run_id"] != run_id and changed["checkpoint"].endswith(f"{changed['run_id']}-step20")
    assert notes.lines[0].startswith("verifying the states in ")  # every file checked before SpecForge reads it
    assert notes.lines[1] == (f"settings changed since SpecForge run {run_id} (num_epochs 1 -> 2): training afresh "
                              f"as {changed['run_id']}; the earlier run's checkpoints stay in {out / 'specforge'}")
    assert_sglang_draft(out, tiny_target)

    # back to the first settings, with two runs' checkpoints in the root: SpecForge's resume check passes
    back, _ = run_train(bf16_extracted["root"], tiny_target, "sf-real", settings, **inputs)
    assert json.loads((out / "run.yaml").read_text())["training"]["resume_from"] == first["checkpoint"]
    assert back["run_id"] == run_id and back["checkpoint"] == first["checkpoint"]
    assert_sglang_draft(out, tiny_target)


def weights(draft: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(next(draft.glob("*.safetensors"))))


@pytest.mark.timeout(900)
def test_the_real_specforge_trains_on_the_training_share_only_and_aerie_keeps_its_best_epoch_in_draft_and_the_last_in_last(
    real: dict, bf16_extracted: dict, tiny_target: Path
) -> None:
    inputs = {"inputs": [bf16_extracted["env"]["AERIE_OUTPUT"]]}
    settings = {"draft_config": str(real["draft"]), "epochs": 2, "checkpoint_every": 100, "learning_rate": 1e-3,
                "eval_records": 2}

    manifest, out = run_train(bf16_extracted["root"], tiny_target, "sf-best", settings, **inputs)

    # SpecForge trains on the 8 records aerie does not hold out, and evaluates on the 2 it does after every epoch
    held = {Path(p).resolve() for p in json.loads((out / "heldout.json").read_text())}
    trained = {p.resolve() for p in (out / "specforge-train").iterdir()}
    assert len(held) == 2 and len(trained) == 8 and not held & trained
    config = json.loads((out / "run.yaml").read_text())
    assert config["data"]["eval_hidden_states_path"] == str(out / "specforge-heldout")
    assert config["training"]["eval_interval"] == 8  # an epoch: 8 records, batch 1
    assert {p.resolve() for p in (out / "specforge-heldout").iterdir()} == held
    # aerie measured SpecForge's best epoch (by SpecForge's own evaluation) and its last, with aerie's evaluation
    best_epoch = manifest["specforge_best_step"] // 8
    history = manifest["epoch_history"]
    assert [e["epoch"] for e in history] == sorted({best_epoch, 2}) and all(e["accept_length"] >= 1.0 for e in history)
    best = max(history, key=lambda e: (e["accept_length"], e["epoch"]))
    assert manifest["kept_epoch"] == best["epoch"] and manifest["last_epoch"] == 2
    assert manifest["accept_length"] == best["accept_length"] and manifest["kept_reason"].startswith(
        f"kept epoch {best['epoch']}'s draft")
    same = all(torch.equal(a, weights(out / "last")[name]) for name, a in weights(out / "draft").items())
    assert same == (best["epoch"] == 2)  # draft/ is the last epoch's only when the last is the best
    assert_sglang_draft(out, tiny_target)
    assert (out / "training.png").is_file()


def test_states_extracted_again_under_the_same_names_are_another_specforge_run_and_the_same_ones_resume_it(
    host: dict, bf16_extracted: dict, tiny_target: Path, tmp_path: Path
) -> None:
    import shutil

    states = tmp_path / "extract"
    shutil.copytree(bf16_extracted["env"]["AERIE_OUTPUT"], states)
    settings = {"draft_config": str(host["draft"]), "epochs": 1, "eval_records": 0}
    first, _ = run_train(bf16_extracted["root"], tiny_target, "sf-again", settings, inputs=[str(states)])
    same, _ = run_train(bf16_extracted["root"], tiny_target, "sf-again", settings, inputs=[str(states)])

    extract_again(states)  # new answers: the same names, other states
    notes = Notes()
    again, _ = run_train(bf16_extracted["root"], tiny_target, "sf-again", settings, notes, inputs=[str(states)])

    assert same["run_id"] == first["run_id"] != again["run_id"]
    assert any(line.startswith(f"settings changed since SpecForge run {first['run_id']} (data ") for line in notes.lines)


def test_states_other_than_bfloat16_are_refused_before_specforge_starts(host: dict, extracted: dict, tiny_target: Path) -> None:
    with pytest.raises(StageInputError, match=r"engine specforge trains on bfloat16 states .* extract stored float32: "
                                              r"set stages\.extract\.dtype: bfloat16 and rerun extract"):
        run_train(extracted["root"], tiny_target, "sf-f32", {"draft_config": str(host["draft"])},
                  inputs=[extracted["env"]["AERIE_OUTPUT"]])
    assert calls(host) == []


def online_prep(root: Path, target: Path) -> tuple[Path, list[dict]]:
    records = make_records(6, vocab_size(target), seed=3)
    return write_prep(root / "data" / "A1", records), records


def test_the_online_run_hands_specforge_prep_s_exact_tokens_and_a_config_its_schema_and_launcher_accept(
    host: dict, tmp_path: Path, tiny_target: Path
) -> None:
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from specforge.launch_plan import build_launch_plan

    prep, records = online_prep(tmp_path / "root", tiny_target)
    settings = {"draft_config": str(host["draft"]), "max_length": 64, "draft_vocab_size": 200,
                "report_to": "tensorboard", **ONLINE}

    manifest, out = run_train(tmp_path / "root", tiny_target, "draft", settings, prep_inputs={"A1": str(prep)},
                              extract=EXTRACT_ONLINE)

    (training, _export) = calls(host)
    assert training["mode"] == "online" and manifest["mode"] == "online"
    run_yaml = str(out / "run.yaml")
    config = load_config(run_yaml)  # SpecForge's own schema
    plan = build_launch_plan(config, algorithm=resolve_run(config).algorithm, config_path=run_yaml, env={})
    assert plan.role == "both" and [c.label for c in plan.commands] == ["producer", "consumer"]
    disaggregated = config.deployment.disaggregated
    assert disaggregated.control_dir == str(out / "specforge" / f"{manifest['run_id']}.control")
    assert disaggregated.backend == "mooncake" and disaggregated.server_urls == ["http://127.0.0.1:30000"]
    assert disaggregated.mooncake_metadata_server == MOONCAKE["metadata_server"]
    assert config.training.save_interval == 200 and config.data.train_data_path == ""
    assert config.tracking.report_to == "tensorboard"  # stages.train.report_to, as SpecForge's own key
    prompts = prepare_prompt_tasks(config.data.prompts_path, None, chat_template=None, max_length=64, is_preformatted=False,
                                   train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=1)
    assert [p["payload"] for p in prompts] == [{"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in records]
    import torch

    mapping = torch.load(config.model.vocab_mapping_path)
    assert mapping["d2t"].shape == (200,) and int(mapping["t2d"].sum()) == 200
    assert_sglang_draft(out, tiny_target)


def good_configs(tmp_path: Path, tiny_target: Path, draft: Path, extract: Path) -> dict[str, dict]:
    """The configs aerie writes for each route, written by aerie's own `run_config`."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")
    base = {"specforge_dir": None, "target_model": tiny_target, "draft_config": draft, "train_data": None,
            "output": tmp_path / "out", "epochs": 1, "batch_size": 1, "learning_rate": 1e-4, "max_length": 64,
            "chat_template": "unused", "ttt_steps": 3, "nproc": 1, "layers": TINY_LAYERS}
    offline = specforge.run_config(specforge.SpecForgeRun(**base, hidden_states=extract))
    online = specforge.run_config(specforge.SpecForgeRun(**base, hidden_states=None, prompts=prompts, vocab_mapping=tmp_path / "v.pt",
                                           server_urls=["http://127.0.0.1:30000"], mooncake=MOONCAKE))
    return {"offline": offline, "online": online}


def _without(config: dict, *path: str) -> dict:
    config = json.loads(json.dumps(config))
    node = config
    for key in path[:-1]:
        node = node[key]
    node.pop(path[-1])
    return config


def _with(config: dict, value, *path: str) -> dict:
    config = json.loads(json.dumps(config))
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return config


#: (route, what is wrong, the change): each the real SpecForge refuses (the issue's first four, then others).
BAD = [
    ("online", "no control_dir", lambda c: _without(c, "deployment", "disaggregated", "control_dir")),
    ("online", "no backend", lambda c: _without(c, "deployment", "disaggregated", "backend")),
    ("online", "shared_dir backend", lambda c: _with(c, "shared_dir", "deployment", "disaggregated", "backend")),
    ("online", "no vocab mapping", lambda c: _without(c, "model", "vocab_mapping_path")),
    ("online", "no Mooncake endpoints", lambda c: _without(c, "deployment", "disaggregated", "mooncake_master_server_addr")),
    ("online", "no capture servers", lambda c: _with(c, [], "deployment", "disaggregated", "server_urls")),
    ("online", "colocated", lambda c: _with(c, {"mode": "local_colocated"}, "deployment")),
    ("online", "two data sources", lambda c: _with(c, "/x.jsonl", "data", "train_data_path")),
    ("offline", "two aux layers", lambda c: _with(c, [0, 1], "model", "aux_hidden_state_layer_ids")),
    ("offline", "an HF target backend", lambda c: _with(c, "hf", "model", "target_backend")),
    ("offline", "an unknown key", lambda c: _with(c, 1, "training", "epochs")),
    ("offline", "a strategy it lacks", lambda c: _with(c, "eagle2", "training", "strategy")),
]


def test_the_stand_in_and_the_real_specforge_refuse_the_same_bad_configs_and_accept_aerie_s(
    host: dict, tmp_path: Path, tiny_target: Path, extracted: dict
) -> None:
    from specforge.cli import main as real_specforge

    sys.path.insert(0, str(STANDIN.parent))
    import specforge_standin

    good = good_configs(tmp_path, tiny_target, host["draft"], Path(extracted["env"]["AERIE_OUTPUT"]))
    for route, config in good.items():
        path = tmp_path / f"good-{route}.yaml"
        path.write_text(json.dumps(config))
        assert real_specforge(["train", "--config", str(path), "--plan"]) == 0
        assert specforge_standin.check(str(path)) == config
    for route, what, change in BAD:
        path = tmp_path / f"bad-{what.replace(' ', '-')}.yaml"
        path.write_text(json.dumps(change(good[route])))
        with pytest.raises(ValueError):
            real_specforge(["train", "--config", str(path), "--plan"])
        with pytest.raises(SystemExit, match="2"):
            specforge_standin.check(str(path))


@pytest.mark.parametrize("online", [False, True])
def test_an_older_checkout_s_train_eagle3_script_trains_and_its_checkpoint_becomes_the_draft(
    host: dict, extracted: dict, tiny_target: Path, tmp_path: Path, online: bool
) -> None:
    checkout = tmp_path / "SpecForge"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "train_eagle3.py").write_text("# the legacy trainer (the stand-in runs in its place)\n")
    settings = {"draft_config": str(host["draft"]), "specforge_dir": str(checkout), "nproc": 8,
                "specforge_train_data": str(host["conversations"])}

    config = {"prep_inputs": {"A1": str(tmp_path)}, "extract": EXTRACT_ONLINE} if online \
        else {"inputs": [extracted["env"]["AERIE_OUTPUT"]]}

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


def test_the_online_route_on_the_host_names_the_settings_it_lacks(host: dict, tmp_path: Path, tiny_target: Path) -> None:
    prep, _ = online_prep(tmp_path / "root", tiny_target)
    settings = {"draft_config": str(host["draft"])}
    with pytest.raises(StageInputError, match=r"^engine specforge on the online route needs stages\.train\.specforge_server_urls, "
                                              r"stages\.train\.specforge_mooncake\.metadata_server, "
                                              r"stages\.train\.specforge_mooncake\.master_server_addr$"):
        run_train(tmp_path / "root", tiny_target, "draft", settings, prep_inputs={"A1": str(prep)}, extract=EXTRACT_ONLINE)
    assert calls(host) == []


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_inv_run_on_the_online_route_trains_with_specforge_and_no_states_on_disk(host: dict, tmp_path: Path) -> None:
    from remote.demo import tiny_tokenizer
    from remote.demo import tiny_model
    from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout

    target = tmp_path / "target"
    tiny_tokenizer.build_tokenizer(target)
    tiny_model.main([str(target), "--tokenizer", str(target)])
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    stages = {"prep": {"max_length": 256}, "extract": {"route": "online", "layers": TINY_LAYERS},
              "train": {"engine": "specforge", "draft_config": str(host["draft"]), "draft_vocab_size": 200, **ONLINE}}
    bench.inventory({"chat": {"source": str(SAMPLES["native"]), "kind": "native"}}, stages,
                    target={"tokenizer": str(target), "model": str(target)})
    bench.inv("deploy")

    bench.inv("run")
    final = bench.wait_state("pipeline/run", {"succeeded", "failed"}, timeout=400)

    assert final["state"] == "succeeded", bench.inv("logs", "draft", "--stage", "train", check=False).stdout
    assert set(bench.poll()) == {"chat/prep", "draft/train", "pipeline/run"}  # no extract
    (training,) = [c for c in calls(host) if c["cli"] == "train"]
    assert training["mode"] == "online" and training["config"]["model"]["aux_hidden_state_layer_ids"] == TINY_LAYERS
    assert_sglang_draft(bench.root / "data" / "draft" / "train", target)


def write_inventory(tmp_path: Path, extract: dict, train: dict) -> Path:
    import yaml

    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"backend": "local", "host": {"root": str(tmp_path / "root")},
                                    "stages": {"extract": extract, "train": {"engine": "specforge", **train}},
                                    "datasets": {"A1": {"source": "a.jsonl", "kind": "native"}}}))
    return path


def test_the_inventory_names_every_setting_the_online_specforge_route_lacks_in_one_line(tmp_path: Path) -> None:
    from local.exceptions import AerieError
    from local.inventory.schema import load

    path = write_inventory(tmp_path, {"route": "online", "layers": [2, 30, 58]}, {})
    with pytest.raises(AerieError) as error:
        load(str(path))
    assert str(error.value) == (
        f"{path}: engine specforge on the online route needs stages.train.specforge_server_urls (the SGLang capture "
        "servers' URLs) and stages.train.specforge_mooncake: {metadata_server, master_server_addr} (the Mooncake endpoints)")
    partial = write_inventory(tmp_path, {"route": "online"}, {**ONLINE, "specforge_mooncake": {"metadata_server": "http://m/"}})
    with pytest.raises(AerieError, match=r"stages\.train\.specforge_mooncake\.master_server_addr: missing \(required\)$"):
        load(str(partial))
    assert load(str(write_inventory(tmp_path, {"route": "online"}, ONLINE))).stages.train.specforge_mooncake.master_server_addr


@pytest.mark.parametrize(("extract", "expected"), [
    ({"route": "offline", "dtype": "float32"},
     "stages.extract.dtype: SpecForge trains on bfloat16 states (its target head is bfloat16), not float32"),
    ({"route": "auto", "layers": [2, 30]},
     "stages.extract.layers: SpecForge trains on exactly three distinct layers, not [2, 30]"),
])
def test_the_inventory_refuses_states_specforge_cannot_train_on(tmp_path: Path, extract: dict, expected: str) -> None:
    from local.exceptions import AerieError
    from local.inventory.schema import load

    with pytest.raises(AerieError) as error:
        load(str(write_inventory(tmp_path, extract, {})))
    assert str(error.value).endswith(f": {expected}")


def test_inv_run_on_the_auto_route_refuses_online_specforge_without_its_settings_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from local.tasks import planning
    from local.exceptions import AerieError
    from local.inventory.schema import load

    inventory = load(str(write_inventory(tmp_path, {"route": "auto"}, {})))  # fine while the route is unknown
    host = SimpleNamespace(name="local", root=inventory.host.root, inventory=inventory)
    monkeypatch.setattr(planning, "require", lambda host, names=None: {"route": "online"})

    with pytest.raises(AerieError, match=r"^local: route online \(auto\): engine specforge on the online route needs "
                                         r"stages\.train\.specforge_server_urls .* and stages\.train\.specforge_mooncake"):
        planning.resolve(host)


def test_the_cpu_loss_is_specforge_s_own_reference_loss_in_value_and_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton kernel tests/specforge_cpu.py replaces has a torch reference beside it in SpecForge
    (`_compute_loss`, what its benchmark checks the kernel against): import that module for real, with
    a Triton that only lets it load, and compare."""
    import types

    import torch

    sys.path.insert(0, str(CPU_SPECFORGE.parent))
    import specforge_cpu

    class Anything(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return (lambda function: function) if name == "jit" else Anything(name)

    for name in ("triton", "triton.language"):
        monkeypatch.setitem(sys.modules, name, Anything(name))
    monkeypatch.delitem(sys.modules, "specforge.core.loss", raising=False)
    monkeypatch.setattr(torch, "compile", lambda *a, **k: (lambda function: function))
    from specforge.core.loss import _compute_loss

    monkeypatch.delitem(sys.modules, "specforge.core.loss")
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.softmax(torch.randn(2, 5, 11), -1)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]]).float()[..., None]
    ours = specforge_cpu._log_softmax_loss(logits, target, mask)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    reference = _compute_loss(logits, target, mask)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)
    assert ours_grad[0, 2].abs().sum() == 0  # a masked position learns nothing


@pytest.mark.timeout(900)
def test_the_real_specforge_goes_on_from_init_draft_through_its_weights_only_warm_start(
    real: dict, bf16_extracted: dict, tiny_target: Path
) -> None:
    from safetensors.torch import load_file
    from specforge.config import load_config
    from specforge.modeling.auto import AutoDraftModel
    from specforge.training.model_loading import load_draft_config_source, warm_start_draft_model

    inputs = {"inputs": [bf16_extracted["env"]["AERIE_OUTPUT"]]}
    base, _ = run_train(bf16_extracted["root"], tiny_target, "sf-init-base",
                        {"engine": "aerie", "epochs": 1, "draft_vocab_size": 200, "eval_records": 0}, **inputs)
    init = Path(base["draft"])

    manifest, out = run_train(bf16_extracted["root"], tiny_target, "sf-init",
                              {"init_draft": str(init), "epochs": 1, "draft_vocab_size": 200}, **inputs)

    config = load_config(str(out / "run.yaml"))  # SpecForge's own schema
    assert config.model.draft_checkpoint_path == str(out / "init-draft")
    assert config.model.vocab_mapping_path == str(out / "init-draft-vocab.pt")  # the init draft's map, kept
    # SpecForge's own warm start finds every trained weight of what aerie wrote for it, unchanged.
    draft_config = load_draft_config_source(config.model.draft_model_config)
    model = AutoDraftModel.from_config(draft_config)
    warm_start_draft_model(model, config.model.draft_checkpoint_path, draft_config=draft_config, strategy="eagle3",
                           allow_missing_embedding=True)
    given = load_file(str(init / "model.safetensors"))
    loaded = model.state_dict()
    # (in bfloat16, the draft config's torch_dtype, which SpecForge's from_pretrained loads it as)
    expected = {name: t.to(torch.bfloat16).float() if t.is_floating_point() else t for name, t in given.items()}
    differ = [name for name in given if not torch.equal(loaded[name].to(expected[name].dtype), expected[name])]
    assert set(given) <= set(loaded) and differ == [] and len(given) == 15
    # ... and the draft it trained and exported keeps the init draft's vocabulary map.
    exported = load_file(str(next((out / "draft").glob("*.safetensors"))))
    assert torch.equal(exported["d2t"], given["d2t"]) and manifest["engine"] == "specforge"
    assert_sglang_draft(out, tiny_target)

    again, _ = run_train(bf16_extracted["root"], tiny_target, "sf-init",
                         {"init_draft": str(init), "epochs": 1, "draft_vocab_size": 200}, **inputs)
    resumed = json.loads((out / "run.yaml").read_text())  # a rerun resumes: never a warm start beside resume_from
    assert "draft_checkpoint_path" not in resumed["model"] and resumed["training"]["resume_from"] == again["checkpoint"]
    assert [e["epoch"] for e in again["epoch_history"]][0] == 0  # the init draft measured as epoch 0, a candidate
