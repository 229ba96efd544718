"""aerie's EAGLE-3 trainer against SpecForge 0.2.0's: held-out accept length and CPU seconds, same target, states and split.

``run()`` (``inv bench --only train``) builds the demo's wired tiny target offline
(`remote.demo.tiny_model`, ``--recite``) and ``records`` records that follow its greedy path (a
random prompt, then the recited answer, which is trained), per data seed; extracts their states
once (bfloat16, what SpecForge trains on); then trains, each as the supervisor runs the train stage:

- ``aerie``: ``engine: aerie``, which holds out about ``eval_fraction`` of the records by the hash of
  their file names (`remote.eagle3.heldout.split`);
- ``specforge``: ``engine: specforge``, the real SpecForge 0.2.0 (on a CPU through
  `benchmarks.harness.specforge_cpu`), on a copy of the same states without those held-out
  records, then its export to SGLang's layout.

Both drafts are then measured by the same code (`remote.eagle3.acceptance.evaluate`) on the same
held-out records: the expected accept length of a chain of ``ttt_steps`` (what they trained for)
and of 7 steps (run for longer than trained). Reported per seed: CPU seconds (the stage and
everything it ran), wall seconds and both accept lengths; ``cpu_ratio`` is SpecForge's CPU
seconds over aerie's, ``accept_ratio`` SpecForge's accept length over aerie's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_chunked import REPO, build_wired_target, greedy_records, settings, write_prep

EPOCHS = 10
TRAIN = {"draft_vocab_size": 256, "epochs": EPOCHS, "learning_rate": 3e-3, "ttt_steps": 3, "eval_records": None,
         "eval_fraction": 0.05}
EXTRACT = {"layers": [0, 1, 2], "dtype": "bfloat16"}
LONGER = 7  # draft steps of the second measurement: more than the draft was trained for


def build(work: Path, records: int, seed: int) -> Path:
    """The wired target (the demo's) and one dataset of `records` records following its greedy path."""
    target = work / "target"
    if not (target / "config.json").is_file():
        build_wired_target(target)
    write_prep(work / f"seed-{seed}" / "data" / "A1" / "prep", greedy_records(target, records, seed))
    return target


def stage(root: Path, dataset: str, name: str, config: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, float]:
    """One stage in its own process, as the supervisor runs it: wall seconds and the CPU seconds of it and its children."""
    output = root / "data" / dataset / name
    output.mkdir(parents=True, exist_ok=True)
    variables = {**{k: v for k, v in os.environ.items() if not k.startswith("AERIE_")}, **(env or {}),
                 "AERIE_ROOT": str(root), "AERIE_RELEASE": "bench", "AERIE_DATASET": dataset, "AERIE_STAGE": name,
                 "AERIE_OUTPUT": str(output), "AERIE_DATA": str(output.parent),
                 "AERIE_PROGRESS": str(output / ".progress.json"), "AERIE_CONFIG": json.dumps(config),
                 "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run([sys.executable, "-m", f"remote.stages.{name}"], cwd=REPO, env=variables,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{name} ({dataset}) failed: {result.stderr.strip().splitlines()[-1:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_seconds": round(time.perf_counter() - started, 1),
            "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)}


def without(extract: Path, held: set[Path], out: Path) -> Path:
    """A copy of extract's output (hard links) without the `held` records: what SpecForge trains on."""
    from remote.eagle3.shards import ShardStore

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy2(extract / "manifest.json", out / "manifest.json")
    store = ShardStore(extract)
    for index in store.complete_shards():
        source, target = store.shard_dir(index), out / store.shard_dir(index).name
        target.mkdir()
        for path in source.iterdir():
            if path not in held:
                os.link(path, target / path.name)
    return out


def specforge_on_path(work: Path) -> dict[str, str]:
    """The environment with a `specforge` that is the real SpecForge on this CPU (`benchmarks.harness.specforge_cpu`)."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "specforge"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'benchmarks' / 'harness' / 'specforge_cpu.py'} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


def draft_file(work: Path, target: Path) -> Path:
    """The draft config SpecForge is given (like its configs/*-eagle3.json: shaped after the target)."""
    from remote.eagle3 import draft_config

    path = work / "tiny-eagle3.json"
    config = json.loads((target / "config.json").read_text())
    path.write_text(json.dumps({k: v for k, v in draft_config.build(config, EXTRACT["layers"], TRAIN["draft_vocab_size"]).items()
                                if k != "eagle_config"}))
    return path


def accept_lengths(draft_dir: Path, target: Path, heldout: list[Path]) -> dict[str, float]:
    """The draft's expected accept length on `heldout`, at the trained chain's length and at `LONGER` steps."""
    from remote.eagle3 import checkpoint
    from remote.eagle3.acceptance import evaluate
    from remote.eagle3.shards import load_sample
    from remote.eagle3.target import read_embed_and_head, read_shape

    embed, head = read_embed_and_head(read_shape(target))
    draft = checkpoint.load(draft_dir, embed)
    return {f"accept_length_{steps}": round(evaluate(draft, head, heldout, load_sample, steps, 2048).accept_length, 3)
            for steps in (TRAIN["ttt_steps"], LONGER)}


def one_seed(work: Path, records: int, seed: int) -> dict[str, Any]:
    """Both engines on one data seed's records."""
    from remote.eagle3 import heldout
    from remote.eagle3.shards import ShardStore

    target = build(work, records, seed)
    root = work / f"seed-{seed}"
    shared = {"target": {"model": str(target)}}
    stage(root, "A1", "extract", {"dataset": {}, "stage": settings("extract", EXTRACT), "inventory": shared})
    extract = root / "data" / "A1" / "extract"
    trained, held = heldout.split(ShardStore(extract).sample_files(), TRAIN["eval_records"], TRAIN["eval_fraction"])
    figures: dict[str, Any] = {"records": records, "trained": len(trained), "heldout": len(held)}
    for engine, inputs, env in (("aerie", extract, None),
                                ("specforge", without(extract, set(held), root / "sf-extract"), specforge_on_path(work))):
        # NOTE: SpecForge's copy already lacks the held-out records: nothing more to hold out of it.
        extra = {"engine": engine, "draft_config": str(draft_file(work, target)), "eval_records": 0} \
            if engine == "specforge" else {}
        config = {"dataset": {}, "stage": settings("train", {**TRAIN, **extra}), "inventory": shared, "inputs": [str(inputs)]}
        figures[engine] = stage(root, engine, "train", config, env)
        figures[engine].update(accept_lengths(root / "data" / engine / "train" / "draft", target, held))
    aerie, specforge = figures["aerie"], figures["specforge"]
    figures["cpu_ratio"] = round(specforge["cpu_seconds"] / aerie["cpu_seconds"], 2)
    figures["accept_ratio"] = round(specforge["accept_length_3"] / aerie["accept_length_3"], 3)
    return figures


def run(records: int = 180, seeds: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    results: dict[str, Any] = {"epochs": EPOCHS, "ttt_steps": TRAIN["ttt_steps"], "longer_steps": LONGER}
    with tempfile.TemporaryDirectory(prefix="aerie-bench-train-") as tmp:
        for seed in seeds:
            results[f"seed_{seed}"] = one_seed(Path(tmp), records, seed)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=180)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    print(json.dumps(run(args.records, tuple(args.seeds)), indent=2))
