"""Prep end to end through the real tasks: `inv validate` → `inv deploy` → `inv launch --stage prep` → `inv status`.

Over the loopback sshd (prep runs on the host alike on either backend; the local backend's
transport is test_control_plane.py's), with the real
prep stage and the tiny Kimi-style tokenizer, over the sample files shipped in
inventories/samples/: the records that `inv status` shows must be the rows of
those files, and the outputs must be on the host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.checkout import REPO, Bench, wait_for
from tests.prep_fixtures import tiny_tokenizer_dir  # noqa: F401 (a session fixture, built once)

pytestmark = [pytest.mark.e2e, pytest.mark.backends("ssh")]
# NOTE: the host's Python is this virtualenv's: prep needs transformers.

SAMPLES = REPO / "inventories" / "samples"
UNKNOWN_ROLES = REPO / "tests" / "fixtures" / "prep" / "unknown_roles.jsonl"
#: dataset name -> (sample file, kind): both kinds, agent trajectories and SWE-agent included.
GOOD = {
    "sharegpt": ("sharegpt.jsonl", "native"),
    "agent": ("agent_trajectory.jsonl", "native"),
    "swe": ("swe_agent.jsonl", "native"),
    "tools": ("openai_tools.jsonl", "native"),
    "alpaca": ("prompts_alpaca.jsonl", "prompts"),
    "question": ("prompts_question.jsonl", "prompts"),
}
TERMINAL = {"succeeded", "empty", "failed", "died", "stopped"}


def rows_of(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def dataset(path: Path, kind: str, sample: Path | None = None) -> dict[str, Any]:
    """An inventory entry whose `source` (read on the host) and `sample` (read by validate) are absolute."""
    return {"source": str(path), "kind": kind, "sample": str(sample or path)}


def good_datasets() -> dict[str, dict[str, Any]]:
    return {name: dataset(SAMPLES / file, kind) for name, (file, kind) in GOOD.items()}


def prep_inventory(bench: Bench, tokenizer: Path, datasets: dict[str, dict[str, Any]]) -> None:
    bench.inventory(datasets, {"prep": {"max_length": 1024}}, target={"tokenizer": str(tokenizer)})


def wait_prep(bench: Bench, names: list[str], timeout: float = 180) -> dict[str, dict[str, Any]]:
    """Poll until every named prep job has ended; what `inv status --json` then says."""
    def ended() -> bool:
        jobs = bench.poll()
        return all(jobs.get(f"{name}/prep", {}).get("state") in TERMINAL for name in names)

    wait_for(ended, timeout, f"the prep jobs of {names} to end")
    return bench.status()


def test_unknown_roles_stop_validate_and_deploy_then_prep_runs_every_sample_on_the_host(
    bench: Bench, tiny_tokenizer_dir: Path  # noqa: F811
) -> None:
    datasets = good_datasets() | {"narrated": dataset(UNKNOWN_ROLES, "native")}
    prep_inventory(bench, tiny_tokenizer_dir, datasets)

    refused = bench.inv("validate", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error = " ".join(refused.stderr.split())
    assert "datasets that would give zero records: narrated (unknown role 'narrator'" in error
    assert "Traceback" not in refused.stderr
    assert not any(name in error for name in GOOD), "a good dataset was reported as failing"

    not_deployed = bench.inv("deploy", check=False)
    assert not_deployed.returncode == 2
    assert "narrated (unknown role 'narrator'" in " ".join(not_deployed.stderr.split())
    assert not (bench.root / "current").exists()

    del datasets["narrated"]
    prep_inventory(bench, tiny_tokenizer_dir, datasets)
    validated = bench.inv("validate", "--json")
    entries = {e["dataset"]: e for e in json.loads(validated.stdout)}
    expected = {name: rows_of(SAMPLES / file) for name, (file, _) in GOOD.items()}
    assert {name: e["kept"] for name, e in entries.items()} == expected

    deployed = bench.inv("deploy")
    assert "Deployed release" in deployed.stdout
    release = (bench.root / "current").resolve().name
    launched = bench.inv("launch", "--stage", "prep")
    assert sorted(line.split()[1] for line in launched.stdout.splitlines() if line.startswith("launched")) == sorted(
        f"{name}/prep" for name in GOOD)

    jobs = wait_prep(bench, list(GOOD))
    assert {key: job["state"] for key, job in jobs.items()} == {f"{name}/prep": "succeeded" for name in GOOD}, jobs
    assert {name: jobs[f"{name}/prep"]["records"] for name in GOOD} == expected
    assert all(jobs[f"{name}/prep"]["skipped"] == 0 for name in GOOD)
    assert all(jobs[f"{name}/prep"]["release"] == release for name in GOOD)
    assert bench.inv("status").returncode == 0

    import pyarrow.parquet as pq

    for name, (file, kind) in GOOD.items():
        out = bench.root / "data" / name / "prep"
        manifest = json.loads((out / "manifest.json").read_text())
        assert (manifest["kept"], manifest["release"], manifest["kind"]) == (expected[name], release, kind), name
        if kind == "native":
            table = pq.read_table(out / "tokens-00000.parquet")
            assert table.num_rows == expected[name], name
            # Every record trains on something (the assistant's turns) and not on everything (the prompt).
            for mask in table.column("loss_mask").to_pylist():
                assert 0 < sum(mask) < len(mask), name
        else:
            prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
            assert len(prompts) == expected[name], name
            assert all(p["conversations"][-1]["role"] == "user" for p in prompts), name
            assert not (out / "tokens-00000.parquet").exists()


def test_a_host_source_that_yields_no_records_is_reported_with_its_skip_reasons(
    bench: Bench, tiny_tokenizer_dir: Path  # noqa: F811
) -> None:
    # The sample is good, so validate and deploy pass; only the host's source is all unknown roles.
    prep_inventory(bench, tiny_tokenizer_dir, {
        "good": dataset(SAMPLES / "sharegpt.jsonl", "native"),
        "hollow": dataset(UNKNOWN_ROLES, "native", sample=SAMPLES / "sharegpt.jsonl"),
    })
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    jobs = wait_prep(bench, ["good", "hollow"])

    assert jobs["good/prep"]["state"] == "succeeded" and jobs["good/prep"]["records"] == 3
    hollow = jobs["hollow/prep"]
    assert hollow["state"] in {"empty", "failed"}, hollow
    assert hollow["records"] == 0 and hollow["skipped"] == 3, hollow
    assert hollow["skip_reasons"] == {"unknown role 'narrator'": 2, "unknown role 'critic'": 1}, hollow
    assert "no records kept" in (hollow["message"] or "") or hollow["state"] == "empty", hollow
    assert not (bench.root / "data" / "hollow" / "prep" / "manifest.json").exists()

    table = bench.inv("status", check=False)
    assert table.returncode == 1
    row = next(line for line in table.stdout.splitlines() if "hollow" in line)
    assert hollow["state"] in row and "unknown role 'narrator'" in row
