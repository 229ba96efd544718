"""`inv plan`: tokens, the hidden states' size at Kimi-K2.5's shape, the disk, and the route that fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote import sizing
from remote.vocabulary import plan_texts
from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout
from tests.helpers.plans import KIMI_BYTES_PER_TOKEN, kimi_config, prep_manifest, request


def test_the_plan_counts_prep_s_tokens_and_sizes_kimi_s_states(tmp_path: Path) -> None:
    model = kimi_config(tmp_path / "kimi")
    prep_manifest(tmp_path, "A1", 40_000, 120_000_000)
    prep_manifest(tmp_path, "B5", 48_000, 144_000_000, stage="tokenize")  # a prompts dataset's answers

    result = sizing.plan(request(tmp_path, model, [{"dataset": "A1"}, {"dataset": "B5"}]))

    assert result["datasets"] == [
        {"dataset": "A1", "records": 40_000, "tokens": 120_000_000, "basis": "prep"},
        {"dataset": "B5", "records": 48_000, "tokens": 144_000_000, "basis": "prep"},
    ]
    assert result["tokens"] == 264_000_000
    assert result["bytes_per_token"] == KIMI_BYTES_PER_TOKEN
    assert result["offline_bytes"] == 264_000_000 * KIMI_BYTES_PER_TOKEN  # 15.1 TB: no GPU container has that
    assert result["free_bytes"] > 0 and result["disk_budget"] is None


def test_the_route_is_offline_chunked_or_online_as_the_budget_shrinks(tmp_path: Path) -> None:
    model = kimi_config(tmp_path / "kimi")
    prep_manifest(tmp_path, "A1", 1000, 3_000_000)  # 3M tokens: 172 GB of states
    base = request(tmp_path, model, [{"dataset": "A1"}])
    free = sizing.plan(base)["free_bytes"]
    stored = sizing.plan(base)["stored_bytes"]

    if stored <= free:  # this machine's disk can hold 172 GB: offline under a budget that does too
        assert sizing.plan({**base, "disk_budget": stored})["route"] == "offline"
    chunked = sizing.plan({**base, "disk_budget": "40G"})
    assert (chunked["route"], chunked["chunks"]) == ("chunked", -(-stored // 2**30 // 40))
    assert chunked["disk_budget"] == 40 * 2**30
    # Less than one 4k-token record (235 MB): nothing can be stored at all.
    assert sizing.plan({**base, "disk_budget": "100M"})["route"] == "online"


def test_a_route_that_cannot_fit_is_refused_naming_the_numbers_and_the_route_that_would(tmp_path: Path) -> None:
    model = kimi_config(tmp_path / "kimi")
    prep_manifest(tmp_path, "A1", 1000, 3_000_000)

    offline = sizing.plan(request(tmp_path, model, [{"dataset": "A1"}], disk_budget="40G", route="offline"))
    why = plan_texts.refusal(offline)
    assert why is not None and "route offline does not fit" in why
    assert "3,000,000 tokens × 57,344 B" in why and "40.0 GiB" in why and f"the route that fits is chunked ({offline['chunks']} chunks)" in why
    # auto takes what fits; chunked when offline would fit is fine (it fits too)
    assert plan_texts.refusal({**offline, "configured_route": "auto"}) is None
    online = sizing.plan(request(tmp_path, model, [{"dataset": "A1"}], disk_budget="100M"))
    assert "online route needs stages.train.engine specforge" in plan_texts.refusal(online)
    assert plan_texts.refusal({**online, "engine": "specforge"}) is None


def test_before_prep_the_sample_statistics_are_scaled_by_the_source_s_rows(tmp_path: Path) -> None:
    model = kimi_config(tmp_path / "kimi")
    source = tmp_path / "rows.jsonl"
    source.write_text("{}\n" * 500)
    sample = {"rows": 10, "kept": 8, "mean_tokens": 3000.0}

    result = sizing.plan(request(tmp_path, model, [
        {"dataset": "A1", "rows": 88_000, "estimate": sample},
        {"dataset": "B5", "source": str(source), "estimate": sample, "answer_tokens": 1000},
        {"dataset": "C1", "source": "org/hub-only"},
    ]))

    assert result["datasets"][0] == {"dataset": "A1", "records": 70_400, "tokens": 211_200_000, "basis": "estimate"}
    assert result["datasets"][1] == {"dataset": "B5", "records": 400, "tokens": 1_600_000, "basis": "estimate"}
    assert result["datasets"][2]["basis"] == "unknown" and result["unknown"] == ["C1"]
    assert result["tokens"] == 212_800_000


@pytest.mark.parametrize("text, expected", [("500G", 500 * 2**30), ("1.5T", int(1.5 * 2**40)), ("800GiB", 800 * 2**30),
                                            (12345, 12345), (None, None)])
def test_disk_budgets_read_as_bytes_or_sizes(text, expected) -> None:
    assert sizing.parse_size(text) == expected


def test_a_budget_that_is_not_a_size_is_one_line() -> None:
    with pytest.raises(sizing.PlanError, match=r"disk_budget 'lots': expected bytes or a size such as 500G"):
        sizing.parse_size("lots")


@pytest.mark.e2e
def test_inv_plan_and_inv_run_s_refusal_through_the_real_tasks(tmp_path: Path) -> None:
    from remote.demo.tiny_tokenizer import build_tokenizer

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    tokenizer = tmp_path / "tokenizer"
    build_tokenizer(tokenizer)
    target = {"model": str(kimi_config(tmp_path / "kimi")), "tokenizer": str(tokenizer)}
    datasets = {"A1": {"source": "nebius/DeepSWE-Kimi-trajectories", "kind": "native", "rows": 88_000,
                       "sample": str(SAMPLES["native"])}}
    bench.inventory(datasets, {"extract": {"disk_budget": "100G", "route": "offline"}}, target=target)
    bench.inv("deploy")

    done = bench.inv("plan", "--json")
    result = json.loads(done.stdout)
    assert set(result) >= {"datasets", "tokens", "bytes_per_token", "offline_bytes", "free_bytes", "disk_budget", "route", "chunks"}
    assert result["datasets"][0]["records"] == 88_000 and result["datasets"][0]["basis"] == "estimate"
    assert result["bytes_per_token"] == KIMI_BYTES_PER_TOKEN and result["disk_budget"] == 100 * 2**30
    assert result["route"] == "chunked"  # 88,000 short chats: ~0.6 TB at 57 KB a token
    # the loads the run makes: no prompts dataset, no server start; one target load for every extract
    assert result["loads"] == {"server_starts": 0, "infer_jobs": 0, "target_loads": 1, "route": "offline"}
    shown = bench.inv("plan", check=False).stdout
    assert "loads in `inv run`: no inference server start, 1 target load(s) on the offline route" in shown

    refused = bench.inv("run", check=False)
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "route offline does not fit" in line and "100.0 GiB" in line and "chunked" in line
    assert not (bench.root / "jobs" / "pipeline").exists()  # nothing started


def pipeline_for(route: str, engine: str = "aerie") -> list[dict]:
    from local.jobs import pipeline
    from local.inventory import schema

    inventory = schema.validate({
        "backend": "local", "host": {"root": "/r"},
        "stages": {"extract": {"route": route, "disk_budget": "1T", "layers": [2, 30, 58]}, "train": {"engine": engine, **(
            {"specforge_server_urls": ["http://c:30000"], "specforge_mooncake": {"metadata_server": "http://m:8080/metadata",
                                                                               "master_server_addr": "m:50051"}}
            if engine == "specforge" else {})}},
        "datasets": {"A1": {"source": "a", "kind": "native"}, "B5": {"source": "b", "kind": "prompts"}},
    })
    return pipeline.graph(inventory, None, route)


def test_the_chunked_route_replaces_the_extracts_and_the_train_with_one_job_after_every_prep() -> None:
    nodes = {n["key"]: n for n in pipeline_for("chunked")}

    assert set(nodes) == {"A1/prep", "B5/prep", "B5/infer", "B5/tokenize", "draft/chunked"}
    chunked = nodes["draft/chunked"]
    assert chunked["needs"] == ["A1/prep", "B5/tokenize"] and chunked["gpu"]
    assert chunked["spec"]["config"]["prep_inputs"] == {"A1": "/r/data/A1/prep", "B5": "/r/data/B5/tokenize"}
    assert chunked["spec"]["config"]["stage"]["disk_budget"] == "1T"
    assert chunked["spec"]["config"]["stage"]["extract"]["layers"] == [2, 30, 58]


def test_the_online_route_trains_from_the_conversations_with_no_extract() -> None:
    nodes = {n["key"]: n for n in pipeline_for("online", "specforge")}

    assert set(nodes) == {"A1/prep", "B5/prep", "B5/infer", "B5/tokenize", "draft/train"}
    config = nodes["draft/train"]["spec"]["config"]
    assert nodes["draft/train"]["needs"] == ["A1/prep", "B5/tokenize"] and "inputs" not in config
    assert config["extract"]["layers"] == [2, 30, 58] and set(config["prep_inputs"]) == {"A1", "B5"}
    assert {n["key"] for n in pipeline_for("offline")} >= {"A1/extract", "B5/extract", "draft/train"}


def test_each_route_s_cost_is_the_target_s_loads_and_forward_passes_and_the_time_is_unknown_until_measured(
    tmp_path: Path
) -> None:
    model = kimi_config(tmp_path / "kimi")
    prep_manifest(tmp_path, "A1", 40_000, 120_000_000)
    prep_manifest(tmp_path, "B5", 48_000, 144_000_000)
    base = request(tmp_path, model, [{"dataset": "A1"}, {"dataset": "B5"}], disk_budget="2T", epochs=10, passes=1)

    costs = sizing.plan(base)["costs"]

    assert sizing.plan(base)["route"] == "chunked"
    # one load for every dataset's extract (the runner's extract session), each record read once
    assert costs["offline"] == {"target_loads": 1, "passes": 1, "forward_tokens": 264_000_000,
                                "trained_tokens": 2_640_000_000, "hours": None}
    assert costs["chunked"] == costs["offline"]  # loaded once, each record read once
    # an extract command of the user's own loads the target once per dataset
    assert sizing.plan({**base, "resident": False})["costs"]["offline"]["target_loads"] == 2
    assert costs["online"]["forward_tokens"] == 2_640_000_000  # the served target reads every record every epoch
    # re-extracting every epoch, through an extract command that loads the target itself each time
    again = sizing.plan({**base, "passes": 10, "resident": False})["costs"]["chunked"]
    chunks = sizing.plan(base)["chunks"]
    assert again["forward_tokens"] == 2_640_000_000 and again["target_loads"] == chunks * 10


def test_the_time_of_each_route_comes_from_the_throughput_a_previous_run_measured(tmp_path: Path) -> None:
    model = kimi_config(tmp_path / "kimi")
    prep_manifest(tmp_path, "A1", 40_000, 120_000_000)
    chunked = tmp_path / "data" / "draft" / "chunked"
    chunked.mkdir(parents=True)
    # a run that read 1M tokens through the target in 100 s and trained on 4M tokens in 400 s
    (chunked / "manifest.json").write_text(json.dumps({"extracted_tokens": 1_000_000, "extract_seconds": 100.0,
                                                       "trained_tokens": 4_000_000, "train_seconds": 400.0}))

    result = sizing.plan(request(tmp_path, model, [{"dataset": "A1"}], disk_budget="2T", epochs=2, passes=1))

    assert result["throughput"]["from"] == "draft/chunked"
    seconds = 120_000_000 / 10_000 + 240_000_000 / 10_000  # forward 1 pass, train 2 epochs, 10k tok/s each
    assert result["costs"]["chunked"]["hours"] == round(seconds / 3600, 2)
    assert result["costs"]["online"]["hours"] == round((240_000_000 / 10_000 + 240_000_000 / 10_000) / 3600, 2)


def test_inv_plan_s_table_says_unknown_where_no_run_measured_the_time_and_hours_where_one_did(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from local.views.plan_tables import costs_table

    model = kimi_config(tmp_path / "kimi")
    prep_manifest(tmp_path, "A1", 40_000, 120_000_000)
    result = sizing.plan(request(tmp_path, model, [{"dataset": "A1"}], disk_budget="2T", epochs=2))

    def shown(result: dict) -> str:
        out = io.StringIO()
        Console(file=out, width=160).print(costs_table(result))
        return " ".join(out.getvalue().split())

    text = shown(result)
    assert "time unknown: no run on this host measured the throughput yet" in text
    assert "chunked (fits)" in text and text.count("unknown") == 4 and "120,000,000" in text
    measured = {**result, "throughput": {"extract_tokens_per_s": 10_000.0, "train_tokens_per_s": 10_000.0, "from": "draft/chunked"},
                "costs": {route: {**cost, "hours": 10.0} for route, cost in result["costs"].items()}}
    assert "10.00 h" in shown(measured) and "measured by draft/chunked" in shown(measured)


def test_the_offline_and_chunked_routes_train_hours_divide_by_the_gpus_training_uses() -> None:
    from remote import sizing

    result = {"tokens": 3_600_000, "stored_bytes": 1, "usable_bytes": 10, "chunks": 0, "datasets": ["A1"],
              "throughput": {"extract_tokens_per_s": 1e9, "train_tokens_per_s": 1000.0}}

    one = sizing.costs({**result, "train_gpus": 1}, {"epochs": 1})
    eight = sizing.costs({**result, "train_gpus": 8}, {"epochs": 1})

    assert one["offline"]["hours"] == 1.0 and eight["offline"]["hours"] == 0.13  # 1 h of training over 8 GPUs
    assert eight["chunked"]["hours"] == 0.13 and one["chunked"]["hours"] == 1.0  # its resident group of ranks too
    assert sizing.train_gpus({"train_nproc": 4}) == 4
