"""The whole DAG through the real tasks, with the real stages on the tiny model, on both backends.

What `inv demo` does, on an inventory of the test's own: `inv deploy`, then
`inv run --follow` over one native and one prompts dataset, with
`transformers serve` of the tiny target as the managed inference server on a
free loopback port. Kept small (a few records, 24-token answers, one epoch) so
each backend finishes in about two minutes on two cores.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, Bench, copy_checkout

pytestmark = pytest.mark.e2e

SAMPLES = REPO / "inventories" / "samples"
DATASETS = {"chat": ("sharegpt.jsonl", "native"), "asks": ("prompts_alpaca.jsonl", "prompts")}
EXPECTED_JOBS = {"chat/prep", "chat/extract", "asks/prep", "asks/infer", "asks/tokenize", "asks/extract",
                 "draft/train", "pipeline/run"}


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer and random Llama, built offline the way `inv demo` builds them (`remote assets`)."""
    from remote import tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("demo-target")
    tiny_tokenizer.build_tokenizer(path)
    tiny_model.main([str(path), "--tokenizer", str(path)])
    return path


@pytest.fixture(params=["local", "ssh"])
def bench(request: pytest.FixtureRequest, tmp_path: Path) -> Bench:
    sshd = request.getfixturevalue("sshd") if request.param == "ssh" else None
    # NOTE: the host's Python is this virtualenv's on both backends: the stages need torch and transformers.
    return Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", request.param, sshd)


def demo_inventory(bench: Bench, model: Path, port: int) -> None:
    """Like inventories/local.yaml, with the test's own root, model and port, and less work."""
    stages = {
        "prep": {"max_length": 512},
        "infer": {
            "server_command": (f"{{python}} -m transformers.cli.transformers serve {model} --host 127.0.0.1 "
                               f"--port {port} --device cpu --dtype float32 --log-level warning"),
            "server_url": f"http://127.0.0.1:{port}/v1",
            "server_env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
            "server_start_timeout": 240,
            "model": str(model),
            "concurrency": 4,
            "max_tokens": 24,
        },
        "extract": {"layers": [0, 1, 2], "dtype": "float32"},
        "train": {"draft_vocab_size": 256, "epochs": 1},
    }
    datasets = {name: {"source": str(SAMPLES / file), "kind": kind, "sample": str(SAMPLES / file)}
                for name, (file, kind) in DATASETS.items()}
    bench.inventory(datasets, stages, target={"tokenizer": str(model), "model": str(model)})


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_run_takes_both_kinds_of_dataset_through_every_stage_to_a_draft_checkpoint(
    bench: Bench, tiny_target_dir: Path, free_port: int
) -> None:
    demo_inventory(bench, tiny_target_dir, free_port)
    bench.inv("deploy")
    followed = bench.inv("run", "--follow", check=False, timeout=300)
    assert "pipeline started" in followed.stdout and "7 jobs" in followed.stdout, followed.stdout + followed.stderr

    jobs = bench.status()
    logs = "" if all(j["state"] == "succeeded" for j in jobs.values()) else bench.inv(
        "logs", "pipeline", "--stage", "run", "-n", "40", check=False).stdout
    assert {key: job["state"] for key, job in jobs.items()} == dict.fromkeys(EXPECTED_JOBS, "succeeded"), (jobs, logs)
    assert followed.returncode == 0, followed.stderr
    assert all(job["records"] > 0 for job in jobs.values()), jobs
    assert jobs["chat/prep"]["records"] == 3 and jobs["asks/prep"]["records"] == 3
    infer = jobs["asks/infer"]
    # NOTE: a random model sampling 24 tokens may, rarely, say nothing: an empty answer is skipped, not lost.
    assert infer["records"] + infer["skipped"] == 3, infer  # every prompt answered or skipped, once
    assert jobs["asks/tokenize"]["records"] == infer["records"]

    data = bench.root / "data"
    answers = [json.loads(line) for line in (data / "asks" / "infer" / "conversations.jsonl").read_text().splitlines()]
    assert len(answers) == infer["records"] and len({a["id"] for a in answers}) == len(answers)
    assert all(a["conversations"][-1]["role"] == "assistant" and a["conversations"][-1]["content"] for a in answers)
    draft = json.loads((data / "draft" / "train" / "draft" / "config.json").read_text())
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]
    assert draft["draft_vocab_size"] == 256
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert (data / "draft" / "train" / "draft" / "model.safetensors").stat().st_size > 0
    assert not is_listening(free_port), "the inference server outlived the pipeline"
