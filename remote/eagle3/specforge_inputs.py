"""What SpecForge's engine hands SpecForge (`remote.eagle3.specforge_engine`), written under the train job's output.

Offline, the extracted states split as aerie's engine splits them (`remote.eagle3.heldout`): SpecForge trains on
``specforge-train/`` and evaluates on ``specforge-heldout/`` (links to extract's files, never copies), so it never
trains on the records its draft is measured on. Online, prep's exact tokens and their vocabulary map. Legacy,
the conversations. With ``stages.train.init_draft``, that draft under SpecForge's names for its warm start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from remote.control_plane.progress import Progress
from remote.eagle3 import StageInputError, heldout
from remote.eagle3.shards import ShardStore, content_id
from remote.eagle3.train_settings import TrainSettings

TRAIN_STATES, HELDOUT_STATES = "specforge-train", "specforge-heldout"
#: Where `warm_start` writes the init draft (aerie's layout, which SpecForge reads): also epoch 0's candidate.
INIT_DRAFT = "init-draft"


def split_states(inputs: list[Path], output: Path, settings: TrainSettings) -> tuple[Path, Path | None, int, list[Path]]:
    """(the training share's directory, the held-out records' directory or None, the training share's count, the
    held-out records' files): every dataset's sample files linked under `output`, each named by dataset, shard and
    file, so that SpecForge's sorted walk keeps each dataset's order; rewritten on every run (renamed into place)."""
    files = [f for d in inputs for f in ShardStore(d).sample_files()]
    trained, held = heldout.split(files, settings.eval_records, settings.eval_fraction)
    return _linked(trained, output / TRAIN_STATES), (_linked(held, output / HELDOUT_STATES) if held else None), \
        len(trained), held


def contents(inputs: list[Path]) -> str:
    """The states by the checksums extract recorded: states extracted again under the same names (new answers) are
    another SpecForge run, not the resume of one that trained on the old."""
    digest = hashlib.sha256()
    for path in (f for d in inputs for f in ShardStore(d).sample_files()):
        digest.update(content_id(path).encode())
    return digest.hexdigest()[:12]


def _linked(files: list[Path], directory: Path) -> Path:
    tmp = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in files:
        # NOTE: links to files, not to shard folders: SpecForge's os.walk does not descend a linked folder.
        name = "-".join(path.parts[-4:-3] + path.parts[-2:])  # <dataset>-<shard>-<file>
        os.symlink(path.resolve(), tmp / name)
    from remote.eagle3.checkpoint import promote  # here: torch, which it imports, only once SpecForge is to run

    return promote(tmp, directory)


def conversations(ctx: Any) -> Path:
    """The conversations legacy SpecForge reads: the setting, else prep's conversations.jsonl (every
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


def write_online_inputs(prep_dirs: list[Path], output: Path, vocab_size: int, draft_vocab: int) -> tuple[Path, Path, str]:
    """Prep's exact tokens as SpecForge's pre-tokenized prompts (``{"input_ids", "loss_mask"}`` per
    line: no chat template re-renders them and loses what prep kept), and the vocabulary map of their
    trained tokens (``{"d2t", "t2d"}``, what SpecForge's `load_vocab_mapping` reads). Returns both
    paths and a hash of the prompts, part of the run's name. Written to temporary names and renamed."""
    import torch

    from remote.eagle3.prep_input import read_manifest, read_records
    from remote.eagle3.vocab import build_mapping

    prompts, mapping = output / "prompts.jsonl", output / "vocab_mapping.pt"
    counts = torch.zeros(vocab_size, dtype=torch.long)
    digest, written = hashlib.sha256(), 0
    tmp = prompts.with_name(f".{prompts.name}.{os.getpid()}.tmp")
    with tmp.open("w") as out:
        for prep in prep_dirs:
            read_manifest(prep)
            for record in read_records(prep):
                line = json.dumps({"input_ids": record.input_ids, "loss_mask": record.loss_mask}) + "\n"
                out.write(line)
                digest.update(line.encode())
                ids = torch.tensor(record.input_ids, dtype=torch.long)
                counts += torch.bincount(ids[torch.tensor(record.loss_mask, dtype=torch.bool)], minlength=vocab_size)[:vocab_size]
                written += 1
    if not written:
        tmp.unlink()
        raise StageInputError(f"no prep records in {', '.join(map(str, prep_dirs))}: prep kept nothing; check its skip reasons")
    os.replace(tmp, prompts)
    d2t, t2d = build_mapping(counts, draft_vocab)
    tmp = mapping.with_name(f".{mapping.name}.{os.getpid()}.tmp")
    torch.save({"d2t": d2t, "t2d": t2d}, tmp)
    os.replace(tmp, mapping)
    return prompts, mapping, f"{written} prompts sha256:{digest.hexdigest()[:16]}"



def warm_start(ctx: Any, settings: TrainSettings, config: dict[str, Any], shape: Any, mapping: Path | None,
               progress: Progress) -> tuple[Path, Path | None]:
    """``stages.train.init_draft`` written for SpecForge's weights-only warm start (``model.draft_checkpoint_path``):
    under SpecForge's names, with the vocabulary training keeps (a full one cut by the data's tokens, as
    aerie's engine does), and that vocabulary map (``model.vocab_mapping_path``; None: the full vocabulary)."""
    import torch

    from remote.eagle3 import checkpoint, init_draft
    from remote.eagle3.target import read_embed_and_head
    from remote.eagle3.vocab import build_mapping
    from remote.eagle3.session import token_counter

    def data_mapping():
        if mapping is not None:  # online: the map of prep's tokens, already written
            saved = torch.load(mapping)
            return saved["d2t"], saved["t2d"]
        files = [f for d in ctx.inputs("extract") for f in ShardStore(d).sample_files()]
        return build_mapping(token_counter(files, 0, shape.vocab_size, progress)(), config["draft_vocab_size"])

    embed, _ = read_embed_and_head(shape)
    draft = init_draft.start(settings.init_draft, config, embed, data_mapping)
    out = checkpoint.save(draft, ctx.output / INIT_DRAFT, {"init_draft": settings.init_draft})
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
