"""The train stage: an EAGLE-3 draft from the extract stage's hidden states.

Settings (``stages.train``, typed once by `remote.eagle3.train_settings`):

- ``engine``: ``aerie`` (`remote.eagle3.session`, plain torch; this module wires it) or ``specforge``
  (`remote.eagle3.specforge_engine` runs SpecForge instead).
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

Input: ``$AERIE_DATA/extract`` with its ``manifest.json`` (`remote.eagle3.extract_manifest`: the layers
the draft reads come from it, typed); refused when missing (extract did not succeed) or when its
width does not fit the draft. Online (SpecForge), no extract ran: the layers are ``stages.extract``'s,
which the job's spec carries as ``config.extract``.
Output: ``$AERIE_OUTPUT/draft/`` (SGLang's ``--speculative-draft-model-path``), the
best epoch's draft by held-out accept length, and ``last/``, the last epoch's
(`remote.eagle3.kept`), each rewritten atomically; ``$AERIE_OUTPUT/training.png``
beside them (loss, held-out accuracy and acceptance length per epoch), and
``$AERIE_OUTPUT/manifest.json`` (the kept draft's ``accept_length`` and interval,
``kept_epoch`` and ``kept_reason``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from remote import stages
from remote.control_plane import collector, logfile
from remote.control_plane.progress import Progress, write_json_atomic
from remote.eagle3 import StageInputError, distributed, draft_config, heldout, init_draft, reporting
from remote.eagle3.extract_manifest import ExtractManifest
from remote.eagle3.session import TrainingSession, token_counter
from remote.eagle3.shards import ShardStore
from remote.eagle3.target import draft_base, read_target, shape_of, target_settings
from remote.eagle3.train_settings import TrainSettings
from remote.stages import StageContext


def draft_for(ctx: StageContext, settings: TrainSettings, extracted: ExtractManifest, vocab_size: int,
              target_config: dict[str, Any]) -> dict[str, Any]:
    """The draft's config, checked against the width the extraction wrote."""
    layers = list(extracted.layers)
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
    if draft_config.expected_width(config) != extracted.width:
        raise StageInputError(
            f"feature width mismatch: the extracted states are {extracted.width} wide "
            f"(layers {layers} x hidden {extracted.hidden_size}) but {source} expects {draft_config.expected_width(config)}; "
            "rerun extract with the draft's layers or fix the draft config"
        )
    draft_config.check_width(layers, extracted.hidden_size, config, source)
    return config


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """Train the draft with the engine ``stages.train.engine`` names, on extract's states
    (or, SpecForge's online route, on prep's prompts with no states on disk)."""
    from remote.eagle3 import specforge_engine

    settings = TrainSettings.from_config(ctx.stage_config)
    reporting.require(settings.report_to)
    if settings.engine == "specforge" and ctx.config.get("prep_inputs") and not ctx.config.get("inputs"):
        return specforge_engine.run(ctx, settings, None, progress)  # the online route: no states on disk
    extracted = ExtractManifest.read_all(ctx.inputs("extract"))
    if settings.engine == "specforge":
        return specforge_engine.run(ctx, settings, extracted, progress)
    return run_aerie(ctx, settings, extracted, progress)


def run_aerie(ctx: StageContext, settings: TrainSettings, extracted: ExtractManifest, progress: Progress) -> dict[str, Any]:
    """Train with this project's plain-torch trainer (`remote.eagle3.session`), in one process or as one rank
    of several (`remote.eagle3.distributed`): the draft measured on the held-out records after every epoch,
    the best kept in ``draft/`` and the last in ``last/`` (`remote.eagle3.kept`), resumable from
    ``$AERIE_OUTPUT/resume``. Rank 0 alone writes; the other ranks train and return nothing."""
    shape, config, files = _aerie_inputs(ctx, settings, extracted)
    world = distributed.World.from_env()
    session = TrainingSession(ctx.output, ctx.release, settings, progress, world=world, name=f"{ctx.dataset}-{ctx.release}",
                              provenance={"extract_release": extracted.release})
    files, heldout_files = heldout.split(files, settings.eval_records, settings.eval_fraction)
    # NOTE: only rank 0 counts tokens for a new draft's vocabulary: DDP copies its weights and maps to the others.
    counts = token_counter(files, len(heldout_files), shape.vocab_size, progress) if world.is_main \
        else distributed.no_counts(shape.vocab_size)
    # NOTE: torch is imported only once the inputs are known good, so a refusal is instant.
    session.start(config, shape, counts)
    schedule_steps = int(ctx.stage_config.get("schedule_steps") or 0)  # NOTE: .get: only the chunked driver sends it
    state = session.resume(files, settings.epochs, chunk_pass=ctx.stage_config.get("chunk_pass") or "",
                           chunked=bool(schedule_steps))
    if world.is_main:
        # NOTE: the epochs before the one this run goes on from were measured by earlier runs: the manifest
        # still reports them (a run resumed after its last step measures nothing, yet had an accept length).
        session.measure_on(heldout_files, through=state.epoch)
        if state.step == 0:
            session.measure_start()
        session.open_reporter()
    session.progress.expect(settings.epochs * -(-len(files) // (settings.batch_size * world.size)), by="step")
    started = time.time()
    session.train(files, settings.epochs, schedule_steps=schedule_steps)
    session.stop()
    if not world.is_main:
        return {}
    return _finish(ctx, session, extracted, len(files), time.time() - started)


def _finish(ctx: StageContext, session: TrainingSession, extracted: ExtractManifest, records: int,
            seconds: float) -> dict[str, Any]:
    """Rank 0's end of a run: the plot, the drafts a run resumed after its last step left, the manifest."""
    from remote.eagle3 import kept

    settings, evaluation, progress = session.settings, session.evaluation, session.progress
    evaluation.draw()
    session.settle_start()
    if not session.trained_here:  # resumed after the last step: the saved drafts are the result
        for name in (kept.LAST, kept.DRAFT):
            if not (ctx.output / name).is_dir():
                session.save(name, epoch=settings.epochs)
    nproc = session.world.size
    manifest = session.manifest(records, settings.epochs, extracted.layers, seconds)
    manifest.update(nproc=nproc, batch_size=settings.batch_size, global_batch=settings.batch_size * nproc)
    chosen = evaluation.kept_epoch()
    if chosen is not None:  # what `inv status` shows: the kept draft's figures, not the last epoch's
        progress.metrics(**chosen.metrics())
    if session.trained_here:  # (else its line says the saved draft stands)
        progress.note(manifest["kept_reason"])
    write_json_atomic(ctx.output / "manifest.json", manifest)
    write_json_atomic(ctx.output / "history.json", session.history)
    return manifest


def _aerie_inputs(ctx: StageContext, settings: TrainSettings, extracted: ExtractManifest):
    """The target's shape, the draft's config and every extracted sample file, refused (one line each)
    when the target changed since extract ran or extract wrote no records."""
    extract_dirs = ctx.inputs("extract")
    path, _ = target_settings(ctx.shared_config)
    target = read_target(path)
    shape = shape_of(target)
    if shape.hidden_size != extracted.hidden_size:
        raise StageInputError(
            f"target.model {path} has hidden size {shape.hidden_size} but the extracted states have {extracted.hidden_size}: "
            "the target changed since extract ran; rerun extract"
        )
    config = draft_for(ctx, settings, extracted, shape.vocab_size, draft_base(target))
    files = [f for directory in extract_dirs for f in ShardStore(directory).sample_files()]
    if not files:
        raise StageInputError(f"no extracted samples in {', '.join(map(str, extract_dirs))}: extract wrote no records; check its skip reasons")
    return shape, config, files


def main() -> None:
    """The stage as the supervisor starts it: with ``nproc`` > 1 (aerie's engine), it launches that many
    ranks of itself under torchrun and waits (`remote.eagle3.distributed`); a rank runs the stage."""
    collector.tune()
    logfile.whole_lines()  # the launcher's line and its ranks' share the job's log
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
