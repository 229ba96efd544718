"""The chunked route against the offline route on the same records: wall time and the draft's held-out accept length.

``run()`` builds the demo's wired tiny target offline (`remote.demo.tiny_model`,
``--recite``) and records that follow its greedy path (a random prompt, then
the recited answer, which is trained), split over three datasets, then runs
as the supervisor would:

- ``offline``: the extract stage per dataset, then the train stage over every dataset's states;
- ``chunked_passes_1``: `remote.orchestration.chunked` with a budget of about a third of the states, one
  forward pass of the target (each chunk trained every epoch while on disk: the default);
- ``chunked_passes_E``: the same, re-extracting every chunk every epoch (``passes = epochs``).

The routes run alternately, ``rounds`` times, so a busy machine slows each alike.
Reported per route: wall seconds, held-out accept length, the target's loads and
the tokens its forward passes read; ``*_time_ratio`` and ``*_accept_ratio``
are against the offline route of the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EPOCHS = 10
TRAIN = {"draft_vocab_size": 256, "epochs": EPOCHS, "learning_rate": 3e-3, "ttt_steps": 3, "eval_records": None,
         "eval_fraction": 0.05}
EXTRACT = {"layers": [0, 1, 2], "dtype": "float32"}


def settings(stage: str, values: dict[str, Any]) -> dict[str, Any]:
    """Every default of the inventory's schema under `values`, as the workstation sends them."""
    from local.inventory.fields import dump
    from local.inventory.stages import settings_class

    return {**dump(settings_class(stage)(), exclude={"command", "stall_after"}), **values}


def build_wired_target(target: Path) -> None:
    """The demo's wired target (and its tokenizer) in `target`."""
    from remote.demo import tiny_model
    from remote.demo.tiny_tokenizer import build_tokenizer

    build_tokenizer(target)
    tiny_model.main([str(target), "--tokenizer", str(target), "--recite", tiny_model.DEMO_RECITAL])


def greedy_records(target: Path, records: int, seed: int) -> list[dict[str, Any]]:
    """`records` prep records (ids r0, r1, ...): a random prompt, then an answer along the wired target's
    greedy path, which a draft can learn."""
    from remote.demo import tiny_model

    recite = json.loads((target / tiny_model.RECITAL_FILE).read_text())["ids"]
    vocab = tiny_model.tokenizer_vocab_size(target)
    following = tiny_model.successor(recite, vocab)
    rng = random.Random(seed)
    rows = []
    for i in range(records):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(8, 40))]
        answer = [following[prompt[-1]]]
        for _ in range(rng.randint(16, 80)):
            answer.append(following[answer[-1]])
        rows.append({"id": f"r{i}", "input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer)})
    return rows


def build(work: Path, records: int, seed: int = 0) -> tuple[Path, list[str]]:
    """The wired target and three datasets' prep outputs of `records` records in all."""
    target = work / "target"
    build_wired_target(target)
    names = ["A1", "B2", "C3"]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for i, row in enumerate(greedy_records(target, records, seed)):
        rows[names[i % 3]].append(row)
    for name, chunk in rows.items():
        write_prep(work / "root" / "data" / name / "prep", chunk)
    return target, names


def write_prep(prep: Path, records: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    prep.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [r["id"] for r in records],
                             "input_ids": pa.array([r["input_ids"] for r in records], pa.list_(pa.int32())),
                             "loss_mask": pa.array([r["loss_mask"] for r in records], pa.list_(pa.int8()))}),
                   prep / "tokens-00000.parquet")
    tokens = sum(len(r["input_ids"]) for r in records)
    (prep / "manifest.json").write_text(json.dumps({"release": "bench", "kept": len(records),
                                                    "tokens": {"total": tokens, "max": max(len(r["input_ids"]) for r in records)}}))


def stage(root: Path, dataset: str, name: str, config: dict[str, Any], module: str) -> None:
    """One stage as the supervisor runs it: its environment, its own process."""
    output = root / "data" / dataset / name
    output.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AERIE_")}, "AERIE_ROOT": str(root),
           "AERIE_RELEASE": "bench", "AERIE_DATASET": dataset, "AERIE_STAGE": name, "AERIE_OUTPUT": str(output),
           "AERIE_DATA": str(output.parent), "AERIE_PROGRESS": str(output / ".progress.json"),
           "AERIE_CONFIG": json.dumps(config), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", module], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def offline(root: Path, target: Path, names: list[str]) -> dict[str, Any]:
    shared = {"target": {"model": str(target)}}
    started = time.perf_counter()
    for name in names:
        stage(root, name, "extract", {"dataset": {}, "stage": settings("extract", EXTRACT), "inventory": shared}, "remote.stages.extract")
    inputs = [str(root / "data" / name / "extract") for name in names]
    stage(root, "draft", "train", {"dataset": {}, "stage": settings("train", TRAIN), "inventory": shared, "inputs": inputs},
          "remote.stages.train")
    seconds = time.perf_counter() - started
    manifest = json.loads((root / "data" / "draft" / "train" / "manifest.json").read_text())
    tokens = sum(json.loads((root / "data" / n / "prep" / "manifest.json").read_text())["tokens"]["total"] for n in names)
    return {"seconds": round(seconds, 1), "accept_length": manifest["accept_length"], "target_loads": len(names),
            "forward_tokens": tokens}


def chunked_route(root: Path, target: Path, names: list[str], passes: int) -> dict[str, Any]:
    from remote.orchestration import chunked
    from remote.sizing import bytes_per_token, stored_bytes

    tokens = sum(json.loads((root / "data" / n / "prep" / "manifest.json").read_text())["tokens"]["total"] for n in names)
    records = sum(json.loads((root / "data" / n / "prep" / "manifest.json").read_text())["kept"] for n in names)
    states = stored_bytes(tokens, records, bytes_per_token(EXTRACT["layers"], 64, EXTRACT["dtype"]))
    budget = chunked.reserved(2) + states // 3
    config = {"dataset": {}, "inventory": {"target": {"model": str(target)}},
              "prep_inputs": {n: str(root / "data" / n / "prep") for n in names},
              "stage": {"disk_budget": budget, "extract": settings("extract", {**EXTRACT, "passes": passes}),
                        "train": settings("train", TRAIN)}}
    started = time.perf_counter()
    stage(root, "draft", "chunked", config, "remote.orchestration.chunked")
    seconds = time.perf_counter() - started
    manifest = json.loads((root / "data" / "draft" / "chunked" / "manifest.json").read_text())
    return {"seconds": round(seconds, 1), "accept_length": manifest["accept_length"], "chunks": manifest["chunks"],
            "target_loads": manifest["target_loads"], "forward_tokens": manifest["extracted_tokens"],
            "budget_share": round(budget / states, 3)}


def run(records: int = 150, rounds: int = 1) -> dict[str, Any]:
    results: dict[str, Any] = {"records": records, "epochs": EPOCHS}
    with tempfile.TemporaryDirectory(prefix="aerie-bench-chunked-") as tmp:
        work = Path(tmp)
        target, names = build(work, records)
        prep = work / "root" / "data"
        for number in range(1, rounds + 1):
            measured: dict[str, Any] = {}
            for label, go in (("offline", lambda root: offline(root, target, names)),
                              ("chunked_passes_1", lambda root: chunked_route(root, target, names, 1)),
                              (f"chunked_passes_{EPOCHS}", lambda root: chunked_route(root, target, names, EPOCHS))):
                root = work / label
                shutil.rmtree(root, ignore_errors=True)
                for name in names:
                    shutil.copytree(prep / name / "prep", root / "data" / name / "prep")
                measured[label] = go(root)
            base = measured["offline"]
            for label, figures in measured.items():
                if label != "offline":
                    figures["time_ratio"] = round(figures["seconds"] / base["seconds"], 2)
                    figures["accept_ratio"] = round(figures["accept_length"] / base["accept_length"], 3)
            results[f"round_{number}"] = measured
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(run(args.records, args.rounds), indent=2))
