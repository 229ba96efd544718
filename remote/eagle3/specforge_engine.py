"""SpecForge's engine of the train stage (``stages.train.engine: specforge``): run the host's SpecForge
(`remote.eagle3.specforge` builds its config and command; `remote.eagle3.specforge_inputs` writes what it reads),
then export its checkpoints into drafts SGLang loads.

Offline (SpecForge 0.2.0), the best epoch is kept as aerie's engine keeps it: SpecForge trains on the training
share of the records only and evaluates its draft on the held-out ones after every epoch
(``data.eval_hidden_states_path``, ``training.eval_interval``), keeping its best checkpoint by that evaluation;
aerie then measures the candidates on disk with its own evaluation (`remote.eagle3.heldout`, the figure aerie's
engine reports) -- ``stages.train.init_draft`` as epoch 0, SpecForge's best epoch, the last epoch -- and writes
the best to ``draft/`` (the later of equals) and the last to ``last/`` (`remote.eagle3.kept`). The epochs
SpecForge neither kept as its best nor ended with are gone from its disk (it keeps two checkpoints), so they
are not measured. Online and legacy, nothing is held out: ``draft/`` is the last epoch's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from remote.control_plane.progress import Progress, count_lines, write_json_atomic
from remote.eagle3 import StageInputError, distributed, draft_config, init_draft, kept, specforge, specforge_inputs
from remote.eagle3.extract_manifest import ExtractManifest
from remote.eagle3.target import read_shape, target_settings
from remote.eagle3.train_settings import TrainSettings


def run(ctx: Any, settings: TrainSettings, extracted: ExtractManifest | None, progress: Progress) -> dict[str, Any]:
    """Train with the host's SpecForge (offline from extract's states, or online when `extracted` is
    None), then export the kept draft to ``$AERIE_OUTPUT/draft`` (and the last to ``last/``)."""
    where = specforge.specforge_dir(ctx.stage_config, init_draft=settings.init_draft)
    generation, prefix = specforge.detect(where)
    if settings.init_draft and generation != "current":
        raise StageInputError("stages.train.init_draft: the legacy SpecForge script has no warm start; "
                              "install SpecForge 0.2.0 (model.draft_checkpoint_path) or use engine: aerie")
    if extracted is not None:
        verify_states(ctx, progress)
    job, heldout_files = _job(ctx, settings, extracted, generation, where, progress)
    env = specforge.environment(where)
    if generation == "current":
        changed = specforge.begin(job)
        if changed:
            progress.note(changed)
        specforge.write_config(job)
    argv = specforge.command(job, generation, prefix)
    mode = "online" if job.is_online else "offline"
    progress.note(f"running SpecForge ({generation} CLI, {mode}): " + " ".join(argv[:6]) + " ...")
    _call(argv, env, "trainer", progress)
    latest = specforge.latest_checkpoint(generation, job)
    if latest is None:
        raise StageInputError(f"SpecForge finished but wrote no checkpoint under {job.runs}")
    exporter = _Exporter(ctx.output, job, generation, prefix, env, progress)
    figures = _keep(ctx, settings, job, exporter, latest, heldout_files, progress)
    progress.written((extracted.records if extracted else 0) or count_lines(job.prompts or job.train_data))
    manifest = {"release": ctx.release, "engine": "specforge", "specforge": generation, "mode": mode, "command": argv,
                "run_id": job.run_id if generation == "current" else None, "checkpoint": str(latest),
                "draft": str(ctx.output / kept.DRAFT), "layers": job.layers, "init_draft": settings.init_draft,
                "eagle_aux_hidden_state_layer_ids": job.layers, **figures}
    write_json_atomic(ctx.output / "manifest.json", manifest)
    return manifest


def verify_states(ctx: Any, progress: Progress) -> None:
    """Every state SpecForge will read, checked first: its own processes read the files, out of reach of
    the check `load_sample` makes (a bad file fails here in one line, marked for extract again)."""
    from remote.eagle3 import shards

    for directory in ctx.inputs("extract"):
        progress.note(f"verifying the states in {directory}")
        shards.verify(directory, progress.beat)


class _Exporter:
    """SpecForge's checkpoints as drafts SGLang loads, each written under a run-unique name first."""

    def __init__(self, output: Path, job: specforge.SpecForgeRun, generation: str, prefix: list[str],
                 env: dict[str, str], progress: Progress) -> None:
        self.output, self.job, self.generation, self.prefix, self.env, self.progress = \
            output, job, generation, prefix, env, progress

    def export(self, checkpoint: Path, name: str) -> Path:
        tmp = self.output / f".{name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        if self.generation == "current":
            self.progress.note(f"exporting {checkpoint.name} to SGLang's layout")
            _call(specforge.export_command(self.prefix, self.job, checkpoint, tmp), self.env, "export", self.progress)
        else:  # the legacy trainer saves SGLang's layout itself
            shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns("training_state*.pt"))
        specforge.finish_draft(tmp, self.job.layers)
        return tmp


def _keep(ctx: Any, settings: TrainSettings, job: specforge.SpecForgeRun, exporter: _Exporter, latest: Path,
          heldout_files: list[Path], progress: Progress) -> dict[str, Any]:
    """``draft/`` and ``last/`` from SpecForge's checkpoints; the manifest's figures of the kept draft."""
    from remote.eagle3 import checkpoint

    last = exporter.export(latest, kept.LAST)
    if job.eval_states is None or not heldout_files:
        checkpoint.promote(last, ctx.output / kept.DRAFT)
        return {"kept_reason": "kept the last epoch's draft: no held-out records to choose by"}
    candidates = {settings.epochs: last}
    best = specforge.best_checkpoint(job)
    if best is not None and best[0] != latest.resolve():
        candidates[-(-best[1] // max(job.eval_interval, 1))] = exporter.export(best[0], kept.DRAFT)
    if settings.init_draft:
        candidates[0] = ctx.output / specforge_inputs.INIT_DRAFT
    evaluation = _measured(ctx, settings, candidates, heldout_files, progress)
    chosen = evaluation.kept_epoch()
    shutil.copytree(candidates[chosen.epoch], ctx.output / f".{kept.DRAFT}.{os.getpid()}.kept")
    checkpoint.promote(ctx.output / f".{kept.DRAFT}.{os.getpid()}.kept", ctx.output / kept.DRAFT)
    checkpoint.promote(last, ctx.output / kept.LAST)
    for epoch, path in candidates.items():
        if path.name.endswith(".tmp"):
            shutil.rmtree(path, ignore_errors=True)
    evaluation.draw()
    progress.metrics(**chosen.metrics())
    figures = evaluation.manifest()
    progress.note(figures["kept_reason"])
    return {**figures, "specforge_best_step": best[1] if best else None}


def _measured(ctx: Any, settings: TrainSettings, candidates: dict[int, Path], heldout_files: list[Path],
              progress: Progress) -> Any:
    """Each candidate draft ({epoch: directory}) measured on the held-out records by aerie's own evaluation."""
    from remote.eagle3 import checkpoint, heldout, plot
    from remote.eagle3.shards import load_sample
    from remote.eagle3.target import best_device, read_embed_and_head

    shape = read_shape(target_settings(ctx.shared_config)[0])
    embed, head = read_embed_and_head(shape)
    device = best_device()
    head = head.to(device)
    evaluation = heldout.EpochEvaluation(heldout_files, load_sample, settings.eval_steps, settings.max_length,
                                         ctx.output / plot.PLOT_NAME, progress)
    for epoch in sorted(candidates):
        draft = checkpoint.load(candidates[epoch], embed).to(device)
        if epoch == 0:
            evaluation.before_training(draft, head)
        else:
            evaluation.on_epoch(epoch, draft, head)
    return evaluation


def _job(ctx: Any, settings: TrainSettings, extracted: ExtractManifest | None, generation: str,
         where: Path | None, progress: Progress) -> tuple[specforge.SpecForgeRun, list[Path]]:
    """What SpecForge is run with, its inputs written and checked first (one line for each refusal); the
    held-out records' files (none online, none for the legacy script)."""
    path, trust = target_settings(ctx.shared_config)
    shape = read_shape(path)
    layers = list(extracted.layers) if extracted else _online_layers(ctx)
    if extracted and generation == "current" and extracted.dtype not in (None, "bfloat16"):
        raise StageInputError(f"engine specforge trains on bfloat16 states (its target head is bfloat16) but extract stored "
                              f"{extracted.dtype}: set stages.extract.dtype: bfloat16 and rerun extract")
    config = _draft_config(ctx, settings, shape, layers)
    finalized = ctx.output / "draft-config.json"
    write_json_atomic(finalized, config)
    nproc = distributed.resolve_nproc(settings.nproc)
    data = _data(ctx, settings, generation, shape, config) if extracted is None else \
        _states(ctx, settings, generation, nproc)
    warm = None
    if settings.init_draft:
        warm, data["vocab_mapping"] = specforge_inputs.warm_start(ctx, settings, config, shape, data.get("vocab_mapping"),
                                                                  progress)
    heldout_files = data.pop("heldout_files", [])
    job = specforge.SpecForgeRun(
        specforge_dir=where, target_model=path, draft_config=finalized,
        train_data=specforge_inputs.conversations(ctx) if generation == "legacy" else None,
        output=ctx.output, epochs=settings.epochs, batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, max_length=settings.max_length, chat_template=settings.chat_template,
        ttt_steps=settings.ttt_steps, nproc=nproc, layers=layers,
        embedding_key=weight_name(path, "embed_tokens.weight") or "model.embed_tokens.weight",
        lm_head_key=weight_name(path, "lm_head.weight") or "lm_head.weight", trust_remote_code=trust,
        server_urls=settings.specforge_server_urls, deployment=settings.specforge_deployment,
        save_interval=settings.checkpoint_every, mooncake=dict(ctx.stage_config.get("specforge_mooncake") or {}),
        report_to=settings.report_to, init_checkpoint=warm, init_source=settings.init_draft or "", **data)
    return job, heldout_files


def _states(ctx: Any, settings: TrainSettings, generation: str, nproc: int) -> dict[str, Any]:
    """Offline: the training share SpecForge trains on and, for SpecForge 0.2.0, the held-out records it
    evaluates on after every epoch (an epoch's optimizer steps apart)."""
    states, held, trained, heldout_files = specforge_inputs.split_states(ctx.inputs("extract"), ctx.output, settings)
    identity = (f"{trained} records ({len(heldout_files)} held out) in {', '.join(map(str, ctx.inputs('extract')))}, "
                f"states {specforge_inputs.contents(ctx.inputs('extract'))}")
    # NOTE: SpecForge drops each rank's last short batch: an epoch is this many optimizer steps.
    per_epoch = -(-trained // nproc) // settings.batch_size
    if held is None or not per_epoch or generation != "current":
        return {"hidden_states": states, "data_identity": identity}
    return {"hidden_states": states, "data_identity": identity, "eval_states": held, "eval_interval": per_epoch,
            "heldout_files": heldout_files}


def _data(ctx: Any, settings: TrainSettings, generation: str, shape: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Online: prep's exact tokens and their vocabulary map (SpecForge 0.2.0; the legacy script reads the conversations)."""
    if generation != "current":
        return {"hidden_states": None}
    _require_online(settings, ctx.stage_config)
    prep_dirs = [Path(p) for p in (ctx.config.get("prep_inputs") or {}).values()] or [ctx.upstream("prep")]
    prompts, mapping, identity = specforge_inputs.write_online_inputs(prep_dirs, ctx.output, shape.vocab_size,
                                                                     config["draft_vocab_size"])
    return {"hidden_states": None, "prompts": prompts, "vocab_mapping": mapping, "data_identity": identity}


def _draft_config(ctx: Any, settings: TrainSettings, shape: Any, layers: list[int]) -> dict[str, Any]:
    """The draft SpecForge trains, naming the captured layers (so its export does too)."""
    draft_vocab = min(settings.draft_vocab_size, shape.vocab_size)
    ctx.output.mkdir(parents=True, exist_ok=True)
    if settings.init_draft:  # its own config.json shapes the draft, checked against the target and the settings
        return init_draft.config_for(settings.init_draft, shape.hidden_size, shape.vocab_size, layers, draft_vocab)
    draft_path = draft_config.draft_config_path(ctx.stage_config, ctx.shared_config)
    draft = draft_config.load(draft_path)
    draft_config.check_width(layers, shape.hidden_size, draft, f"draft config {draft_path}")
    return draft_config.finalize(draft, layers, shape.vocab_size, draft_vocab)


def _online_layers(ctx: Any) -> list[int]:
    """The layers SGLang captures on the online route, where no extract ran: ``stages.extract``'s, which the job's
    spec carries beside train's own settings (``config.extract``), typed as extract types them."""
    from remote.eagle3.extract_settings import ExtractSettings

    if not isinstance(ctx.config.get("extract"), dict):
        raise StageInputError("engine specforge online: the job's spec has no stages.extract settings (the layers to "
                              "capture); launch it again from an up-to-date checkout")
    return list(ExtractSettings.from_config(ctx.config["extract"]).layers)


def _require_online(settings: TrainSettings, stage: dict[str, Any]) -> None:
    """The online route's settings SpecForge cannot run without (the inventory checks them first)."""
    missing = specforge.missing_online_settings(settings, stage)
    if missing:
        raise StageInputError(f"engine specforge on the online route needs stages.train.{', stages.train.'.join(missing)}")


def _call(argv: list[str], env: dict[str, str], what: str, progress: Progress) -> None:
    process = subprocess.Popen(argv, env=env)
    while process.poll() is None:
        progress.beat()
        time.sleep(1.0)
    if process.returncode != 0:
        raise SystemExit(f"train: SpecForge's {what} exited with {process.returncode}; see the log above")


def weight_name(path: Path, suffix: str) -> str | None:
    """The target's full tensor name ending in `suffix` (Kimi-K2.5: ``language_model.model.embed_tokens.weight``)."""
    from remote.eagle3.target import _weight_files

    try:
        names = [n for names in _weight_files(path).values() for n in names]
    except StageInputError:
        return None
    return next((n for n in names if n.endswith(suffix) and "vision" not in n), None)


