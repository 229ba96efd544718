"""The demo's target reciting its own answers: records as it answers, their hidden states extracted once a
session, and a train stage's environment over them with the demo's train settings (inventories/local.yaml)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from tests.helpers.session import built_once
from tests.pipeline_fixtures import EXTRACT_SETTINGS, REPO, run_stage, stage_env, vocab_size, write_prep


DEMO_TRAIN = yaml.safe_load((REPO / "inventories" / "local.yaml").read_text())["stages"]["train"]


#: The demo's settings, with enough held-out records to measure on.
SETTINGS = {**DEMO_TRAIN, "eval_records": 4}


def recital_records(target: Path, count: int = 14, seed: int = 0) -> list[dict]:
    """Records as the demo's target answers: a prompt of any tokens, then its greedy answer (the recital, looped)."""
    recite = json.loads((target / "recital.json").read_text())["ids"]
    rng, vocab = random.Random(seed), vocab_size(target)
    records = []
    for i in range(count):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 10))]
        answer = (recite * 8)[:rng.randint(20, 36)]  # after a token it does not recite, the recital from its start
        records.append({"id": f"r{i:04d}", "input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer)})
    return records


@pytest.fixture(scope="session")
def demo_states(request: pytest.FixtureRequest, demo_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """extract over the demo target's own answers (float32, layers 0..2), once a session; each test trains
    under a dataset name of its own beside it."""
    def build() -> dict:
        root = tmp_path_factory.mktemp("init-draft-root")
        write_prep(root / "data" / "A1", recital_records(demo_target))
        env = stage_env(root, "extract", EXTRACT_SETTINGS, {"target": {"model": str(demo_target)}})
        result = run_stage("extract", env)
        assert result.returncode == 0, result.stderr
        return {"root": root, "extract": env["AERIE_OUTPUT"], "target": demo_target}

    return built_once(request, build)


def train_env(states: dict, name: str, **settings) -> dict:
    env = stage_env(states["root"], "train", {**SETTINGS, **settings}, {"target": {"model": str(states["target"])}}, dataset=name)
    env["AERIE_CONFIG"] = json.dumps({**json.loads(env["AERIE_CONFIG"]), "inputs": [states["extract"]]})
    return env
