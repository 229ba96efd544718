"""Shared pieces of the extract and train tests: a tiny target, prep output, stage runs.

Import the fixtures you use into the test module (``from tests.pipeline_fixtures
import tiny_target``); pytest finds them there. Nothing here downloads anything.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.stage_settings import complete
from tests.helpers.session import built_once

REPO = Path(__file__).resolve().parent.parent
#: The tiny target's layers: 4 decoder layers, so valid aux ids are 0..2.
TINY_LAYERS = [0, 1, 2]


@pytest.fixture(scope="session")
def tiny_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (hidden 64, 4 layers) with the Kimi-style tiny tokenizer, built once."""
    from remote.demo.tiny_model import build_model, tokenizer_vocab_size
    from remote.demo.tiny_tokenizer import build_tokenizer

    def build() -> Path:
        path = tmp_path_factory.mktemp("tiny-target")
        build_tokenizer(path)
        build_model(path, tokenizer_vocab_size(path))
        return path

    return built_once(request, build)


@pytest.fixture(scope="session")
def demo_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer and reciting Llama, built offline the way `inv demo` builds them (`remote assets`)."""
    from remote.demo import tiny_model
    from remote.demo.tiny_tokenizer import build_tokenizer

    def build() -> Path:
        path = tmp_path_factory.mktemp("demo-target")
        build_tokenizer(path)
        tiny_model.main([str(path), "--tokenizer", str(path), "--recite", tiny_model.DEMO_RECITAL])
        return path

    return built_once(request, build)


def vocab_size(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


def make_records(count: int, vocab: int, seed: int = 0, length: tuple[int, int] = (12, 40)) -> list[dict[str, Any]]:
    """Random token records whose second half is trained, like a prompt followed by an answer."""
    rng = random.Random(seed)
    # NOTE: a small pool of frequent tokens, so the reduced draft vocabulary has something to pick.
    common = rng.sample(range(vocab), 48)
    records = []
    for i in range(count):
        n = rng.randint(*length)
        ids = [rng.choice(common) if rng.random() < 0.8 else rng.randrange(vocab) for _ in range(n)]
        cut = n // 2
        records.append({"id": f"r{i:04d}", "input_ids": ids, "loss_mask": [0] * cut + [1] * (n - cut)})
    return records


def write_prep(data_dir: Path, records: list[dict[str, Any]], release: str | None = "rel-1", per_file: int = 7) -> Path:
    """Prep's output for `records`: tokens-*.parquet shards and (unless release is None) a manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    prep = data_dir / "prep"
    prep.mkdir(parents=True, exist_ok=True)
    for n, start in enumerate(range(0, len(records), per_file)):
        chunk = records[start : start + per_file]
        table = pa.table(
            {
                "id": pa.array([r["id"] for r in chunk], pa.string()),
                "input_ids": pa.array([r["input_ids"] for r in chunk], pa.list_(pa.int32())),
                "loss_mask": pa.array([r["loss_mask"] for r in chunk], pa.list_(pa.int8())),
            }
        )
        pq.write_table(table, prep / f"tokens-{n:05d}.parquet")
    manifest: dict[str, Any] = {"kept": len(records)}
    if release is not None:
        manifest["release"] = release
    (prep / "manifest.json").write_text(json.dumps(manifest))
    return prep


def stage_env(root: Path, stage: str, stage_config: dict[str, Any], shared: dict[str, Any], dataset: str = "A1") -> dict[str, str]:
    """The environment the supervisor gives a stage (see `remote.stages`)."""
    data = root / "data" / dataset
    output = data / stage
    output.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AERIE_")}
    env.update(
        {
            "AERIE_ROOT": str(root),
            "AERIE_RELEASE": "rel-test",
            "AERIE_DATASET": dataset,
            "AERIE_STAGE": stage,
            "AERIE_SOURCE": "unused",
            "AERIE_KIND": "native",
            "AERIE_OUTPUT": str(output),
            "AERIE_DATA": str(data),
            "AERIE_PROGRESS": str(root / f"{dataset}-{stage}.progress.json"),
            "AERIE_CONFIG": json.dumps({"dataset": {}, "stage": complete(stage, stage_config), "inventory": shared}),
            "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",  # tiny tensors: threads only contend on a busy 2-core runner
        }
    )
    return env


def run_stage(stage: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python -m remote.stages.<stage>`` the way the supervisor does (from the release directory)."""
    return subprocess.run(
        [sys.executable, "-m", f"remote.stages.{stage}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: One Python running a stage's entry point once per environment, as the supervisor would run it in each:
#: the stage's imports paid once.
EACH_ENV = """
import json, os, sys
stage = __import__(f"remote.stages.{sys.argv[1]}", fromlist=["main"])
codes = []
for env in json.load(sys.stdin):
    os.environ.clear()
    os.environ.update(env)
    try:
        stage.main()
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code if isinstance(exc.code, int) else 1)
print(json.dumps(codes))
"""


def run_stage_each(stage: str, envs: list[dict[str, str]], timeout: float = 600) -> list[int]:
    """``remote.stages.<stage>`` run once per environment of `envs`, in turn, in one process; their exit codes."""
    done = subprocess.run([sys.executable, "-c", EACH_ENV, stage], cwd=REPO, env=envs[0], input=json.dumps(envs),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def read_progress(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(Path(env["AERIE_PROGRESS"]).read_text())


def context(env: dict[str, str]):
    """The `StageContext` a stage would read from `env`, for in-process runs."""
    from remote.stages import StageContext

    return StageContext.from_env(env)


#: Extract settings the tests use: float32 so stored states equal a direct forward pass exactly.
EXTRACT_SETTINGS = {"layers": TINY_LAYERS, "dtype": "float32", "batch_size": 3, "shard_size": 4}
RECORDS = 10


@pytest.fixture(scope="session")
def extracted(request: pytest.FixtureRequest, tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The extract stage, run once as a subprocess over 10 prep records: its root, env, records and result."""
    def build() -> dict[str, Any]:
        root = tmp_path_factory.mktemp("aerie-root")
        records = make_records(RECORDS, vocab_size(tiny_target))
        write_prep(root / "data" / "A1", records)
        env = stage_env(root, "extract", EXTRACT_SETTINGS, {"target": {"model": str(tiny_target)}})
        result = run_stage("extract", env)
        return {"root": root, "env": env, "records": records, "result": result}

    return built_once(request, build)


@pytest.fixture(scope="session")
def kimi_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Kimi-K2.5-shaped target (multimodal wrapper around a DeepseekV3 MoE with MLA), built once."""
    from tests.tiny_kimi import build_kimi_model
    from remote.demo.tiny_model import copy_tokenizer, tokenizer_vocab_size
    from remote.demo.tiny_tokenizer import build_tokenizer

    def build() -> Path:
        tokenizer = tmp_path_factory.mktemp("kimi-tokenizer")
        build_tokenizer(tokenizer)
        path = build_kimi_model(tmp_path_factory.mktemp("kimi-target"), tokenizer_vocab_size(tokenizer))
        copy_tokenizer(tokenizer, path)
        return path

    return built_once(request, build)


def text_vocab_size(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return (config.get("text_config") or config)["vocab_size"]


def extract_again(states: Path) -> Path:
    """`states` (a copy of extract's output) with its first shard written again in place: other hidden states
    under the same names, as extract writes new answers after an edit to stages.infer."""
    from remote.eagle3.shards import ShardStore, load_sample

    store = ShardStore(states)
    index = store.complete_shards()[0]
    names = store.meta(index)["files"]
    samples = [load_sample(store.shard_dir(index) / name) for name in names]
    shutil.rmtree(store.shard_dir(index))
    writer = store.writer(index)
    for name, sample in zip(names, samples):
        writer.add(int(name[len("data_"):-len(".ckpt")]), {**sample, "hidden_state": sample["hidden_state"] + 0.5})
    writer.commit()
    return states


def crash_after(monkeypatch: pytest.MonkeyPatch, calls: int) -> None:
    """Make the training step raise after `calls` steps, as a kill mid-epoch would end the run."""
    from remote.eagle3 import trainer

    real, seen = trainer.ttt_loss, []

    def ttt_loss(*args, **kwargs):
        if len(seen) == calls:
            raise KeyboardInterrupt("killed")
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "ttt_loss", ttt_loss)
