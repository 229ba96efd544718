"""The chunked route: extract a chunk of records that fits the disk budget, train on it, delete it, go on.

One job (``draft/chunked``) replaces every dataset's ``extract`` and the
``draft/train`` job when the states do not fit on disk (`remote.plan`). For
each epoch asked, for each chunk k of n:

1. ``extract``: prep's records of the chunk are copied (token ids only, a few
   bytes a token) to ``chunk-<k>/<dataset>/prep/`` and the configured extract
   command (``stages.extract.command``, else the built-in stage) runs on each,
   writing its states to ``chunk-<k>/<dataset>/extract/``;
2. ``train``: the configured train command runs for one pass over the chunk's
   states, writing the draft to ``<root>/data/draft/train/`` -- the same place
   as the offline route -- and going on from its last checkpoint
   (`remote.eagle3.resume`: draft, optimizer, one schedule over all chunks);
3. the chunk is deleted.

Chunks are cut from prep's exact token counts so that one chunk's files --
states, ids and masks, file framing and the copied ids -- stay within
``stages.extract.disk_budget``; only one chunk exists at a time. Where the
run stands (epoch, chunk, phase) is in ``state.json`` beside the chunk plan
(``chunks.json``), so a rerun after a crash or `inv stop` goes on from the
phase it was in: extract keeps its complete shards, train its checkpoint.
The status line says ``epoch e/E, chunk k of n: <phase>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from remote import plan as sizing
from remote.eagle3 import StageInputError
from remote.eagle3.extractor import DTYPES
from remote.progress import Progress, read_json, write_json_atomic
from remote.stages import DEFAULT_COMMANDS, StageContext
from remote.settings import need

#: The copied ids (int32) and mask (int8) of a chunk's prep subset, per token, rounded up.
PREP_BYTES_PER_TOKEN = 8
#: A record's share of its shard's directory and meta.json (a 4 KiB block each), at worst one shard a record.
SHARD_BYTES = 8192
#: A chunk's small files and directories, each a 4 KiB block: per dataset (prep, extract, plan, manifests)
#: and the chunk's own (its directory, the run's state and progress files).
DATASET_BYTES = 64 * 1024
CHUNK_BYTES = 32 * 1024


def record_size(tokens: int, per_token: int) -> int:
    """Disk one record takes in a chunk: its states file, its copied ids, its share of the shard."""
    return sizing.record_bytes(tokens, per_token) + tokens * PREP_BYTES_PER_TOKEN + SHARD_BYTES


def reserved(datasets: int) -> int:
    """Disk a chunk takes besides its records."""
    return CHUNK_BYTES + DATASET_BYTES * datasets


def token_counts(prep_dir: Path) -> list[int]:
    """Each record's token count, in prep's order (the order extract reads)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from remote.eagle3.prep_input import shard_files

    counts: list[int] = []
    for file in shard_files(prep_dir):
        counts += pc.list_value_length(pq.read_table(file, columns=["input_ids"])["input_ids"]).to_pylist()
    return counts


def cut(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges whose sizes sum to at most `budget`, greedily."""
    ranges, start, used = [], 0, 0
    for index, size in enumerate(sizes):
        if size > budget:
            raise StageInputError(f"record {index} alone needs {size:,} B on disk, more than stages.extract.disk_budget "
                                  f"{budget:,} B: raise the budget or use the online route")
        if used + size > budget:
            ranges.append((start, index))
            start, used = index, 0
        used += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


class Chunked:
    """One chunked run: its plan of chunks, where it stands, and the stage commands it runs."""

    def __init__(self, ctx: StageContext, progress: Progress) -> None:
        self.ctx, self.progress = ctx, progress
        settings = ctx.stage_config
        self.extract: dict[str, Any] = settings.get("extract") or {}
        self.train: dict[str, Any] = settings.get("train") or {}
        self.epochs = int(need(self.train, "train", "epochs", StageInputError))
        self.budget = sizing.parse_size(settings.get("disk_budget"))
        if not self.budget:
            raise StageInputError("the chunked route needs stages.extract.disk_budget (e.g. 500G)")
        self.preps: dict[str, Path] = {name: Path(p) for name, p in (ctx.config.get("prep_inputs") or {}).items()}
        if not self.preps:
            raise StageInputError("the chunked route got no prep outputs to read (config prep_inputs)")
        self.out = ctx.output
        self.train_out = ctx.data / "train"

    # -- the plan of chunks ------------------------------------------------------

    def per_token(self) -> int:
        dtype = need(self.extract, "extract", "dtype", StageInputError)
        if dtype not in DTYPES:
            raise StageInputError(f"stages.extract.dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        hidden = sizing.hidden_size((self.ctx.shared_config.get("target") or {}).get("model"))
        if not hidden:
            raise StageInputError("target.model has no readable config.json with hidden_size on the host")
        return sizing.bytes_per_token(self.extract.get("layers") or [2, 30, 58], hidden, dtype)

    def chunks(self) -> list[list[dict[str, Any]]]:
        """Each chunk as [{dataset, start, end}] over prep's order; made once and kept (chunks.json)."""
        fingerprint = self.fingerprint()
        saved = read_json(self.out / "chunks.json")
        if saved and saved.get("fingerprint") == fingerprint:
            return saved["chunks"]
        per_token = self.per_token()
        order = [(name, i, n) for name, prep in self.preps.items() for i, n in enumerate(token_counts(prep))]
        sizes = [record_size(n, per_token) for _, _, n in order]
        chunks = []
        for start, end in cut(sizes, self.budget - reserved(len(self.preps))):
            parts: dict[str, dict[str, Any]] = {}
            for name, index, _ in order[start:end]:
                part = parts.setdefault(name, {"dataset": name, "start": index, "end": index})
                part["end"] = index + 1
            chunks.append(list(parts.values()))
        # A new plan is a new run: forget where an older one stood.
        (self.out / "state.json").unlink(missing_ok=True)
        write_json_atomic(self.out / "chunks.json", {"fingerprint": fingerprint, "chunks": chunks})
        return chunks

    def fingerprint(self) -> str:
        """What the chunks depend on; prep's counts, not its release, so a rerun of prep that
        gives the same records does not throw the run's progress away."""
        manifests = {name: read_json(prep / "manifest.json", {}) for name, prep in self.preps.items()}
        key = {
            "prep": {name: [m.get("kept"), (m.get("tokens") or {}).get("total")] for name, m in manifests.items()},
            "budget": self.budget, "layers": self.extract.get("layers"), "dtype": self.extract.get("dtype"),
            "target": (self.ctx.shared_config.get("target") or {}).get("model"), "epochs": self.epochs,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    # -- running -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        chunks = self.chunks()
        state = read_json(self.out / "state.json", {"epoch": 0, "chunk": 0, "phase": "extract"})
        if state != {"epoch": 0, "chunk": 0, "phase": "extract"}:
            self.progress.note(f"resuming at epoch {state['epoch'] + 1}, chunk {state['chunk'] + 1}, {state['phase']}")
        records = [sum(p["end"] - p["start"] for p in chunk) for chunk in chunks]
        batch = int(need(self.train, "train", "batch_size", StageInputError))
        schedule = self.epochs * sum(-(-n // batch) for n in records)
        if state["epoch"] > 0 or state["chunk"] > 0:
            self.progress.written(sum(records) if state["epoch"] > 0 else sum(records[: state["chunk"]]))
        started = time.time()
        for epoch in range(state["epoch"], self.epochs):
            first = state["chunk"] if epoch == state["epoch"] else 0
            for k in range(first, len(chunks)):
                phase = state["phase"] if (epoch, k) == (state["epoch"], state["chunk"]) else "extract"
                where = f"epoch {epoch + 1}/{self.epochs}, chunk {k + 1} of {len(chunks)}"
                self.progress.metrics(epoch=epoch + 1, chunk=k + 1, chunks=len(chunks))
                directory = self.out / f"chunk-{k:05d}"
                if phase == "extract":
                    self.progress.note(f"{where}: extracting {records[k]} records")
                    self.extract_chunk(directory, chunks[k])
                    self.save(epoch, k, "train")
                self.progress.note(f"{where}: training")
                self.train_chunk(directory, chunks[k], schedule, f"epoch {epoch + 1}, chunk {k + 1}")
                # NOTE: the state moves on before the delete: a crash in between leaves a
                # chunk that the next run's extract of chunk k + 1 never reads, and removes.
                self.save(epoch, k + 1, "extract")
                shutil.rmtree(directory, ignore_errors=True)
                if epoch == 0:
                    self.progress.written(records[k])
        for stale in self.out.glob("chunk-*"):
            shutil.rmtree(stale, ignore_errors=True)
        manifest = {"release": self.ctx.release, "route": "chunked", "chunks": len(chunks), "epochs": self.epochs,
                    "records": sum(records), "disk_budget": self.budget, "draft": str(self.train_out / "draft"),
                    "seconds": round(time.time() - started, 3)}
        write_json_atomic(self.out / "manifest.json", manifest)
        self.progress.note(f"{len(chunks)} chunk(s) × {self.epochs} epoch(s) trained; draft in {manifest['draft']}")
        return manifest

    def save(self, epoch: int, chunk: int, phase: str) -> None:
        write_json_atomic(self.out / "state.json", {"epoch": epoch, "chunk": chunk, "phase": phase})

    def extract_chunk(self, directory: Path, chunk: list[dict[str, Any]]) -> None:
        for stale in self.out.glob("chunk-*"):
            if stale != directory:
                shutil.rmtree(stale, ignore_errors=True)
        for part in chunk:
            data = directory / part["dataset"]
            copy_records(self.preps[part["dataset"]], data / "prep", part["start"], part["end"])
            self.stage("extract", self.extract, data, [data / "prep"], part["dataset"])

    def train_chunk(self, directory: Path, chunk: list[dict[str, Any]], schedule: int, name: str) -> None:
        # NOTE: no held-out evaluation per chunk: it would keep a share of every chunk's records
        # out of training for good (each chunk is a different slice); the chunked route trains all.
        # `chunk_pass` names this pass in the trainer's checkpoint: a stop after the trainer ended but
        # before `save` recorded it runs the same pass again, which the checkpoint finds complete
        # (trains nothing), while the next pass -- even over the same chunk -- is new data.
        settings = {**self.train, "epochs": 1, "schedule_steps": schedule, "eval_records": 0, "chunk_pass": name}
        inputs = [directory / part["dataset"] / "extract" for part in chunk]
        self.stage("train", settings, self.ctx.data, inputs, "draft")

    def stage(self, name: str, settings: dict[str, Any], data: Path, inputs: list[Path], dataset: str) -> None:
        """Run a stage's configured command the way the supervisor would, in this job's log."""
        output = data / name
        output.mkdir(parents=True, exist_ok=True)
        config = {"dataset": {}, "stage": {k: v for k, v in settings.items() if k != "command"},
                  "inventory": self.ctx.shared_config, "inputs": [str(p) for p in inputs]}
        env = {**os.environ, "AERIE_DATASET": dataset, "AERIE_STAGE": name, "AERIE_OUTPUT": str(output),
               "AERIE_DATA": str(data), "AERIE_CONFIG": json.dumps(config),
               "AERIE_PROGRESS": str(self.out / f".{name}.progress.json")}
        command = (settings.get("command") or DEFAULT_COMMANDS[name]).replace("{python}", sys.executable)
        process = subprocess.Popen(command, shell=True, env=env)
        while True:
            try:
                process.wait(timeout=1.0)  # not a sleep: record the end the moment it comes
                break
            except subprocess.TimeoutExpired:
                self.progress.beat()  # the sub-stage's progress is its own: this job is alive while it runs
        if process.returncode != 0:
            raise SystemExit(f"chunked: {name} exited with {process.returncode}; see the log above")


def copy_records(prep_dir: Path, out: Path, start: int, end: int) -> None:
    """Prep's records [start, end) as a prep output of their own (parquet and manifest)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from remote.eagle3.prep_input import COLUMNS, read_manifest, shard_files

    manifest = read_manifest(prep_dir)
    tables, seen = [], 0
    for file in shard_files(prep_dir):
        rows = pq.read_metadata(file).num_rows
        if seen + rows > start and seen < end:
            table = pq.read_table(file, columns=COLUMNS)
            tables.append(table.slice(max(0, start - seen), min(end, seen + rows) - max(start, seen)))
        seen += rows
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tokens-00000.parquet.{os.getpid()}.tmp"
    pq.write_table(pa.concat_tables(tables), tmp)
    os.replace(tmp, out / "tokens-00000.parquet")
    write_json_atomic(out / "manifest.json", {"release": manifest["release"], "kept": end - start,
                                              "source": str(prep_dir), "range": [start, end]})


def main() -> None:
    from remote import stages

    stages.main("chunked", lambda ctx, progress: Chunked(ctx, progress).run(), (StageInputError, sizing.PlanError))


if __name__ == "__main__":
    main()
