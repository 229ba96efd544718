"""A stand-in for SpecForge's two CLIs where the real one needs a GPU: the online route, whose
target runs in SGLang capture servers and whose states travel through Mooncake. The offline route
runs the real SpecForge 0.2.0 on a CPU (tests/specforge_cpu.py).

It is not SpecForge, but it refuses what SpecForge refuses: a run config goes through SpecForge's
own `load_config`, `resolve_run` and `build_launch_plan` (what ``specforge train --plan`` runs, all
on a CPU) before anything else, and tests/test_specforge.py feeds both the same bad configs. Past
that it checks the inputs exist and writes checkpoints in SpecForge's layouts with a randomly
initialised draft (aerie's own module, same names).

- ``specforge train --config run.yaml``: ``<output_dir>/<run_id>-step<N>/training_state.pt``
  (``strategy``, ``draft_state_dict``) and a ``<run_id>-latest`` link;
- ``specforge export --to sglang --checkpoint C --draft-config D --output-dir O``: the draft
  directory (config.json, model.safetensors) SGLang loads;
- ``torchrun --standalone --nproc_per_node N <dir>/scripts/train_eagle3.py --flags``: the legacy
  trainer (not in SpecForge 0.2.0: no real one to check against), ``<output-dir>/epoch_<E>_step_<S>/``
  in SGLang's layout.

Every call is appended to ``$STANDIN_LOG`` as JSON.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from remote.eagle3.checkpoint import state_for_sglang
from remote.eagle3.model import Eagle3Draft


def fail(message: str) -> None:
    print(f"specforge stand-in: {message}", file=sys.stderr)
    raise SystemExit(2)


def log(entry: dict) -> None:
    with open(os.environ["STANDIN_LOG"], "a") as handle:
        handle.write(json.dumps(entry) + "\n")


def ckpts(path: Path) -> list[str]:
    return sorted(str(p) for p in Path(path).rglob("*.ckpt")) + sorted(
        str(p) for d in Path(path).iterdir() if d.is_symlink() for p in d.resolve().glob("*.ckpt"))


def draft(config_path: str) -> dict:
    config = json.loads(Path(config_path).read_text())
    torch.manual_seed(0)
    return state_for_sglang(Eagle3Draft(config))


def check(config_path: str) -> dict:
    """The run config, or SystemExit with SpecForge's own reason: its schema, its algorithm's checks
    and its launch plan, as ``specforge train --config X --plan`` runs them."""
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.launch_plan import build_launch_plan

    try:
        resolved = resolve_run(load_config(config_path))
        build_launch_plan(resolved.config, algorithm=resolved.algorithm, config_path=config_path, env={})
    except ValueError as exc:  # pydantic's ValidationError is one
        fail(f"SpecForge refuses {config_path}: {str(exc).splitlines()[0]}")
    return json.loads(Path(config_path).read_text())  # JSON is YAML


def train(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="specforge train")
    parser.add_argument("-c", "--config", required=True)
    args = parser.parse_args(argv)
    config = check(args.config)
    model, data, training = config["model"], config["data"], config["training"]
    if not (Path(model["target_model_path"]) / "config.json").is_file():
        fail("model.target_model_path has no config.json")
    draft_config = json.loads(Path(model["draft_model_config"]).read_text())
    if draft_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] != model["aux_hidden_state_layer_ids"]:
        fail("the draft config's aux layers differ from model.aux_hidden_state_layer_ids")
    mode = "offline" if data.get("hidden_states_path") else "online"
    if mode == "offline" and not ckpts(Path(data["hidden_states_path"])):
        fail("no .ckpt under data.hidden_states_path")
    if mode == "online" and not (Path(data["prompts_path"]).is_file() and Path(model["vocab_mapping_path"]).is_file()):
        fail("data.prompts_path or model.vocab_mapping_path is not a file")
    out = Path(config["output_dir"])
    step = 10 * training["num_epochs"]
    checkpoint = out / f"{config['run_id']}-step{step}"
    checkpoint.mkdir(parents=True, exist_ok=True)
    torch.save({"strategy": "eagle3", "global_step": step, "draft_state_dict": draft(model["draft_model_config"])},
               checkpoint / "training_state.pt")
    latest = out / f"{config['run_id']}-latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(checkpoint.name)
    log({"cli": "train", "mode": mode, "config": config, "samples": len(ckpts(Path(data["hidden_states_path"]))) if mode == "offline" else 0})


def export(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="specforge export")
    parser.add_argument("--to", choices=("hf", "sglang"), required=True)
    for flag in ("--checkpoint", "--draft-config", "--output-dir"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    state = torch.load(Path(args.checkpoint) / "training_state.pt", weights_only=False)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state["draft_state_dict"], str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(Path(args.draft_config).read_text())
    log({"cli": "export", "args": vars(args)})


def legacy(argv: list[str]) -> None:
    launcher = argparse.ArgumentParser(prog="torchrun")
    launcher.add_argument("--standalone", action="store_true")
    launcher.add_argument("--nproc_per_node", type=int, required=True)
    launcher.add_argument("script")
    known, rest = launcher.parse_known_args(argv)
    if not known.script.endswith("scripts/train_eagle3.py") or not Path(known.script).is_file():
        fail(f"not SpecForge's legacy trainer: {known.script}")
    parser = argparse.ArgumentParser(prog="train_eagle3.py")
    for flag in ("--target-model-path", "--draft-model-config", "--train-data-path", "--output-dir"):
        parser.add_argument(flag, required=True)
    for flag in ("--train-hidden-states-path", "--num-epochs", "--batch-size", "--learning-rate", "--max-length",
                 "--chat-template", "--ttt-length", "--cache-dir", "--embedding-key", "--target-model-backend"):
        parser.add_argument(flag)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(rest)
    if args.train_hidden_states_path and not ckpts(Path(args.train_hidden_states_path)):
        fail("no .ckpt under --train-hidden-states-path")
    out = Path(args.output_dir) / f"epoch_{int(args.num_epochs) - 1}_step_{10 * int(args.num_epochs)}"
    out.mkdir(parents=True, exist_ok=True)
    save_file(draft(args.draft_model_config), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(Path(args.draft_model_config).read_text())
    torch.save({"epoch": 0}, out / "training_state.pt")
    log({"cli": "legacy", "mode": "offline" if args.train_hidden_states_path else "online", "args": vars(args),
         "nproc": known.nproc_per_node})


if __name__ == "__main__":
    command, argv = sys.argv[1], sys.argv[2:]
    {"train": train, "export": export, "torchrun": legacy}[command](argv)
