"""The extract stage: the target's hidden states for every tokenised record.

Settings (``stages.extract`` in the inventory, passed in ``AERIE_CONFIG``; typed once by
`remote.eagle3.extract_settings`):

- ``layers``: auxiliary layer ids as the draft's config gives them to SGLang
  (``eagle_aux_hidden_state_layer_ids``); what each captures is what SGLang's
  model code for the target's architecture captures -- for Llama and Qwen the
  output of layer ``i`` (HF's ``hidden_states[i + 1]``), for DeepSeek-V3 and
  Kimi-K2.5 the input of layer ``i`` (``hidden_states[i]``) unless the first
  id is 1 (see `remote.eagle3.layer_ids`).
- ``engine``: ``hf`` (transformers in this process, `remote.eagle3.extractor`) or ``sglang``
  (SpecForge's offline capture in SGLang, tensor parallel under torchrun in the host's SpecForge
  environment: `remote.eagle3.sglang_engine`, with ``tp_size``, ``specforge_python``,
  ``specforge_env`` and ``sglang_args``). Both fill the same shards; the engine is part of the
  fingerprint.
- ``dtype``: the dtype the target runs and the states are stored in.
- ``batch_size``, ``shard_size``: records per forward pass and per shard.
- ``draft_config`` (or ``stages.train.draft_config`` when the control plane
  passes the stages along): the draft the states are for.

From the inventory's shared settings: ``target.model`` (relative to the
release directory) and ``target.trust_remote_code``.

Before any weights are loaded it refuses a prep output that did not finish,
layer ids the target does not have, and a feature width (``len(layers) x
hidden_size``) the draft cannot take. Output: the shard store of
`remote.eagle3.shards` in ``$AERIE_OUTPUT``, then ``manifest.json``. A restart
keeps the complete shards and redoes a torn one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote.eagle3 import StageInputError
from remote.eagle3 import draft_config
from remote.eagle3.extract_settings import ExtractSettings
from remote.eagle3.extractor import decoder_of, extract, load_target
from remote.eagle3 import layer_ids
from remote.eagle3.prep_input import read_manifest, read_records
from remote.eagle3.shards import ShardStore
from remote.eagle3 import target_memory
from remote.eagle3.model_config import ModelConfig
from remote.eagle3.target import TargetShape, best_device, read_target, shape_of, target_settings
from remote.vocabulary import layout
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.vocabulary.sizes import decimal
from remote import stages
from remote.stages import StageContext


@dataclass(frozen=True)
class ExtractPlan:
    """Everything checked before the first weight is read; the settings' own values are read from `settings`."""

    settings: ExtractSettings
    target: ModelConfig  # the target's config.json, read once here and passed down
    architecture: str
    inputs: list[int]  # the decoder layers whose inputs SGLang captures for `settings.layers`: HF hidden_states indices
    shape: TargetShape
    trust_remote_code: bool
    width: int
    prep: dict[str, Any]


def plan(ctx: StageContext) -> ExtractPlan:
    """Check the settings, the upstream prep output and the widths; no weights are read."""
    settings = ExtractSettings.from_config(ctx.stage_config)
    layers = settings.layers
    prep = read_manifest(ctx.inputs("prep")[0])
    path, trust = target_settings(ctx.shared_config)
    target = read_target(path)
    shape, arch = shape_of(target), target.architecture
    layer_ids.validate_layers(layers, shape.num_layers, arch)
    draft_path = draft_config.draft_config_path(ctx.stage_config, ctx.shared_config)
    draft = draft_config.load(draft_path) if draft_path else None
    source = f"draft config {draft_path}" if draft_path else "an EAGLE-3 draft (3 x hidden)"
    width = draft_config.check_width(layers, shape.hidden_size, draft, source)
    return ExtractPlan(settings=settings, target=target, architecture=arch, inputs=layer_ids.captured(layers, arch),
                       shape=shape, trust_remote_code=trust, width=width, prep=prep)


def run(ctx: StageContext, progress: Progress, model: Any = None) -> dict[str, Any]:
    """Extract every record of the prep input; `model` is a target already loaded (`load`), kept
    by the chunked route for all its chunks; None: the pipeline's extract session extracts with the target it
    keeps loaded for every dataset (`remote.orchestration.extract_session`), or, with none, it is loaded here."""
    if model is None:
        served = in_session(ctx, progress)
        if served is not None:
            return served
    checked = plan(ctx)
    store = ShardStore(ctx.output)
    ctx.output.mkdir(parents=True, exist_ok=True)
    fresh = store.use_plan(_fingerprint(checked), since=("prep_created",))
    if not fresh:
        progress.note("inputs changed since the last run: starting over")
    torn = store.remove_torn()
    if torn:
        progress.note(f"redoing torn shard(s) {', '.join(torn)}")
    own = model is None
    if own:
        model = load(checked, None, progress)  # sized before torch is imported: a refusal comes in seconds
    progress.note(f"extracting layers {checked.settings.layers}: the inputs of decoder layers {checked.inputs} "
                  f"(width {checked.width}, engine {checked.settings.engine})")
    if isinstance(checked.prep.get("kept"), int):
        progress.expect(checked.prep["kept"])  # prep's records: each is extracted or skipped
    started = time.time()
    try:
        counts = fill(checked, model, ctx.inputs("prep")[0], store, progress)
    finally:
        if own:
            close(model)
    manifest = {
        **_fingerprint(checked),
        "release": ctx.release,
        "records": counts["written"] + counts["resumed"],
        "skipped": counts["skipped"],
        "shards": counts["shards"],
        "hidden_size": checked.shape.hidden_size,
        "num_layers": checked.shape.num_layers,
        "vocab_size": checked.shape.vocab_size,
        "width": checked.width,
        "layer_convention": layer_ids.convention(checked.architecture),
        "format": "specforge-offline-ckpt",
        "seconds": round(time.time() - started, 3),
    }
    write_json_atomic(ctx.output / "manifest.json", manifest)
    progress.note(f"{manifest['records']} records in {counts['shards']} shard(s), {counts['resumed']} resumed")
    return manifest


def in_session(ctx: StageContext, progress: Progress) -> dict[str, Any] | None:
    """The manifest of this extraction made by the pipeline's extract session with the target it keeps loaded
    (`remote.orchestration.extract_session`: this stage's context out, its Progress calls and then its manifest
    back, a JSON line each); None where no session answers (none started, or one that has ended)."""
    import socket

    record = read_json(layout.extract_session(ctx.root))
    if not isinstance(record, dict) or not record.get("address"):
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect("\0" + record["address"])
    except OSError:
        client.close()
        return None
    progress.note(f"extracting in the pipeline's extract session (pid {record.get('pid')}): the target is loaded once")
    fields = {"root": str(ctx.root), "release": ctx.release, "dataset": ctx.dataset, "stage": ctx.stage,
              "source": ctx.source, "kind": ctx.kind, "output": str(ctx.output), "data": str(ctx.data), "config": ctx.config}
    with client, client.makefile("rwb") as stream:
        stream.write((json.dumps(fields) + "\n").encode())
        stream.flush()
        for line in stream:
            message = json.loads(line)
            if "call" in message:
                getattr(progress, message["call"])(*message["args"], **message["kwargs"])
            elif "done" in message:
                return message["done"]
            elif "refusal" in message:
                raise StageInputError(message["refusal"])
            else:
                raise SystemExit(f"extract: the extract session failed: {message.get('error')}; see `inv logs pipeline --stage run`")
    raise SystemExit("extract: the extract session ended before this extraction did; see `inv logs pipeline --stage run`")


def load(checked: ExtractPlan, device: str | None, progress: Progress) -> Any:
    """The target `checked` names, loaded by its engine: the SGLang capture's workers over the host's GPUs
    (sglang), or a transformers model on `device` (hf; None: the best there is) once its headers show it
    fits there (`remote.eagle3.target_memory`: else one line naming the engine that does; the GPUs are
    nvidia-smi's that the process may use). For Kimi-K2.5, ~600 GB of weights read."""
    if checked.settings.engine == "sglang":
        from remote.eagle3 import sglang_engine

        return sglang_engine.start(checked, progress)
    gpus = target_memory.nvidia_smi_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    sizes = target_memory.require(checked.shape.path, checked.settings.dtype, "hf", gpus, target_memory.host_memory())["hf"]
    device = device or best_device()
    progress.note(f"loading {checked.shape.path.name} on {device}: {decimal(sizes['need_bytes'])} in "
                  f"{sizes['in']}; {target_memory.holds(sizes)}")
    return load_target(checked.shape.path, checked.settings.dtype, checked.trust_remote_code, device, checked.target)


def fill(checked: ExtractPlan, model: Any, prep: Path, store: ShardStore, progress: Progress) -> dict[str, int]:
    """Every incomplete shard of `store` filled by the engine's `model` (what `load` returned)."""
    if checked.settings.engine == "sglang":
        return model.fill(prep, store.root, progress)
    return extract(decoder_of(model), read_records(prep), store, checked.inputs, checked.settings.shard_size,
                   checked.settings.batch_size, best_device(), progress)


def close(model: Any, abort: bool = False) -> None:
    """Let go of what `load` returned: the SGLang workers end (`abort`: now, even mid-request); a transformers
    model is left to the collector."""
    getattr(model, "abort" if abort else "close", lambda: None)()


def _fingerprint(checked: ExtractPlan) -> dict[str, Any]:
    """What the shards depend on: a change to any of these makes old shards stale."""
    return {
        "prep_release": checked.prep.get("release"),
        "prep_kept": checked.prep.get("kept"),
        # NOTE: prep run again on the same release writes other records under the same count: infer's new answers
        # after a fix to stages.infer, or prep's own settings edited.
        "prep_created": checked.prep.get("created_at"),
        "layers": checked.settings.layers,
        # NOTE: what the ids capture, not only the ids: shards an older aerie stored for the same ids
        # (always HF hidden_states[i + 1]) hold other layers' states for a DeepSeek/Kimi target.
        "hidden_states": checked.inputs,
        "architecture": checked.architecture,
        "dtype": checked.settings.dtype,
        "shard_size": checked.settings.shard_size,
        "target": str(checked.shape.path),
        "engine": checked.settings.engine,
    }


def main() -> None:
    stages.main("extract", run, (StageInputError,))


if __name__ == "__main__":
    main()
