"""The chunked route: extract a chunk of records that fits the disk budget, train on it, delete it, go on.

One job (``draft/chunked``) replaces every dataset's ``extract`` and the
``draft/train`` job when the states do not fit on disk (`remote.sizing`).

**The plan** (``chunks.json``, made once per set of inputs and settings): the records the train stage
would hold out (`remote.eagle3.heldout`'s hashing rule over the paths their states would have on the
offline route, so both routes measure their drafts on the same records) are extracted once into
``heldout/`` and kept there, within a quarter of ``stages.extract.disk_budget``, for the draft's
measurement after every epoch and for `inv eval`'s prompts. The other records are shuffled (seeded)
across datasets and cut into chunks whose files -- states, ids and masks, file framing and the copied
ids -- fit what is left of the budget; only one chunk exists at a time.

**The passes**: ``stages.extract.passes`` forward passes of the target over the records
(default: ``stages.train.epochs``). In each pass every chunk is extracted, trained on for its share
of the epochs (``epochs / passes``, shuffled inside the chunk every epoch) and deleted; the chunks'
order changes from pass to pass. The default re-extracts every chunk every epoch; ``passes: 1`` reads
every record through the target once (E times fewer forward passes, but E epochs on one chunk at a
time: docs/chunked.md has both measured).

**The stages**: the built-in extract and train run inside this job (`remote.orchestration.resident`):
the target is loaded once per run, the draft and its optimizer are kept from chunk to chunk, with one
learning-rate schedule over the run, on ``stages.train.nproc`` ranks (more than one: a resident group
of training processes beside the job, `remote.orchestration.rank_group`). A configured
``stages.extract.command`` or ``stages.train.command`` (or ``engine: specforge``) runs as its own
process per chunk and pass instead.

**Where it stands** (pass, chunk, phase) is in ``state.json``, so a rerun after a crash or `inv stop`
goes on from the phase it was in: extract keeps its complete shards, train its checkpoint
(`remote.eagle3.resume`). The status line says ``pass p/P, chunk k of n: <phase>``; the time left
comes from the passes done, extract and train measured apart (``timing.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import time
from functools import cached_property
from pathlib import Path
from typing import Any

from remote import sizing
from remote.eagle3 import StageInputError
from remote.eagle3.extract_settings import ExtractSettings
from remote.eagle3.heldout import EVALUATIONS
from remote.eagle3.train_settings import TrainSettings
from remote.vocabulary import layout
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.control_plane.stage_contract import DEFAULT_COMMANDS, stage_command, stage_variables
from remote.vocabulary.states import DRAFT
from remote.orchestration.chunk_plan import (
    SEED, captured, copy_records, cut, epochs_per_pass, group, held_out, pass_order, record_size, reserved, state_bytes,
    steps_before, steps_in, token_counts,
)
from remote.orchestration import resident
from remote.stages import StageContext

#: Where a run stands before it starts, and what it has measured.
START = {"pass": 0, "chunk": 0, "phase": "extract"}
TIMING = {"extract_seconds": 0.0, "extracted_records": 0, "extracted_tokens": 0, "train_seconds": 0.0,
          "trained_steps": 0, "trained_tokens": 0, "target_loads": 0}


class Chunked:
    """One chunked run: its plan of chunks, where it stands, and the stages it runs."""

    def __init__(self, ctx: StageContext, progress: Progress) -> None:
        self.ctx, self.progress = ctx, progress
        settings = ctx.stage_config
        self.extract: dict[str, Any] = settings.get("extract") or {}
        self.train: dict[str, Any] = settings.get("train") or {}
        self.train_settings = TrainSettings.from_config(self.train)
        self.epochs = self.train_settings.epochs
        self.passes = int(self.extract.get("passes") or self.epochs)  # default: re-extracted every epoch
        if not 1 <= self.passes <= self.epochs:
            raise StageInputError(f"stages.extract.passes {self.passes}: expected 1 to stages.train.epochs ({self.epochs})")
        self.budget = sizing.parse_size(settings.get("disk_budget"))
        if not self.budget:
            raise StageInputError("the chunked route needs stages.extract.disk_budget (e.g. 500G)")
        self.preps: dict[str, Path] = {name: Path(p) for name, p in (ctx.config.get("prep_inputs") or {}).items()}
        if not self.preps:
            raise StageInputError("the chunked route got no prep outputs to read (config prep_inputs)")
        self.out, self.train_out = ctx.output, ctx.data / "train"
        # NOTE: the built-in stages, named or not, run in this process; any other command is opaque.
        self.resident_extract = self.extract.get("command") in (None, "", DEFAULT_COMMANDS["extract"])
        self.resident_train = (self.train.get("command") in (None, "", DEFAULT_COMMANDS["train"])
                               and self.train_settings.engine == "aerie")
        self.nproc = resident.ranks(self.train_settings, progress) if self.resident_train else 1
        self.batch = self.train_settings.batch_size * self.nproc  # records per optimizer step, over the ranks
        if self.resident_train:  # another count of ranks than the checkpoint's: refused before anything runs
            resident.check_world(self.train_out, self.nproc)

    # -- the plan of chunks ------------------------------------------------------

    @cached_property
    def extract_settings(self) -> ExtractSettings:
        """``stages.extract``, typed where the plan first needs it: the pass count is checked before."""
        return ExtractSettings.from_config(self.extract)

    def plan(self) -> dict[str, Any]:
        """{heldout, chunks: [{dataset: [indices]}], records, tokens}; made once and kept (chunks.json)."""
        fingerprint = self.fingerprint()
        saved = read_json(self.out / "chunks.json")
        if saved and saved.get("fingerprint") == fingerprint:
            return saved
        per_token = state_bytes(self.ctx.shared_config, self.extract_settings)
        records = [(name, i, n) for name, prep in self.preps.items() for i, n in enumerate(token_counts(prep))]
        held = (held_out(records, per_token, self.budget, self.extract_settings.shard_size, self.train_settings,
                         self.progress) if self.resident_train else set())  # a train command measures nothing here
        trained = [r for r in records if (r[0], r[1]) not in held]
        random.Random(SEED).shuffle(trained)  # every chunk a sample of every dataset
        room = self.budget - reserved(1 + bool(held)) - sum(record_size(n, per_token) for name, i, n in records if (name, i) in held)
        ranges = cut([record_size(n, per_token) for _, _, n in trained], room)
        result = {
            "fingerprint": fingerprint, "heldout": group([r for r in records if (r[0], r[1]) in held]),
            "chunks": [group(trained[start:end]) for start, end in ranges],
            "records": [end - start for start, end in ranges],
            "tokens": [sum(n for _, _, n in trained[start:end]) for start, end in ranges],
            "heldout_tokens": sum(n for name, i, n in records if (name, i) in held),
        }
        # NOTE: a new plan is a new run: forget where an older one stood and what it measured.
        for name in ("state.json", "timing.json", EVALUATIONS):
            (self.out / name).unlink(missing_ok=True)
        shutil.rmtree(self.out / "heldout", ignore_errors=True)
        write_json_atomic(self.out / "chunks.json", result)
        return result

    def fingerprint(self) -> str:
        """What the plan depends on; prep's counts, not its release, so a rerun of prep that
        gives the same records does not throw the run's progress away."""
        manifests = {name: read_json(prep / "manifest.json", {}) for name, prep in self.preps.items()}
        extract = self.extract_settings
        key = {
            "prep": {name: [m.get("kept"), (m.get("tokens") or {}).get("total")] for name, m in manifests.items()},
            "budget": self.budget, "layers": extract.layers, "captured": captured(self.ctx.shared_config, self.extract_settings.layers),
            "dtype": extract.dtype, "engine": extract.engine,
            "target": (self.ctx.shared_config.get("target") or {}).get("model"), "epochs": self.epochs,
            "passes": self.passes, "heldout": [self.resident_train, self.train_settings.eval_records,
                                               self.train_settings.eval_fraction, extract.shard_size],
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    # -- running -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.time()
        self.out.mkdir(parents=True, exist_ok=True)
        self.layout = self.plan()
        self.timing = {**TIMING, **read_json(self.out / "timing.json", {})}
        self.extractor = resident.Extractor(self.ctx, self.stage_settings(self.extract)) if self.resident_extract else None
        heldout_files = self.extract_heldout()
        self.trainer = resident.trainer(
            self.nproc, self.ctx, {**self.stage_settings(self.train), "eval_records": 0}, self.train_out, heldout_files,
            self.schedule(), self.out / EVALUATIONS, self.progress, {"preps": self.preps, "heldout": self.layout["heldout"]}
        ) if self.resident_train else None
        try:
            return self.passes_from(read_json(self.out / "state.json", START), started)
        finally:
            if self.trainer is not None:
                self.trainer.close()  # the ranks of a group leave with the job, however it ends

    def passes_from(self, state: dict[str, Any], started: float) -> dict[str, Any]:
        """Every pass and chunk from where `state` stands, then the run's manifest."""
        chunks = self.layout["chunks"]
        if state != START:
            self.progress.note(f"resuming at pass {state['pass'] + 1}, chunk {state['chunk'] + 1}, {state['phase']}")
        self.progress.expect(self.schedule(), by="step")
        self.progress.written(sum(self.layout["records"]) if state["pass"] > 0
                              else sum(self.layout["records"][k] for k in pass_order(len(chunks), 0)[: state["chunk"]]))
        self.progress.metrics(step=self.steps_before(state["pass"], state["chunk"]))
        self.estimate(state["pass"], state["chunk"])  # a resumed run: from what the earlier ones measured
        for index in range(state["pass"], self.passes):
            order = pass_order(len(chunks), index)
            for position in range(state["chunk"] if index == state["pass"] else 0, len(chunks)):
                phase = state["phase"] if (index, position) == (state["pass"], state["chunk"]) else "extract"
                self.visit(index, position, order[position], phase)
        for stale in self.out.glob("chunk-*"):
            shutil.rmtree(stale, ignore_errors=True)
        return self.finish(time.time() - started)

    def visit(self, index: int, position: int, k: int, phase: str) -> None:
        """Pass `index` over chunk `k` (the `position`-th of the pass): extract unless done, train, delete."""
        chunks = self.layout["chunks"]
        where = f"pass {index + 1}/{self.passes}, chunk {position + 1} of {len(chunks)}"
        self.progress.metrics(**{"pass": index + 1, "chunk": position + 1, "chunks": len(chunks)})
        directory = self.out / f"chunk-{k:05d}"
        records, tokens = self.layout["records"][k], self.layout["tokens"][k]
        # NOTE: a chunk without its extract manifest had a state file fail its check (remote.eagle3.shards):
        # extracted again (its bad shard only) before it is trained on.
        if phase == "extract" or not (directory / "extract" / "manifest.json").is_file():
            self.progress.note(f"{where}: extracting {records} records")
            began = time.monotonic()
            self.extract_chunk(directory, chunks[k], skips=index == 0)
            self.measured(extract_seconds=time.monotonic() - began, extracted_records=records, extracted_tokens=tokens)
            self.save(index, position, "train")
        epochs = epochs_per_pass(self.epochs, self.passes)[index]
        self.progress.note(f"{where}: training {epochs} epoch(s)")
        began = time.monotonic()
        self.train_chunk(directory, epochs, f"pass {index + 1}, chunk {k + 1}", seed=SEED + 1000 * index)
        steps = epochs * -(-records // self.batch)
        self.measured(train_seconds=time.monotonic() - began, trained_steps=steps, trained_tokens=epochs * tokens)
        # NOTE: the state moves on before the delete: a crash in between leaves a chunk
        # that the next run's extract of another chunk removes.
        self.save(index, position + 1, "extract")
        shutil.rmtree(directory, ignore_errors=True)
        if index == 0:
            self.progress.written(records)
        done = self.steps_before(index, position + 1)
        self.progress.metrics(step=done)
        self.measure_epochs(done)
        self.estimate(index, position + 1)

    def save(self, index: int, position: int, phase: str) -> None:
        write_json_atomic(self.out / "state.json", {"pass": index, "chunk": position, "phase": phase})

    def measured(self, **spent: float) -> None:
        """Add a phase's time and work to the run's measurements (kept across restarts for the ETA and the plan)."""
        for key, value in spent.items():
            self.timing[key] += value
        write_json_atomic(self.out / "timing.json", self.timing)

    # -- steps, epochs and the time left -------------------------------------------

    def steps_per_epoch(self) -> int:
        return steps_in(self.layout["records"], self.batch)

    def schedule(self) -> int:
        """Optimizer steps of the whole run: one learning-rate schedule over every pass."""
        return self.epochs * self.steps_per_epoch()

    def steps_before(self, index: int, position: int) -> int:
        return steps_before(self.layout["records"], self.batch, self.epochs, self.passes, index, position)

    def measure_epochs(self, steps: int) -> None:
        """The draft on the held-out records each time the steps taken pass a whole epoch's worth."""
        measured = self.trainer.measured() if self.trainer is not None and self.trainer.heldout else None
        if measured is not None and (epoch := steps // max(self.steps_per_epoch(), 1)) > measured:
            self.trainer.measure(epoch)

    def estimate(self, index: int, position: int) -> None:
        """Seconds left: the records still to extract and the steps still to train, each at its measured speed."""
        t = self.timing
        if not t["extracted_records"] or not t["trained_steps"]:
            return
        chunks = len(self.layout["chunks"])
        left = [(p, k) for p in range(index, self.passes) for k in pass_order(chunks, p)[(position if p == index else 0):]]
        records = sum(self.layout["records"][k] for _, k in left)
        steps = self.schedule() - self.steps_before(index, position)
        seconds = records * t["extract_seconds"] / t["extracted_records"] + steps * t["train_seconds"] / t["trained_steps"]
        self.progress.estimate(seconds)

    # -- the stages ----------------------------------------------------------------

    def stage_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in settings.items() if k != "command"}

    def extract_heldout(self) -> list[Path]:
        """The held-out records' states, extracted on the first run and kept; their files."""
        from remote.eagle3.shards import ShardStore

        selection = self.layout["heldout"]
        if not selection:
            return []
        directory = self.out / "heldout"
        if not (directory / "extract" / "manifest.json").is_file():
            count = sum(len(v) for v in selection.values())
            self.progress.note(f"extracting the {count} held-out records (kept for the draft's measurement)")
            began = time.monotonic()
            copy_records(self.preps, selection, directory / "prep")
            self.run_extract(directory, skips=True)
            self.measured(extract_seconds=time.monotonic() - began, extracted_records=count,
                          extracted_tokens=self.layout["heldout_tokens"])
        return ShardStore(directory / "extract").sample_files()

    def extract_chunk(self, directory: Path, chunk: dict[str, list[int]], skips: bool) -> None:
        for stale in self.out.glob("chunk-*"):
            if stale != directory:
                shutil.rmtree(stale, ignore_errors=True)
        copy_records(self.preps, chunk, directory / "prep")
        self.run_extract(directory, skips)

    def run_extract(self, directory: Path, skips: bool) -> None:
        if self.extractor is not None:
            loads = self.extractor.loads
            self.extractor.run(directory / "prep", directory / "extract", resident.Relay(self.progress, skips))
            self.measured(target_loads=self.extractor.loads - loads)
        else:
            self.stage("extract", self.stage_settings(self.extract), directory, [directory / "prep"], DRAFT)
            self.measured(target_loads=1)

    def train_chunk(self, directory: Path, epochs: int, name: str, seed: int) -> None:
        # `name` names this pass in the trainer's checkpoint: a stop after the trainer ended but before `save`
        # recorded it runs the same pass again, which the checkpoint finds complete (trains nothing), while the
        # next pass -- even over the same chunk -- is new data.
        inputs = [directory / "extract"]
        if self.trainer is not None:
            self.trainer.run(inputs, epochs, name, seed)
            return
        settings = {**self.stage_settings(self.train), "epochs": epochs, "schedule_steps": self.schedule(),
                    "eval_records": 0, "chunk_pass": name}
        self.stage("train", settings, self.ctx.data, inputs, DRAFT)

    def stage(self, name: str, settings: dict[str, Any], data: Path, inputs: list[Path], dataset: str) -> None:
        """Run a stage's configured command the way the supervisor would (`stage_contract`), in this job's log."""
        layout.stage_output(data, name).mkdir(parents=True, exist_ok=True)
        config = {"dataset": {}, "stage": settings, "inventory": self.ctx.shared_config, "inputs": [str(p) for p in inputs]}
        # NOTE: the sub-stage's progress is a file of this job's output, not this job's progress file.
        env = {**os.environ, **stage_variables(dataset, name, data, self.out / f".{name}.progress.json", config)}
        command = stage_command(name, (self.extract if name == "extract" else self.train).get("command"))
        process = subprocess.Popen(command, shell=True, env=env)
        while True:
            try:
                process.wait(timeout=1.0)  # not a sleep: record the end the moment it comes
                break
            except subprocess.TimeoutExpired:
                self.progress.beat()  # the sub-stage's progress is its own: this job is alive while it runs
        if process.returncode != 0:
            raise SystemExit(f"chunked: {name} exited with {process.returncode}; see the log above")

    def finish(self, seconds: float) -> dict[str, Any]:
        records = sum(self.layout["records"])
        trained = self.trainer.manifest(self.epochs, records, seconds) if self.trainer is not None else {}
        heldout = sum(len(v) for v in self.layout["heldout"].values())
        manifest = {"release": self.ctx.release, "route": "chunked", "chunks": len(self.layout["chunks"]),
                    "epochs": self.epochs, "passes": self.passes, "records": records, "heldout_records": heldout,
                    "disk_budget": self.budget, "draft": str(self.train_out / "draft"), "seconds": round(seconds, 3),
                    "tokens": sum(self.layout["tokens"]) + self.layout["heldout_tokens"],
                    **{k: round(v, 3) if isinstance(v, float) else v for k, v in self.timing.items()},
                    **{k: trained[k] for k in ("accept_length", "eval_accuracies", "epoch_history") if k in trained}}
        write_json_atomic(self.out / "manifest.json", manifest)
        accept = f", held-out accept length {manifest['accept_length']:.2f}" if manifest.get("accept_length") else ""
        self.progress.note(f"{manifest['chunks']} chunk(s) × {self.passes} pass(es), {self.epochs} epoch(s) trained"
                           f"{accept}; draft in {manifest['draft']}")
        self.progress.estimate(0.0)
        return manifest


def main() -> None:
    from remote import stages

    stages.main("chunked", lambda ctx, progress: Chunked(ctx, progress).run(), (StageInputError, sizing.PlanError))


if __name__ == "__main__":
    main()
