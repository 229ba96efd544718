"""The train stage: an EAGLE-3 draft from the extract stage's hidden states.

Settings (``stages.train``, typed once by `remote.eagle3.train_settings`):

- ``engine``: ``aerie`` (this module, plain torch) or ``specforge``
  (`remote.eagle3.specforge` builds SpecForge's command instead).
- ``draft_vocab_size``: the reduced vocabulary (the most frequent trained
  tokens; capped at the target's vocabulary).
- ``epochs``, ``learning_rate``, ``batch_size``, ``ttt_steps``: the training.
- ``draft_config``: a draft ``config.json`` to train (e.g. SpecForge's
  ``kimi-k25-eagle3.json``); without one the draft is shaped after the target.
- ``max_length``: tokens per record used in training.
- ``eval_records`` (a count; 0: none; unset: ``eval_fraction`` of them):
  records held out of training; after every epoch the draft is measured on
  them (`remote.eagle3.acceptance`): per-step accuracy and the expected
  acceptance length of an ``eval_steps``-long chain with top-k 1.
- ``nproc``: training processes (`remote.eagle3.distributed`; unset: every visible GPU): aerie's
  engine launches that many ranks of this stage under torchrun (DDP, ``batch_size`` records per
  rank a step); SpecForge's gets it as its world size.
- ``warmup_fraction``: with ``init_draft``, the share of the steps the learning rate rises over.
- ``checkpoint_every``: optimizer steps between resume checkpoints (one is
  also written at the end of every epoch); SpecForge's ``training.save_interval``.
- ``report_to``: ``none``, ``tensorboard`` or ``wandb``: every step's loss and
  accuracies and every epoch's held-out figures, also as TensorBoard event files
  in ``$AERIE_OUTPUT/tensorboard/`` or a W&B run in ``$AERIE_OUTPUT/wandb/``
  (`remote.eagle3.reporting`); SpecForge's engine gets it as its own
  ``tracking.report_to``.
- ``schedule_steps`` (not a user setting: `remote.orchestration.chunked` sets it): the
  learning-rate schedule's length when this run is one chunk of a longer one.
- ``chunk_pass`` (not a user setting either): which pass and chunk this run
  is; part of the resume fingerprint, so a pass run again after it finished
  trains nothing, and the next pass over the same chunk is new data.

Resuming: ``$AERIE_OUTPUT/resume/state.pt`` (`remote.eagle3.resume`) holds
the draft, the optimizer and schedule, and the epoch, batch position and step.
A rerun of the job over the same samples and settings goes on from there; over
other samples (the chunked route's next chunk) it keeps the draft and the
optimizer and starts that data's epochs from the beginning.

From the shared settings: ``target.model``
(the embeddings and the lm_head are read from its safetensors files).

Input: ``$AERIE_DATA/extract`` with its ``manifest.json``; refused when
missing (extract did not succeed) or when its width does not fit the draft.
Output: ``$AERIE_OUTPUT/draft/`` (SGLang's ``--speculative-draft-model-path``), the
best epoch's draft by held-out accept length, and ``last/``, the last epoch's
(`remote.eagle3.kept`), each rewritten atomically; ``$AERIE_OUTPUT/training.png``
beside them (loss, held-out accuracy and acceptance length per epoch), and
``$AERIE_OUTPUT/manifest.json`` (the kept draft's ``accept_length`` and interval,
``kept_epoch`` and ``kept_reason``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from remote.eagle3 import StageInputError, read_upstream_manifest
from remote.eagle3 import draft_config
from remote.eagle3 import distributed, heldout, init_draft, kept, plot, reporting, specforge
from remote.eagle3.shards import ShardStore, load_sample
from remote.eagle3.target import best_device, read_config, read_embed_and_head, read_shape, target_settings
from remote.eagle3.train_settings import TrainSettings
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote import stages
from remote.stages import StageContext


def read_extract_manifest(extract_dir: Path) -> dict[str, Any]:
    """The extract stage's manifest, refused when extract did not finish or predates its fields
    (without `hidden_states`, its states were kept under the ids' old meaning: one layer off on a Kimi target)."""
    return read_upstream_manifest(extract_dir, "extract", ("release", "layers", "hidden_states", "hidden_size", "width"))


def read_extract_manifests(directories: list[Path]) -> dict[str, Any]:
    """One manifest standing for all inputs (the draft trains on every dataset's states),
    refused when they were extracted with different layers or from a different target width."""
    manifests = [read_extract_manifest(d) for d in directories]
    first = manifests[0]
    for directory, manifest in zip(directories[1:], manifests[1:]):
        for key in ("layers", "hidden_states", "hidden_size", "width"):
            if manifest[key] != first[key]:
                raise StageInputError(
                    f"{directory}: extracted with {key} {manifest[key]}, but {directories[0]} with {first[key]}: "
                    "rerun extract for all datasets with the same settings")
    return {**first, "records": sum(int(m.get("records", 0)) for m in manifests)}


def draft_for(ctx: StageContext, settings: TrainSettings, extracted: dict[str, Any], vocab_size: int,
              target_config: dict[str, Any]) -> dict[str, Any]:
    """The draft's config, checked against the width the extraction wrote."""
    layers = list(extracted["layers"])
    draft_vocab = min(settings.draft_vocab_size, vocab_size)
    path = draft_config.draft_config_path(ctx.stage_config, ctx.shared_config)
    if settings.init_draft:
        if path is not None:
            raise StageInputError(f"stages.train.init_draft and stages.train.draft_config are both set: the draft "
                                  f"{settings.init_draft} is shaped by its own config.json; unset draft_config")
        config = init_draft.config_for(settings.init_draft, int(target_config["hidden_size"]), vocab_size, layers, draft_vocab)
        source = f"stages.train.init_draft {settings.init_draft}"
    elif path is None:
        config = draft_config.build(target_config, layers, draft_vocab)
        source = "the draft config built from the target"
    else:
        config = draft_config.finalize(draft_config.load(path), layers, vocab_size, draft_vocab)
        source = f"draft config {path}"
    if draft_config.expected_width(config) != int(extracted["width"]):
        raise StageInputError(
            f"feature width mismatch: the extracted states are {extracted['width']} wide "
            f"(layers {layers} x hidden {extracted['hidden_size']}) but {source} expects {draft_config.expected_width(config)}; "
            "rerun extract with the draft's layers or fix the draft config"
        )
    draft_config.check_width(layers, int(extracted["hidden_size"]), config, source)
    return config


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """Train the draft with the engine ``stages.train.engine`` names, on extract's states
    (or, SpecForge's online route, on prep's prompts with no states on disk)."""
    settings = TrainSettings.from_config(ctx.stage_config)
    reporting.require(settings.report_to)
    if settings.engine == "specforge" and ctx.config.get("prep_inputs") and not ctx.config.get("inputs"):
        return run_specforge(ctx, settings, None, progress)  # the online route: no states on disk
    extracted = read_extract_manifests(ctx.inputs("extract"))
    if settings.engine == "specforge":
        _verify_for_specforge(ctx, progress)
        return run_specforge(ctx, settings, extracted, progress)
    return run_aerie(ctx, settings, extracted, progress)


def run_aerie(ctx: StageContext, settings: TrainSettings, extracted: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Train with this project's plain-torch trainer (`remote.eagle3.trainer`), in one process or as one rank
    of several (`remote.eagle3.distributed`): the draft measured on the held-out records after every epoch,
    the best kept in ``draft/`` and the last in ``last/`` (`remote.eagle3.kept`), resumable from
    ``$AERIE_OUTPUT/resume``. Rank 0 alone writes; the other ranks train and return nothing."""
    shape, config, files = _aerie_inputs(ctx, settings, extracted)

    # NOTE: torch is imported only once the inputs are known good, so a refusal is instant.
    from remote.eagle3.trainer import train

    world = distributed.World.from_env()
    device = distributed.start(world)
    if not world.is_main:
        progress = Progress()  # counts nowhere: rank 0 says how the job goes
    files, heldout_files = heldout.split(files, settings.eval_records, settings.eval_fraction)
    # NOTE: only rank 0 counts tokens for a new draft's vocabulary: DDP copies its weights and maps to the others.
    counts = _counter(files, len(heldout_files), shape.vocab_size, progress) if world.is_main else distributed.no_counts(shape.vocab_size)
    draft, head = start_draft(settings, config, shape, counts, progress)
    head = head.to(device)
    epochs, per_step = settings.epochs, settings.batch_size * world.size
    state = _resume_state(ctx, draft, files, settings, progress, world.size)
    draft.to(device)
    evaluation = _evaluation(ctx, settings, draft, head, extracted, heldout_files, state, progress) if world.is_main else None
    schedule_steps = int(ctx.stage_config.get("schedule_steps") or 0)  # NOTE: .get: only the chunked driver sends it
    total_steps = schedule_steps or epochs * -(-len(files) // per_step)
    progress.expect(epochs * -(-len(files) // per_step), by="step")
    earlier = _previous_history(ctx, state.step) if world.is_main else []
    history: list[dict[str, Any]] = []
    callbacks = {"on_step": lambda *a: None, "on_epoch": lambda e: None, "on_checkpoint": None}
    observer = None
    if world.is_main:
        observer = reporting.Observer(_reporter(ctx, settings, state.step), evaluation, state.step)
        callbacks = observer.wrap(_aerie_callbacks(ctx, draft, head, extracted, evaluation, epochs, earlier, history, progress))

    started = time.time()
    train(
        draft, head, files, load_sample, epochs=epochs, batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, steps=settings.ttt_steps, max_length=settings.max_length,
        state=state, checkpoint_every=settings.checkpoint_every, schedule_steps=schedule_steps,
        warmup_steps=settings.warmup_steps(total_steps), world=world, **callbacks,
    )
    distributed.stop(world)
    if not world.is_main:
        return {}
    observer.close()
    return _finish(ctx, settings, draft, extracted, config, len(files), evaluation, earlier, history, state.step,
                   time.time() - started, world.size, progress)


def _evaluation(ctx: StageContext, settings: TrainSettings, draft: Any, head: Any, extracted: dict[str, Any],
                heldout_files: list[Path], state: Any, progress: Progress) -> heldout.EpochEvaluation:
    """Rank 0's held-out measurement; before a new run trains, epoch 0 (the draft as it starts) measured and kept."""
    evaluation = heldout.EpochEvaluation(heldout_files, load_sample, settings.eval_steps, settings.max_length,
                                         ctx.output / plot.PLOT_NAME, progress)
    # NOTE: the epochs before the one this run goes on from were measured by earlier runs: the manifest
    # still reports them (a run resumed after its last step measures nothing, yet had an accept length).
    evaluation.restore(through=state.epoch)
    if state.step == 0 and evaluation.before_training(draft, head) is not None:
        _save_draft(ctx, draft, extracted, 0, kept.START)  # kept unless an epoch measures at least as well (`remote.eagle3.kept`)
    return evaluation


def _settle_start(ctx: StageContext, evaluation: heldout.EpochEvaluation) -> None:
    """Epoch 0's draft put in ``draft/`` while it is the one kept, or dropped once an epoch beats it (for good:
    the best only rises)."""
    from remote.eagle3 import checkpoint

    start, chosen = ctx.output / kept.START, evaluation.kept_epoch()
    if not start.is_dir():
        return
    if chosen is not None and chosen.epoch == 0:
        checkpoint.promote(start, ctx.output / kept.DRAFT)
    else:
        shutil.rmtree(start, ignore_errors=True)


def _finish(ctx: StageContext, settings: TrainSettings, draft: Any, extracted: dict[str, Any], config: dict[str, Any],
            records: int, evaluation: heldout.EpochEvaluation, earlier: list[dict[str, Any]], history: list[dict[str, Any]],
            step: int, seconds: float, nproc: int, progress: Progress) -> dict[str, Any]:
    """Rank 0's end of a run: the plot, the drafts a run resumed after its last step left, the manifest."""
    epochs = settings.epochs
    evaluation.draw()
    _settle_start(ctx, evaluation)
    if not history:  # resumed after the last step: the saved drafts are the result
        if not (ctx.output / kept.LAST).is_dir():
            _save_draft(ctx, draft, extracted, epochs, kept.LAST)
        if not (ctx.output / kept.DRAFT).is_dir():
            _save_draft(ctx, draft, extracted, epochs, kept.DRAFT)
    history = earlier + history
    manifest = _aerie_manifest(ctx, extracted, config, records, epochs, history, step, seconds)
    manifest.update(evaluation.manifest(), init_draft=settings.init_draft, nproc=nproc,
                    batch_size=settings.batch_size, global_batch=settings.batch_size * nproc)
    chosen = evaluation.kept_epoch()
    if chosen is not None:  # what `inv status` shows: the kept draft's figures, not the last epoch's
        progress.metrics(**chosen.metrics())
    if history[len(earlier):]:  # trained in this run (else its line says the saved draft stands)
        progress.note(manifest["kept_reason"])
    write_json_atomic(ctx.output / "manifest.json", manifest)
    write_json_atomic(ctx.output / "history.json", history)
    return manifest


def _verify_for_specforge(ctx: StageContext, progress: Progress) -> None:
    """Every state SpecForge will read, checked first: its own processes read the files, out of reach of
    the check `load_sample` makes (a bad file fails here in one line, marked for extract again)."""
    from remote.eagle3 import shards

    for directory in ctx.inputs("extract"):
        progress.note(f"verifying the states in {directory}")
        shards.verify(directory, progress.beat)


def _reporter(ctx: StageContext, settings: TrainSettings, step: int) -> reporting.Reporter:
    """Where ``stages.train.report_to`` sends the curves, beside the draft; the run named for the dataset."""
    import dataclasses

    return reporting.open_reporter(settings.report_to, ctx.output, step, f"{ctx.dataset}-{ctx.release}",
                                   dataclasses.asdict(settings))


def _aerie_manifest(ctx: StageContext, extracted: dict[str, Any], config: dict[str, Any], records: int, epochs: int,
                    history: list[dict[str, Any]], resumed_from: int, seconds: float) -> dict[str, Any]:
    """What the aerie engine's run trained (the held-out measures are added by the caller)."""
    return {
        "release": ctx.release,
        "engine": "aerie",
        "draft": str(ctx.output / "draft"),
        "records": records,
        "epochs": epochs,
        "steps": len(history),
        "resumed_from_step": resumed_from,
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
        "draft_vocab_size": config["draft_vocab_size"],
        "layers": extracted["layers"],
        "seconds": round(seconds, 3),
    }


def _aerie_inputs(ctx: StageContext, settings: TrainSettings, extracted: dict[str, Any]):
    """The target's shape, the draft's config and every extracted sample file, refused (one line each)
    when the target changed since extract ran or extract wrote no records."""
    extract_dirs = ctx.inputs("extract")
    path, _ = target_settings(ctx.shared_config)
    shape = read_shape(path)
    if shape.hidden_size != int(extracted["hidden_size"]):
        raise StageInputError(
            f"target.model {path} has hidden size {shape.hidden_size} but the extracted states have {extracted['hidden_size']}: "
            "the target changed since extract ran; rerun extract"
        )
    config = draft_for(ctx, settings, extracted, shape.vocab_size, read_config(path))
    files = [f for directory in extract_dirs for f in ShardStore(directory).sample_files()]
    if not files:
        raise StageInputError(f"no extracted samples in {', '.join(map(str, extract_dirs))}: extract wrote no records; check its skip reasons")
    return shape, config, files


def start_draft(settings: TrainSettings, config: dict[str, Any], shape, counts: Callable[[], Any], progress: Progress):
    """The draft training starts from, and the target's lm_head (on the CPU): ``stages.train.init_draft``'s
    weights and vocabulary map when it is set, else a new draft started from the target's embeddings and lm_head.
    `counts` (how often each token is trained on) picks the vocabulary of a new draft, or cuts a full one."""
    from remote.eagle3.model import Eagle3Draft
    from remote.eagle3.vocab import build_mapping

    def mapping():
        return build_mapping(counts(), config["draft_vocab_size"])

    embed, head = read_embed_and_head(shape)
    if not settings.init_draft:
        return Eagle3Draft.warm(config, *mapping(), embed, head), head
    draft = init_draft.start(settings.init_draft, config, embed, mapping)
    progress.note(f"continuing from the draft {settings.init_draft} (draft vocabulary {config['draft_vocab_size']})")
    return draft, head


def _counter(files: list[Path], heldout_count: int, vocab_size: int, progress: Progress) -> Callable[[], Any]:
    """How often each token is trained on in `files`, counted when asked (a draft with its own map never asks)."""
    from remote.eagle3.vocab import token_counts

    def counts():
        progress.note(f"counting tokens of {len(files)} records ({heldout_count} held out)")
        return token_counts(_each(files, progress), vocab_size)

    return counts


def _aerie_callbacks(ctx: StageContext, draft, head, extracted: dict[str, Any], evaluation: heldout.EpochEvaluation,
                     epochs: int, earlier: list[dict[str, Any]], history: list[dict[str, Any]], progress: Progress) -> dict[str, Any]:
    """The trainer's ``on_step``, ``on_epoch`` and ``on_checkpoint``: each step's metrics reported and kept in
    `history`, the draft measured and saved after every epoch, the resume state written at every checkpoint."""
    from remote.eagle3 import resume
    from remote.eagle3.resume import TrainState

    def on_step(step: int, loss: float, accuracies: list[float], records: int) -> None:
        values = {f"acc_{k}": round(a, 4) for k, a in enumerate(accuracies)}
        progress.metrics(step=step, loss=round(loss, 5), **values)
        history.append({"step": step, "loss": loss, **values})
        evaluation.on_step(loss)
        if records:
            progress.written(records)

    def on_epoch(epoch: int) -> None:
        measured = evaluation.on_epoch(epoch, draft, head)
        _save_draft(ctx, draft, extracted, epoch, kept.LAST)
        best = kept.is_best(measured, evaluation.epochs)
        if best:
            _save_draft(ctx, draft, extracted, epoch, kept.DRAFT)
        _settle_start(ctx, evaluation)
        accept = "" if measured.accept_length is None else f", held-out accept length {measured.figure()}"
        where = f"{kept.DRAFT}/ and {kept.LAST}/" if best else f"{kept.LAST}/ ({kept.DRAFT}/ keeps epoch {evaluation.kept_epoch().epoch})"
        progress.note(f"epoch {epoch}/{epochs} saved to {where}{accept}")

    def on_checkpoint(reached: TrainState) -> None:
        # NOTE: the history first, so a resumed run never lacks the steps its state counts.
        write_json_atomic(ctx.output / "history.json", earlier + history)
        resume.save(ctx.output / "resume", draft, reached)

    return {"on_step": on_step, "on_epoch": on_epoch, "on_checkpoint": on_checkpoint}


def _save_draft(ctx: StageContext, draft, extracted: dict[str, Any], epoch: int, name: str) -> None:
    """The draft as SGLang loads it, at ``$AERIE_OUTPUT/<name>`` (``draft``: the kept one; ``last``), rewritten atomically."""
    from remote.eagle3 import checkpoint

    checkpoint.save(draft, ctx.output / name, {"epoch": epoch, "extract_release": extracted["release"], "release": ctx.release})


def _resume_state(ctx: StageContext, draft, files: list[Path], settings: TrainSettings, progress: Progress, world: int = 1):
    """The saved training state to go on from (its weights loaded into `draft`), or a fresh one; refused
    (one line) when it was trained by another number of processes than `world`."""
    from remote.eagle3 import resume

    fields: dict[str, Any] = {k: getattr(settings, k) for k in ("batch_size", "epochs", "max_length", "ttt_steps")}
    driver = ctx.stage_config  # the chunked driver's own keys, never the inventory's
    if driver.get("chunk_pass"):  # only where the chunked route sends it: other checkpoints keep their fingerprint
        fields["chunk_pass"] = driver["chunk_pass"]
    data = resume.fingerprint(files, fields)
    saved = resume.load(ctx.output / "resume", draft)
    if saved is None:
        return resume.TrainState(data=data, world=world)
    if saved.data == data:
        resume.check_world(saved, world)
    if saved.data != data:
        progress.note(f"continuing the draft from step {saved.step} on new data")
        # NOTE: one schedule over all chunks when the chunked route sized it (schedule_steps).
        schedule = saved.schedule if driver.get("schedule_steps") else {}
        return resume.TrainState(step=saved.step, optimizer=saved.optimizer, schedule=schedule, data=data, world=world)
    if saved.epoch >= settings.epochs:  # run again after it finished (a second `inv demo`): nothing to train
        progress.note(f"trained before: {settings.epochs} epochs, {saved.step} steps; the saved draft stands")
    else:
        progress.note(f"resuming at epoch {saved.epoch + 1}, batch {saved.position}, step {saved.step}")
    done = len(files) if saved.epoch > 0 else min(len(files), saved.position * settings.batch_size * saved.world)
    if done:
        progress.written(done)
    return saved


def _previous_history(ctx: StageContext, step: int) -> list[dict[str, Any]]:
    """The steps runs before this one took, up to the step it goes on from."""
    steps = read_json(ctx.output / "history.json", []) if step else []
    return [h for h in steps if h["step"] <= step]


def run_specforge(ctx: StageContext, settings: TrainSettings, extracted: dict[str, Any] | None,
                  progress: Progress) -> dict[str, Any]:
    """Train with the host's SpecForge (offline from extract's states, or online when `extracted` is
    None), then export a draft SGLang loads to ``$AERIE_OUTPUT/draft``."""
    where = specforge.specforge_dir(ctx.stage_config, init_draft=settings.init_draft)
    generation, prefix = specforge.detect(where)
    if settings.init_draft and generation != "current":
        raise StageInputError("stages.train.init_draft: the legacy SpecForge script has no warm start; "
                              "install SpecForge 0.2.0 (model.draft_checkpoint_path) or use engine: aerie")
    job = _specforge_job(ctx, settings, extracted, generation, where, progress)
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
    out, tmp = ctx.output / "draft", ctx.output / f".draft.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if generation == "current":
        progress.note(f"exporting {latest.name} to SGLang's layout")
        _call(specforge.export_command(prefix, job, latest, tmp), env, "export", progress)
    else:  # the legacy trainer saves SGLang's layout itself
        shutil.copytree(latest, tmp, ignore=shutil.ignore_patterns("training_state*.pt"))
    config = specforge.finish_draft(tmp, job.layers)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    progress.written(int((extracted or {}).get("records", 0)) or _count_lines(job.prompts or job.train_data))
    manifest = {"release": ctx.release, "engine": "specforge", "specforge": generation, "mode": mode, "command": argv,
                "run_id": job.run_id if generation == "current" else None,
                "checkpoint": str(latest), "draft": str(out), "layers": job.layers, "init_draft": settings.init_draft,
                "eagle_aux_hidden_state_layer_ids": config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]}
    write_json_atomic(ctx.output / "manifest.json", manifest)
    return manifest


def _specforge_job(ctx: StageContext, settings: TrainSettings, extracted: dict[str, Any] | None, generation: str,
                   where: Path | None, progress: Progress) -> specforge.SpecForgeRun:
    """What SpecForge is run with, its inputs written and checked first (one line for each refusal)."""
    path, trust = target_settings(ctx.shared_config)
    shape = read_shape(path)
    layers = list(extracted["layers"]) if extracted else list(ctx.stage_config.get("layers") or [])
    if not layers:
        raise StageInputError("engine specforge online: no layers to capture (stages.extract.layers)")
    if extracted and generation == "current" and extracted.get("dtype") not in (None, "bfloat16"):
        raise StageInputError(f"engine specforge trains on bfloat16 states (its target head is bfloat16) but extract stored "
                              f"{extracted['dtype']}: set stages.extract.dtype: bfloat16 and rerun extract")
    draft_vocab = min(settings.draft_vocab_size, shape.vocab_size)
    if settings.init_draft:  # its own config.json shapes the draft, checked against the target and the settings
        config = init_draft.config_for(settings.init_draft, shape.hidden_size, shape.vocab_size, layers, draft_vocab)
    else:
        draft_path = draft_config.draft_config_path(ctx.stage_config, ctx.shared_config)
        draft = draft_config.load(draft_path)
        draft_config.check_width(layers, shape.hidden_size, draft, f"draft config {draft_path}")
        config = draft_config.finalize(draft, layers, shape.vocab_size, draft_vocab)
    ctx.output.mkdir(parents=True, exist_ok=True)
    # NOTE: the draft SpecForge trains names the captured layers, so its export does too.
    finalized = ctx.output / "draft-config.json"
    write_json_atomic(finalized, config)
    online = extracted is None
    prompts = mapping = warm = None
    identity = f"{(extracted or {}).get('records')} records in {', '.join(map(str, ctx.inputs('extract')))}" if extracted else ""
    if online and generation == "current":
        _require_online(settings, ctx.stage_config)
        prep_dirs = [Path(p) for p in (ctx.config.get("prep_inputs") or {}).values()] or [ctx.upstream("prep")]
        prompts, mapping, identity = specforge.write_online_inputs(prep_dirs, ctx.output, shape.vocab_size, config["draft_vocab_size"])
    if settings.init_draft:
        warm, mapping = _specforge_warm_start(ctx, settings, config, shape, mapping, progress)
    return specforge.SpecForgeRun(
        specforge_dir=where, target_model=path, draft_config=finalized,
        train_data=_conversations(ctx) if generation == "legacy" else None,
        hidden_states=None if online else _states_dir(ctx), output=ctx.output,
        epochs=settings.epochs, batch_size=settings.batch_size, learning_rate=settings.learning_rate,
        max_length=settings.max_length, chat_template=settings.chat_template,
        ttt_steps=settings.ttt_steps, nproc=distributed.resolve_nproc(settings.nproc), layers=layers,
        embedding_key=weight_name(path, "embed_tokens.weight") or "model.embed_tokens.weight",
        lm_head_key=weight_name(path, "lm_head.weight") or "lm_head.weight", trust_remote_code=trust,
        server_urls=settings.specforge_server_urls, deployment=settings.specforge_deployment,
        save_interval=settings.checkpoint_every, prompts=prompts, vocab_mapping=mapping,
        mooncake=dict(ctx.stage_config.get("specforge_mooncake") or {}),
        data_identity=identity, report_to=settings.report_to, init_checkpoint=warm,
        init_source=settings.init_draft or "",
    )


def _specforge_warm_start(ctx: StageContext, settings: TrainSettings, config: dict[str, Any], shape,
                          mapping: Path | None, progress: Progress) -> tuple[Path, Path | None]:
    """``stages.train.init_draft`` written for SpecForge's weights-only warm start (``model.draft_checkpoint_path``):
    under SpecForge's names, with the vocabulary training keeps (a full one cut by the data's tokens, as
    aerie's engine does), and that vocabulary map (``model.vocab_mapping_path``; None: the full vocabulary)."""
    import torch

    from remote.eagle3 import checkpoint
    from remote.eagle3.vocab import build_mapping

    def data_mapping():
        if mapping is not None:  # online: the map of prep's tokens, already written
            saved = torch.load(mapping)
            return saved["d2t"], saved["t2d"]
        files = [f for d in ctx.inputs("extract") for f in ShardStore(d).sample_files()]
        return build_mapping(_counter(files, 0, shape.vocab_size, progress)(), config["draft_vocab_size"])

    embed, _ = read_embed_and_head(shape)
    draft = init_draft.start(settings.init_draft, config, embed, data_mapping)
    out = checkpoint.save(draft, ctx.output / "init-draft", {"init_draft": settings.init_draft})
    if config["draft_vocab_size"] == shape.vocab_size and mapping is None:
        return out, None
    kept = ctx.output / "init-draft-vocab.pt"
    d2t, t2d = draft.d2t.cpu(), draft.t2d.cpu()
    try:
        saved = torch.load(kept)
        same = torch.equal(saved["d2t"], d2t) and torch.equal(saved["t2d"], t2d)
    except Exception:  # none yet, or torn by a kill: written again
        same = False
    # NOTE: left as it is when unchanged: SpecForge refuses to resume once the map's file is newer than its checkpoint.
    if not same:
        tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        torch.save({"d2t": d2t, "t2d": t2d}, tmp)
        os.replace(tmp, kept)
    return out, kept


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


def _states_dir(ctx: StageContext) -> Path:
    """One directory of every dataset's states: SpecForge reads one `hidden_states_path`."""
    dirs = ctx.inputs("extract")
    if len(dirs) == 1:
        return dirs[0]
    joined = ctx.output / "states"
    shutil.rmtree(joined, ignore_errors=True)
    joined.mkdir(parents=True)
    for directory in dirs:
        for shard in ShardStore(directory).complete_shards():
            # NOTE: links per shard, named by dataset, so that SpecForge's sorted walk keeps each dataset's order.
            os.symlink(ShardStore(directory).shard_dir(shard), joined / f"{directory.parent.name}-{shard:05d}")
    return joined


def weight_name(path: Path, suffix: str) -> str | None:
    """The target's full tensor name ending in `suffix` (Kimi-K2.5: ``language_model.model.embed_tokens.weight``)."""
    from remote.eagle3.target import _weight_files

    try:
        names = [n for names in _weight_files(path).values() for n in names]
    except StageInputError:
        return None
    return next((n for n in names if n.endswith(suffix) and "vision" not in n), None)


def _count_lines(path: Path | None) -> int:
    if path is None or not path.is_file():
        return 0
    with path.open("rb") as handle:
        return sum(1 for line in handle if line.strip())


def _conversations(ctx: StageContext) -> Path:
    """The conversations SpecForge reads: the setting, else prep's conversations.jsonl (every
    dataset's, joined, when the pipeline passes several)."""
    given = ctx.stage_config.get("specforge_train_data")
    preps = [Path(p) for p in (ctx.config.get("prep_inputs") or {}).values()]
    if given:
        path = Path(given).expanduser()
    elif len(preps) > 1:
        path = ctx.output / "conversations.jsonl"
        ctx.output.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            for prep in preps:
                with (prep / "conversations.jsonl").open("rb") as source:
                    shutil.copyfileobj(source, out)
    else:
        path = (preps[0] if preps else ctx.upstream("prep")) / "conversations.jsonl"
    if not path.is_file():
        raise StageInputError(f"engine specforge: no conversations at {path}; set stages.train.specforge_train_data to a JSONL file")
    return path


def _each(files: list[Path], progress: Progress):
    for path in files:
        progress.beat()
        # NOTE: memory-mapped: counting reads the token ids, not the hidden states.
        yield load_sample(path, mmap=True)


def main() -> None:
    """The stage as the supervisor starts it: with ``nproc`` > 1 (aerie's engine), it launches that many
    ranks of itself under torchrun and waits (`remote.eagle3.distributed`); a rank runs the stage."""
    world = distributed.World.from_env()
    if not world.is_distributed:
        nproc = distributed.ranks_for(StageContext.from_env().config)
        if nproc > 1:
            raise SystemExit(distributed.launch("remote.stages.train", nproc))
    elif not world.is_main:
        try:
            run(StageContext.from_env(), Progress())
        except StageInputError:  # rank 0 says why, once
            raise SystemExit(distributed.REFUSED) from None
        return
    stages.main("train", run, (StageInputError,))


if __name__ == "__main__":
    main()
