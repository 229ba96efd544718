"""The files of one dataset's infer output, and which prompts and settings its journal belongs to.

``.journal.json`` remembers the prompts (their digest) and the sampling settings the answers were
asked with: new prompts start the journal over; changed sampling settings are refused once some
prompt is answered, so one dataset never mixes two temperatures (`remote.stages.infer`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from remote.control_plane.release import sha256
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.control_plane.scratch import temporary_name
from remote.infer.infer_settings import InferSettings

if TYPE_CHECKING:
    from remote.stages import StageContext

PROMPTS = "prompts.jsonl"
OUTPUT = "conversations.jsonl"
PART = OUTPUT + ".part"
SKIPPED = "skipped.jsonl"
STATE = ".journal.json"
MANIFEST = "manifest.json"


class InferError(Exception):
    """An expected failure, told to the user in one line."""


@dataclass(frozen=True)
class Upstream:
    """The prep output this run answers."""

    prompts: Path
    release: str
    sha256: str


def read_upstream(ctx: "StageContext") -> Upstream:
    """The prep job's prompts, refused unless that job finished (it writes its manifest last)."""
    prep = ctx.upstream("prep")
    manifest_path, prompts = prep / MANIFEST, prep / PROMPTS
    relaunch = f"run `inv launch --stage prep --dataset {ctx.dataset}` first"
    if not manifest_path.exists():
        raise InferError(f"no prep manifest at {manifest_path}: prep has not finished for {ctx.dataset}; {relaunch}")
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict) or not manifest.get("release"):
        raise InferError(f"prep manifest {manifest_path} is unreadable or has no release; {relaunch}")
    if not prompts.exists():
        raise InferError(
            f"no {PROMPTS} in {prep}: prep wrote no prompts for {ctx.dataset} "
            f"(is it kind: prompts in the inventory?); {relaunch}"
        )
    return Upstream(prompts, str(manifest["release"]), sha256(prompts))


def open_journal(output: Path, upstream: Upstream, settings: InferSettings, progress: Progress) -> bool:
    """Make `output` hold the journal of these prompts and settings: continued, restored or new. True when
    the finished file of an earlier run holds answers to these prompts with these settings: it stays in
    place, with its manifest, until this run finishes (a run stopped meanwhile leaves the dataset as it
    was), and the journal holds only what this run adds."""
    state = read_json(output / STATE)
    if state and state.get("prompts_sha256") != upstream.sha256:
        progress.note("prompts changed since the last run: starting over")
        state = None
    if state and state.get("sampling") != settings.sampling() and not _has_answers(output):
        # NOTE: nothing answered (a server that refused every request, a model misnamed): nothing can mix.
        progress.note("stages.infer settings changed and no prompt was answered yet: asking every prompt again")
        state = None
    if state is None:
        for name in (PART, SKIPPED):  # a finished file of other prompts is replaced only at the end
            (output / name).unlink(missing_ok=True)
    elif state.get("sampling") != settings.sampling():
        raise InferError(_changed_settings(state.get("sampling") or {}, settings.sampling(), output))
    finished = _finished_for(output, upstream, settings)
    if not finished and state is not None and (output / OUTPUT).exists() and not (output / PART).exists():
        os.replace(output / OUTPUT, output / PART)  # a finish cut short before its manifest: the journal again
    write_json_atomic(output / STATE, {"prompts_sha256": upstream.sha256, "sampling": settings.sampling()})
    return finished


def _finished_for(output: Path, upstream: Upstream, settings: InferSettings) -> bool:
    manifest = read_json(output / MANIFEST)
    return ((output / OUTPUT).exists() and isinstance(manifest, dict)
            and (manifest.get("upstream") or {}).get("prompts_sha256") == upstream.sha256
            and manifest.get("sampling") == settings.sampling())


def _has_answers(output: Path) -> bool:
    return any((output / name).exists() and (output / name).stat().st_size > 0 for name in (PART, OUTPUT))


def _changed_settings(before: dict[str, Any], now: dict[str, Any], output: Path) -> str:
    changed = ", ".join(f"{k} {before.get(k)!r} -> {now.get(k)!r}" for k in now if before.get(k) != now.get(k))
    return (
        f"stages.infer settings changed since this dataset's answers were started ({changed}); "
        f"restore them, or delete {output} to answer all prompts again"
    )


def read_prompts(path: Path, progress: Progress) -> Iterator[dict[str, Any]]:
    """Valid prompt records, each id once; the rest counted as skipped."""
    seen: set[str] = set()
    with open(path, encoding="utf-8") as file:
        for line in file:
            if not line.strip():
                continue
            record = _prompt(line)
            if record is None:
                progress.skipped("bad prompt record")
            elif record["id"] in seen:
                progress.skipped("duplicate id")
            else:
                seen.add(record["id"])
                yield record


def _prompt(line: str) -> dict[str, Any] | None:
    """A prompt record with an id and a non-empty list of turns, or None."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("id") in (None, ""):
        return None
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) and "role" in t for t in turns):
        return None
    tools = record.get("tools")
    return {"id": str(record["id"]), "conversations": turns, **({"tools": tools} if isinstance(tools, list) and tools else {})}


def finish(output: Path, kept_earlier: bool, manifest: dict[str, Any]) -> None:
    """Rename the journal into the finished file (after an earlier run's answers kept in place, when
    `kept_earlier`) and write `manifest` last: a manifest beside the file says it is whole."""
    (output / PART).touch()
    if kept_earlier and (output / PART).stat().st_size:
        whole = output / temporary_name(OUTPUT)
        with open(whole, "wb") as target:
            for name in (OUTPUT, PART):
                with open(output / name, "rb") as source:
                    shutil.copyfileobj(source, target, 1 << 20)
            target.flush()
            os.fsync(target.fileno())
        (output / MANIFEST).unlink()  # from here the finished file is this run's
        os.replace(whole, output / OUTPUT)
        (output / PART).unlink()
    elif kept_earlier:
        (output / PART).unlink()  # nothing new: the kept file is the whole answer
    else:
        (output / MANIFEST).unlink(missing_ok=True)  # an earlier run's, of other prompts
        os.replace(output / PART, output / OUTPUT)
    write_json_atomic(output / MANIFEST, manifest)
