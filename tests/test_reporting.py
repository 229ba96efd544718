"""``stages.train.report_to``: training's curves as TensorBoard event files (read back with TensorBoard's
own reader) or a W&B run, for aerie's trainer and as SpecForge's own ``tracking.report_to``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remote.eagle3 import StageInputError, reporting, specforge
from remote.control_plane.progress import Progress
from remote.stages import train
from tests.pipeline_fixtures import REPO, TINY_LAYERS, context, crash_after, extracted, run_stage, stage_env, tiny_target
from tests.helpers.events import read_events

__all__ = ["extracted", "tiny_target"]  # fixtures used below

#: 10 records, 2 held out: 8 trained in batches of 2, 4 steps an epoch.
SETTINGS = {"draft_vocab_size": 200, "epochs": 2, "batch_size": 2, "learning_rate": 3e-3, "ttt_steps": 3,
            "eval_records": 2, "report_to": "tensorboard"}


def train_env(extracted: dict, target: Path, dataset: str, **settings) -> dict:
    env = stage_env(extracted["root"], "train", {**SETTINGS, **settings}, {"target": {"model": str(target)}}, dataset=dataset)
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [extracted["env"]["AERIE_OUTPUT"]]})
    return env


def assert_events_are_the_run(output: Path) -> dict[str, list[tuple[int, float]]]:
    """The event files hold the run's history.json step for step and its manifest's epochs at each epoch's last step."""
    history = json.loads((output / "history.json").read_text())
    manifest = json.loads((output / "manifest.json").read_text())
    scalars = read_events(output / reporting.TENSORBOARD_DIR)

    assert [s for s, _ in scalars["train/loss"]] == [h["step"] for h in history]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([h["loss"] for h in history], rel=1e-6)
    for k in range(SETTINGS["ttt_steps"]):
        assert [v for _, v in scalars[f"train/acc_{k}"]] == pytest.approx([h[f"acc_{k}"] for h in history], abs=1e-4)
    epochs = manifest["epoch_history"]
    per_epoch = len(history) // epochs[-1]["epoch"]  # epoch 0 is measured before the first step, at step 0
    assert [s for s, _ in scalars["eval/accept_length"]] == [e["epoch"] * per_epoch for e in epochs]
    assert [v for _, v in scalars["eval/accept_length"]] == pytest.approx([e["accept_length"] for e in epochs], abs=1e-4)
    assert [v for _, v in scalars["eval/acc_2"]] == pytest.approx([e["eval_acc_2"] for e in epochs], abs=1e-4)
    assert [v for _, v in scalars["train/epoch"]] == [e["epoch"] for e in epochs]
    return scalars


def test_a_train_run_reporting_to_tensorboard_writes_event_files_tensorboard_reads_back_as_the_run_s_metrics(
    extracted: dict, tiny_target: Path
) -> None:
    env = train_env(extracted, tiny_target, "tb")
    result = run_stage("train", env)
    assert result.returncode == 0, result.stderr
    output = Path(env["AERIE_OUTPUT"])

    scalars = assert_events_are_the_run(output)

    assert set(scalars) == {"train/loss", "train/acc_0", "train/acc_1", "train/acc_2", "train/epoch", "eval/loss",
                            "eval/accept_length", "eval/acc_0", "eval/acc_1", "eval/acc_2"}
    assert len(scalars["train/loss"]) == 8 and (output / reporting.TENSORBOARD_DIR).parent == (output / "draft").parent


def test_a_run_killed_mid_epoch_and_resumed_reads_back_as_one_curve_without_the_steps_it_took_twice(
    extracted: dict, tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = train_env(extracted, tiny_target, "tb-resumed", checkpoint_every=3)
    crash_after(monkeypatch, 7)  # in epoch 2; the last checkpoint is step 6: step 7 is taken again
    with pytest.raises(KeyboardInterrupt):
        train.run(context(env), Progress())
    monkeypatch.undo()

    manifest = train.run(context(env), Progress())

    assert manifest["resumed_from_step"] == 6
    assert len(list((Path(env["AERIE_OUTPUT"]) / reporting.TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 2
    scalars = assert_events_are_the_run(Path(env["AERIE_OUTPUT"]))
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 9))


def test_report_to_none_writes_no_event_files_and_trains_on_a_host_without_tensorboard(
    extracted: dict, tiny_target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed: importing it fails
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    env = train_env(extracted, tiny_target, "no-report", report_to="none", epochs=1)

    manifest = train.run(context(env), Progress())

    assert manifest["steps"] == 4 and not (Path(env["AERIE_OUTPUT"]) / reporting.TENSORBOARD_DIR).exists()


def test_importing_the_train_stage_and_the_chunked_trainer_imports_neither_tensorboard_nor_wandb() -> None:
    code = ("import sys, remote.stages.train, remote.orchestration.resident; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'wandb') or 'tensorboard' in m))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("kind", ["tensorboard", "wandb"])
def test_a_host_without_the_chosen_package_is_told_in_one_line_what_to_install_before_anything_trains(
    extracted: dict, tiny_target: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setitem(sys.modules, kind, None)
    env = train_env(extracted, tiny_target, f"no-{kind}", report_to=kind)

    with pytest.raises(StageInputError) as refused:
        train.run(context(env), Progress())

    assert str(refused.value) == (f"stages.train.report_to {kind}: this host's Python has no {kind}; "
                                  f"pip install {reporting.PACKAGES[kind]} on the host (or set report_to: none)")
    assert not (Path(env["AERIE_OUTPUT"]) / "history.json").exists()


def test_an_unknown_report_to_is_refused_naming_the_choices(extracted: dict, tiny_target: Path) -> None:
    env = train_env(extracted, tiny_target, "mlflow", report_to="mlflow")

    with pytest.raises(StageInputError, match=r"^stages\.train\.report_to 'mlflow': expected one of none, tensorboard, wandb$"):
        train.run(context(env), Progress())


def test_w_and_b_runs_offline_unless_the_host_has_a_key_or_says_otherwise(tmp_path: Path) -> None:
    no_netrc = tmp_path / "absent"
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")

    assert reporting.wandb_mode({}, no_netrc) == "offline"
    assert reporting.wandb_mode({"WANDB_API_KEY": "k"}, no_netrc) == "online"
    assert reporting.wandb_mode({}, netrc) == "online"
    assert reporting.wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}, netrc) == "offline"
    netrc.write_text("machine example.org\n  login user\n  password abc123\n")
    assert reporting.wandb_mode({}, netrc) == "offline"


def _run(tmp_path: Path, target: Path, draft: Path, states: Path, report_to: str) -> specforge.SpecForgeRun:
    return specforge.SpecForgeRun(
        specforge_dir=None, target_model=target, draft_config=draft, train_data=None, hidden_states=states,
        output=tmp_path / "out", epochs=1, batch_size=1, learning_rate=1e-4, max_length=64, chat_template="unused",
        ttt_steps=3, nproc=1, layers=TINY_LAYERS, report_to=report_to)


@pytest.mark.parametrize("report_to", ["none", "tensorboard", "wandb"])
def test_specforge_s_run_config_carries_report_to_in_its_own_schema(
    tmp_path: Path, tiny_target: Path, extracted: dict, report_to: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specforge.config import load_config
    from specforge.training.assembly import _configured_logger

    from remote.eagle3 import draft_config

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key
    config = json.loads((tiny_target / "config.json").read_text())
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps(draft_config.build(config, TINY_LAYERS, 200)))
    run = _run(tmp_path, tiny_target, draft, Path(extracted["env"]["AERIE_OUTPUT"]), report_to)
    run.output.mkdir()
    path = specforge.write_config(run)

    loaded = load_config(str(path))  # SpecForge's own loader and schema

    assert loaded.tracking.report_to == report_to
    if report_to == "wandb":
        assert loaded.tracking.wandb_offline is True and loaded.tracking.wandb_dir == str(run.output / "wandb")
        assert loaded.tracking.wandb_name == run.run_id
    if report_to == "tensorboard":  # SpecForge's own tracker, built from the config: its event files under output_dir/runs
        logger = _configured_logger(loaded)
        logger({"train/loss": 1.5}, 3)
        logger.close()
        assert read_events(Path(loaded.output_dir) / "runs") == {"train/loss": [(3, 1.5)]}
