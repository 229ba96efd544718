"""Run SpecForge's EAGLE-3 trainer instead of aerie's (``stages.train.engine: specforge``).

SpecForge is not a dependency of aerie; the host has it installed. Two
generations exist, and the one on the host is detected:

- **current** (SpecForge's main since July 2026): one typed config and one CLI,
  ``specforge train --config run.yaml`` (the ``specforge`` console script, or
  ``python -m specforge.cli`` from a checkout in ``stages.train.specforge_dir``).
  Offline, ``data.hidden_states_path`` is extract's output (SpecForge's offline
  ``.ckpt`` layout already); online, ``data.train_data_path`` is prep's
  conversations and the target runs in SGLang (``model.target_backend:
  sglang``, ``deployment.mode: disaggregated`` with the capture server's URL).
  Checkpoints are ``<out>/<run_id>-step<N>/training_state.pt`` with a
  ``<run_id>-latest`` link; ``specforge export --to sglang`` turns the latest
  into a draft directory SGLang loads; ``training.resume_from`` resumes.
- **legacy** (older checkouts): ``torchrun ... <specforge_dir>/scripts/train_eagle3.py``
  with flags, offline with ``--train-hidden-states-path``, online without it;
  ``--resume``; checkpoints ``<out>/epoch_<E>_step_<S>/`` are already SGLang's layout.

Either way train's output is ``<output>/draft/``, a draft SGLang loads, whose
``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang's convention, see
`remote.eagle3.layers`) equals the layers the states were captured with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError
from remote.settings import need

SCRIPT = Path("scripts") / "train_eagle3.py"
CLI_MODULE = Path("specforge") / "cli.py"
RUN_ID = "aerie-eagle3"
LEGACY_CHECKPOINT = re.compile(r"epoch_(\d+)_step_(\d+)$")


@dataclass(frozen=True)
class SpecForgeRun:
    """What the command and the run config are built from."""

    specforge_dir: Path | None
    target_model: Path
    draft_config: Path
    train_data: Path | None
    hidden_states: Path | None  # None: online (the target runs alongside)
    output: Path
    epochs: int
    batch_size: int
    learning_rate: float
    max_length: int
    chat_template: str
    ttt_steps: int
    nproc: int
    layers: list[int] = field(default_factory=list)
    embedding_key: str = "model.embed_tokens.weight"
    lm_head_key: str = "lm_head.weight"
    trust_remote_code: bool = False
    server_urls: list[str] = field(default_factory=list)
    deployment: dict[str, Any] = field(default_factory=dict)

    @property
    def is_online(self) -> bool:
        return self.hidden_states is None

    @property
    def runs(self) -> Path:
        """Where SpecForge writes its checkpoints (train's own output keeps `draft/` for the export)."""
        return self.output / "specforge"


def settings(stage: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The SpecForge-only settings, with the one-line errors a missing one deserves."""
    env = os.environ if env is None else env
    where = stage.get("specforge_dir") or env.get("SPECFORGE_DIR")
    if not stage.get("draft_config"):
        raise StageInputError("engine specforge needs stages.train.draft_config (e.g. SpecForge's configs/kimi-k25-eagle3.json)")
    return {
        "specforge_dir": Path(where).expanduser() if where else None,
        "chat_template": need(stage, "train", "chat_template", StageInputError),
        "nproc": int(need(stage, "train", "nproc", StageInputError)),
        "max_length": int(need(stage, "train", "max_length", StageInputError)),
    }


def detect(specforge_dir: Path | None) -> tuple[str, list[str]]:
    """("current", the CLI's argv prefix) or ("legacy", torchrun's); a one-line refusal when neither is there.

    A checkout in `specforge_dir` decides (its ``specforge/cli.py``, else its
    ``scripts/train_eagle3.py``); without one, the ``specforge`` on PATH.
    """
    if specforge_dir is not None and (specforge_dir / CLI_MODULE).is_file():
        return "current", [sys.executable, "-m", "specforge.cli"]
    if specforge_dir is not None and (specforge_dir / SCRIPT).is_file():
        if shutil.which("torchrun") is None:
            raise StageInputError("engine specforge: torchrun is not on PATH; install torch in the host's Python")
        return "legacy", ["torchrun"]
    found = shutil.which("specforge")
    if found:
        return "current", [found]
    where = f"no {CLI_MODULE} or {SCRIPT} under {specforge_dir}" if specforge_dir else "no `specforge` on PATH"
    raise StageInputError(
        f"SpecForge is not installed: {where}; pip install SpecForge (sgl-project/SpecForge) on the host "
        "and set stages.train.specforge_dir to its checkout, or use engine: aerie"
    )


def environment(specforge_dir: Path | None) -> dict[str, str]:
    """The environment SpecForge runs in: a checkout importable as `specforge`."""
    env = dict(os.environ)
    if specforge_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(specforge_dir), env.get("PYTHONPATH", "")) if p)
    return env


def run_config(run: SpecForgeRun) -> dict[str, Any]:
    """`specforge train --config`'s typed config (SpecForge's `Config` schema)."""
    model = {
        "target_model_path": str(run.target_model), "draft_model_config": str(run.draft_config),
        "target_backend": "sglang", "aux_hidden_state_layer_ids": list(run.layers),
        "embedding_key": run.embedding_key, "lm_head_key": run.lm_head_key,
        "trust_remote_code": run.trust_remote_code, "torch_dtype": "bfloat16",
    }
    data: dict[str, Any] = {"max_length": run.max_length, "chat_template": run.chat_template,
                            "cache_dir": str(run.output / "cache")}
    if run.is_online:
        data["train_data_path"] = str(run.train_data)
    else:
        data["hidden_states_path"] = str(run.hidden_states)
    training: dict[str, Any] = {
        "strategy": "eagle3", "num_epochs": run.epochs, "batch_size": run.batch_size,
        "learning_rate": run.learning_rate, "max_grad_norm": 0.5, "ttt_length": run.ttt_steps, "seed": 0,
    }
    if latest_checkpoint("current", run) is not None:
        training["resume_from"] = str(run.runs)  # its `<run_id>-latest` link names the step
    trainer = {"nnodes": 1, "nproc_per_node": run.nproc}
    if run.is_online:
        deployment = {"mode": "disaggregated", "trainer": trainer,
                      "disaggregated": {"server_urls": run.server_urls or ["http://127.0.0.1:30000"]}}
        deployment = _merge(deployment, run.deployment)
    else:
        deployment = _merge({"mode": "local_colocated", "trainer": trainer}, run.deployment)
    return {"model": model, "data": data, "training": training, "run_id": RUN_ID,
            "output_dir": str(run.runs), "deployment": deployment}


def command(run: SpecForgeRun, generation: str = "legacy", prefix: list[str] | None = None) -> list[str]:
    """The argv that trains: `specforge train --config` (current) or torchrun of the script (legacy)."""
    if generation == "current":
        return [*(prefix or ["specforge"]), "train", "--config", str(run.output / "run.yaml")]
    argv = [
        "torchrun", "--standalone", "--nproc_per_node", str(run.nproc), str((run.specforge_dir or Path(".")) / SCRIPT),
        "--target-model-path", str(run.target_model),
        "--draft-model-config", str(run.draft_config),
        "--train-data-path", str(run.train_data),
        "--output-dir", str(run.runs),
        "--num-epochs", str(run.epochs),
        "--batch-size", str(run.batch_size),
        "--learning-rate", str(run.learning_rate),
        "--max-length", str(run.max_length),
        "--chat-template", run.chat_template,
        "--ttt-length", str(run.ttt_steps),
        "--embedding-key", run.embedding_key,
        "--cache-dir", str(run.output / "cache"),
    ]  # fmt: skip
    if run.is_online:
        argv += ["--target-model-backend", "sglang"]
    else:
        argv += ["--train-hidden-states-path", str(run.hidden_states)]
    if run.trust_remote_code:
        argv.append("--trust-remote-code")
    if latest_checkpoint("legacy", run) is not None:
        argv.append("--resume")
    return argv


def write_config(run: SpecForgeRun) -> Path:
    """run.yaml (JSON, which is YAML), written under a run-unique name and renamed."""
    path = run.output / "run.yaml"
    tmp = path.with_name(f".run.yaml.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(run_config(run), indent=2))
    os.replace(tmp, path)
    return path


def latest_checkpoint(generation: str, run: SpecForgeRun) -> Path | None:
    """The newest checkpoint SpecForge wrote under `run.runs`, or None."""
    if not run.runs.is_dir():
        return None
    if generation == "current":
        link = run.runs / f"{RUN_ID}-latest"
        if link.exists():
            return link.resolve()
        steps = sorted(run.runs.glob(f"{RUN_ID}-step*"), key=lambda p: int(p.name.rsplit("step", 1)[1] or 0))
        return steps[-1] if steps else None
    found = [(tuple(map(int, m.groups())), p) for p in run.runs.iterdir() if (m := LEGACY_CHECKPOINT.search(p.name))]
    return max(found)[1] if found else None


def export_command(prefix: list[str], run: SpecForgeRun, checkpoint: Path, out: Path) -> list[str]:
    return [*prefix, "export", "--to", "sglang", "--checkpoint", str(checkpoint),
            "--draft-config", str(run.draft_config), "--output-dir", str(out)]


def finish_draft(draft_dir: Path, layers: list[int]) -> dict[str, Any]:
    """Make the exported draft's config name the captured layers in SGLang's convention; refuse a
    draft trained for other layers (SGLang would capture the wrong states and accept nothing)."""
    path = draft_dir / "config.json"
    if not path.is_file() or not any(draft_dir.glob("*.safetensors")):
        raise StageInputError(f"SpecForge left no draft in {draft_dir} (config.json and *.safetensors expected)")
    config = json.loads(path.read_text())
    eagle = dict(config.get("eagle_config") or {})
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None and list(ids) != list(layers):
        raise StageInputError(f"SpecForge's draft serves aux layers {list(ids)} but the states were captured at {layers}")
    eagle.update(eagle_aux_hidden_state_layer_ids=list(layers), use_aux_hidden_state=True)
    config["eagle_config"] = eagle
    config["architectures"] = config.get("architectures") or ["LlamaForCausalLMEagle3"]
    tmp = path.with_name(f".config.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return config


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged
