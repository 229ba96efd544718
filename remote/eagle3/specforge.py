"""Run SpecForge's EAGLE-3 trainer instead of aerie's (``stages.train.engine: specforge``).

SpecForge is not a dependency of aerie; the host has it installed. Two
generations exist, and the one on the host is detected:

- **current** (SpecForge 0.2.0, the version the tests run for real): one typed
  config and one CLI, ``specforge train --config run.yaml`` (the ``specforge``
  console script, or ``python -m specforge.cli`` from a checkout in
  ``stages.train.specforge_dir``). Offline, ``data.hidden_states_path`` is
  extract's output (SpecForge's offline ``.ckpt`` layout already; bfloat16, since
  SpecForge's target head is). Online, ``data.prompts_path`` is prep's exact tokens
  as JSONL (``input_ids`` + ``loss_mask``: no chat template re-renders them), the
  vocabulary map is built here from them (``model.vocab_mapping_path``: a
  disaggregated run cannot derive one), and the target runs in SGLang capture
  servers (``deployment.mode: disaggregated``, ``backend: mooncake``, the servers'
  URLs and the Mooncake endpoints from the inventory, ``control_dir`` under the
  job's output). Checkpoints are ``<out>/<run_id>-step<N>/`` with a
  ``<run_id>-latest`` link, every ``stages.train.checkpoint_every`` steps
  (``training.save_interval``); ``specforge export --to sglang`` turns the latest
  into a draft directory SGLang loads; ``training.resume_from`` resumes.
  ``stages.train.report_to`` is SpecForge's own ``tracking.report_to`` (TensorBoard:
  ``<out>/runs``; W&B offline unless the host has a key).
  The run is named for its settings (``<RUN_ID>-<hash>``): SpecForge refuses to
  resume a checkpoint written with other settings ("written with num_epochs=1 but
  this run has num_epochs=2"), so a changed setting starts a run of its own, and
  the job's log says which setting changed.
- **legacy** (older checkouts): ``torchrun ... <specforge_dir>/scripts/train_eagle3.py``
  with flags, offline with ``--train-hidden-states-path``, online without it;
  ``--resume``; checkpoints ``<out>/epoch_<E>_step_<S>/`` are already SGLang's layout.

Either way train's output is ``<output>/draft/``, a draft SGLang loads, whose
``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang's convention, see
`remote.eagle3.layer_ids`) equals the layers the states were captured with.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError, model_config, reporting
from remote.eagle3.train_settings import TrainSettings

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
    save_interval: int = 0  # optimizer steps between checkpoints (0: only at the end)
    prompts: Path | None = None  # online: prep's tokens as SpecForge's pre-tokenized JSONL
    vocab_mapping: Path | None = None  # online: {"d2t", "t2d"} built from those tokens
    mooncake: dict[str, Any] = field(default_factory=dict)  # online: SpecForge's mooncake_* endpoints
    data_identity: str = ""  # what the data is (records, paths or a hash): part of the run's name
    report_to: str = "none"  # SpecForge's tracking.report_to (`remote.eagle3.reporting.tracking_config`)
    #: stages.train.init_draft as aerie wrote it for SpecForge (`model.draft_checkpoint_path`), and where it came from.
    init_checkpoint: Path | None = None
    init_source: str = ""
    #: Offline: the held-out records' states, SpecForge's ``data.eval_hidden_states_path``, measured every
    #: `eval_interval` optimizer steps (an epoch's): SpecForge keeps its best checkpoint by them (`best_checkpoint`).
    eval_states: Path | None = None
    eval_interval: int = 0

    @property
    def is_online(self) -> bool:
        return self.hidden_states is None

    @property
    def runs(self) -> Path:
        """Where SpecForge writes its checkpoints (train's own output keeps `draft/` for the export)."""
        return self.output / "specforge"

    @property
    def run_id(self) -> str:
        """`RUN_ID-<hash of identity()>`: one name per set of settings SpecForge can resume."""
        digest = hashlib.sha256(json.dumps(identity(self), sort_keys=True).encode()).hexdigest()
        return f"{RUN_ID}-{digest[:10]}"

    @property
    def control_dir(self) -> Path:
        """The online run's control directory (refs, inboxes, the consumer's SQLite), one per run."""
        return self.runs / f"{self.run_id}.control"


def identity(run: SpecForgeRun) -> dict[str, Any]:
    """The settings a SpecForge checkpoint can only be resumed with (its trainer compares epochs,
    batch size, world size, the schedule's length, which follows the data, and the objective), and
    the others that make it a different run (learning rate, target, draft, layers)."""
    draft = run.draft_config.read_bytes() if run.draft_config.is_file() else b""
    return {"num_epochs": run.epochs, "batch_size": run.batch_size, "world_size": run.nproc,
            "ttt_length": run.ttt_steps, "max_length": run.max_length, "learning_rate": run.learning_rate,
            "target": str(run.target_model), "draft_config": hashlib.sha256(draft).hexdigest(),
            "layers": list(run.layers), "data": run.data_identity, **({"init_draft": run.init_source} if run.init_source else {})}


def specforge_dir(stage: dict[str, Any], env: dict[str, str] | None = None, init_draft: str | None = None) -> Path | None:
    """Where SpecForge is (``stages.train.specforge_dir``, else ``$SPECFORGE_DIR``; None: the installed one),
    refused in one line first when neither ``stages.train.draft_config`` nor `init_draft` (whose config.json
    shapes the draft) is set: SpecForge trains only a given draft.
    The other settings SpecForge reads are `remote.eagle3.train_settings.TrainSettings`'."""
    env = os.environ if env is None else env
    where = stage.get("specforge_dir") or env.get("SPECFORGE_DIR")
    if not stage.get("draft_config") and not init_draft:
        raise StageInputError("engine specforge needs stages.train.draft_config (e.g. SpecForge's configs/kimi-k25-eagle3.json) "
                              "or stages.train.init_draft")
    return Path(where).expanduser() if where else None


def missing_online_settings(settings: TrainSettings, stage: dict[str, Any]) -> list[str]:
    """The online route's settings SpecForge's launcher cannot do without and aerie cannot choose
    (`local.inventory.stages.Train.specforge_refusal` asks for them first; this is the host's defence);
    ``specforge_mooncake``, unset unless given, is read from the stage's config `stage`."""
    mooncake = stage.get("specforge_mooncake") or {}
    missing = [] if settings.specforge_server_urls else ["specforge_server_urls"]
    return missing + [f"specforge_mooncake.{key}" for key in ("metadata_server", "master_server_addr") if not mooncake.get(key)]


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
    """`specforge train --config`'s typed config (SpecForge's `Config` schema, checked by its own
    `load_config` in the tests)."""
    model = {
        "target_model_path": str(run.target_model), "draft_model_config": str(run.draft_config),
        "target_backend": "sglang", "aux_hidden_state_layer_ids": list(run.layers),
        "embedding_key": run.embedding_key, "lm_head_key": run.lm_head_key,
        "trust_remote_code": run.trust_remote_code, "torch_dtype": "bfloat16",
    }
    # NOTE: chat_template only names how raw conversations would be rendered; aerie never hands
    # SpecForge raw conversations (offline: states; online: prep's tokens), so it is SpecForge's default.
    data: dict[str, Any] = {"max_length": run.max_length, "cache_dir": str(run.output / "cache")}
    if run.is_online:
        data["prompts_path"] = str(run.prompts)
    else:
        data["hidden_states_path"] = str(run.hidden_states)
    if run.eval_states is not None:
        data["eval_hidden_states_path"] = str(run.eval_states)
    if run.vocab_mapping is not None:  # online: always; offline: the init draft's own map, kept
        model["vocab_mapping_path"] = str(run.vocab_mapping)
    training: dict[str, Any] = {
        "strategy": "eagle3", "num_epochs": run.epochs, "batch_size": run.batch_size,
        "learning_rate": run.learning_rate, "max_grad_norm": 0.5, "ttt_length": run.ttt_steps, "seed": 0,
        "save_interval": run.save_interval,
        # NOTE: the newest two: a checkpoint torn by a kill still leaves one to resume from.
        "max_checkpoints": 2,
    }
    if run.eval_states is not None:
        training["eval_interval"] = run.eval_interval
    latest = latest_checkpoint("current", run)
    if latest is not None:
        # NOTE: the checkpoint itself: given the root, SpecForge refuses one holding several runs' links.
        training["resume_from"] = str(latest)
    elif run.init_checkpoint is not None:  # SpecForge: a weights-only warm start, never beside resume_from
        model["draft_checkpoint_path"] = str(run.init_checkpoint)
    trainer = {"nnodes": 1, "nproc_per_node": run.nproc}
    if run.is_online:
        disaggregated = {"control_dir": str(run.control_dir), "backend": "mooncake", "server_urls": list(run.server_urls),
                         **{f"mooncake_{key}": value for key, value in run.mooncake.items() if value is not None}}
        deployment = _merge({"mode": "disaggregated", "trainer": trainer, "disaggregated": disaggregated}, run.deployment)
    else:
        deployment = _merge({"mode": "local_colocated", "trainer": trainer}, run.deployment)
    return {"model": model, "data": data, "training": training, "run_id": run.run_id,
            "output_dir": str(run.runs), "deployment": deployment,
            "tracking": reporting.tracking_config(run.report_to, run.output, run.run_id)}


def begin(run: SpecForgeRun) -> str | None:
    """Record this run's identity beside its checkpoints; when an earlier run of this job had other
    settings, the line that says which changed (this run then starts afresh under its own name)."""
    run.runs.mkdir(parents=True, exist_ok=True)
    resuming = latest_checkpoint("current", run) is not None
    if run.is_online and not resuming and run.control_dir.exists():
        shutil.rmtree(run.control_dir)  # a fresh attempt: SpecForge refuses a stale consumer database
    mine, record = identity(run), run.runs / f"{run.run_id}.json"
    earlier = sorted((p for p in run.runs.glob(f"{RUN_ID}-*.json") if p != record), key=lambda p: p.stat().st_mtime)
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(mine, indent=2, sort_keys=True))
    os.replace(tmp, record)
    if resuming or not earlier:
        return None
    try:
        before = json.loads(earlier[-1].read_text())
    except (OSError, ValueError):
        before = {}
    changed = [f"{key} {before.get(key)!r} -> {value!r}" for key, value in mine.items() if before.get(key) != value]
    return (f"settings changed since SpecForge run {earlier[-1].stem} ({', '.join(changed) or 'unknown'}): "
            f"training afresh as {run.run_id}; the earlier run's checkpoints stay in {run.runs}")


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
        link = run.runs / f"{run.run_id}-latest"
        if link.exists():
            return link.resolve()
        steps = sorted((p for p in run.runs.glob(f"{run.run_id}-step*") if p.is_dir()),
                       key=lambda p: int(p.name.rsplit("step", 1)[1] or 0))
        return steps[-1] if steps else None
    found = [(tuple(map(int, m.groups())), p) for p in run.runs.iterdir() if (m := LEGACY_CHECKPOINT.search(p.name))]
    return max(found)[1] if found else None


def best_checkpoint(run: SpecForgeRun) -> tuple[Path, int] | None:
    """SpecForge's best checkpoint by its own held-out evaluation (``<run_id>-best``, which its rotation
    never deletes) and its step; None when it measured none."""
    link, meta = run.runs / f"{run.run_id}-best", run.runs / f"{run.run_id}.best_meta.json"
    try:
        step = int(json.loads(meta.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (link.resolve(), step) if link.exists() else None


def export_command(prefix: list[str], run: SpecForgeRun, checkpoint: Path, out: Path) -> list[str]:
    return [*prefix, "export", "--to", "sglang", "--checkpoint", str(checkpoint),
            "--draft-config", str(run.draft_config), "--output-dir", str(out)]


def finish_draft(draft_dir: Path, layers: list[int]) -> dict[str, Any]:
    """Make the exported draft's config name the captured layers in SGLang's convention; refuse a
    draft trained for other layers (SGLang would capture the wrong states and accept nothing)."""
    path = draft_dir / "config.json"
    if not path.is_file() or not any(draft_dir.glob("*.safetensors")):
        raise StageInputError(f"SpecForge left no draft in {draft_dir} (config.json and *.safetensors expected)")
    config = model_config.read(draft_dir, "SpecForge's exported draft").raw
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
