"""stages.extract.engine: sglang -- SpecForge 0.2.0's offline capture with its own SGLang 0.5.14, on a CPU.

The capture runs as it would on the host: the extract stage starts torchrun in the "SpecForge
environment" (here the test's python with .venv/specforge-sglang on PYTHONPATH: SGLang 0.5.14 and
transformers 5.8.1 beside the 0.5.23 the other tests use), one aerie worker per rank with SpecForge's
real ``init_distributed`` and ``OfflineSGLangCapture``; only the backend that needs a GPU is
tests/sglang_capture_cpu.py's (see there for what stands in for what, and why).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.eagle3.shards import ShardStore, load_sample
from tests.pipeline_fixtures import (
    EXTRACT_SETTINGS, REPO, RECORDS, extracted, kimi_target, read_progress, run_stage, stage_env, tiny_target,
)

__all__ = ["extracted", "kimi_target", "tiny_target"]  # fixtures used below

pytestmark = pytest.mark.e2e

CPU_PYTHON = REPO / "tests" / "sglang_capture_cpu.py"
BESIDE = REPO / ".venv" / "specforge-sglang"


@pytest.fixture(scope="session")  # a path checked, shared by tests that need not share a worker
def beside() -> Path:
    if not (BESIDE / "sglang").is_dir():
        raise RuntimeError(f"{BESIDE} is missing: run .ci/setup (it installs pyproject's [tool.aerie] specforge-sglang there)")
    return BESIDE


def sglang_settings(beside: Path, **more) -> dict:
    return {**EXTRACT_SETTINGS, "engine": "sglang", "specforge_python": f"{sys.executable} {CPU_PYTHON}",
            "specforge_env": {"PYTHONPATH": str(beside), **more.pop("env", {})}, **more}


#: The probe tests share one process that imports SGLang 0.5.14 (`answers`): one xdist worker runs them all.
PROBES = pytest.mark.xdist_group("sglang-0.5.14-probes")


@pytest.fixture(scope="module")
def answers(beside: Path, kimi_target: Path) -> dict:
    """tests/sglang_capture_cpu.py's probes, asked in the SpecForge environment of one process."""
    server_args = ["server_args", str(kimi_target), 8, "bfloat16", True]
    questions = {"versions": ["versions"], "signatures": ["signatures"],
                 "accepted": [*server_args, {"mem_fraction_static": 0.85}], "refused": [*server_args, {"mem_fraction": 0.85}]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(beside), str(REPO)])}
    done = subprocess.run([sys.executable, str(CPU_PYTHON), "--probes", json.dumps(questions)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


@PROBES
def test_the_capture_environment_is_specforge_s_pinned_sglang_and_transformers_beside_the_others(answers: dict) -> None:
    from importlib.metadata import version  # the test process never imports SGLang: it reads the metadata

    assert answers["versions"] == {"sglang": "0.5.14", "transformers": "5.8.1", "specforge": "0.2.0"}
    assert version("sglang") == "0.5.23"  # the eval and parser tests' SGLang is still there, untouched


@PROBES
def test_the_cpu_backend_takes_exactly_the_arguments_of_specforge_s_real_capture_backend(answers: dict) -> None:
    shapes = answers["signatures"]
    assert set(shapes) == {"__init__", "build", "set_capture_layers", "capture"}
    for name, both in shapes.items():
        assert both["cpu"] == both["real"], name


@PROBES
def test_sglang_0_5_14_accepts_the_server_args_the_real_backend_builds_for_a_kimi_target_on_eight_gpus(
    answers: dict
) -> None:
    accepted = answers["accepted"]
    assert accepted["args"]["tp_size"] == "8" and accepted["args"]["device"] == "cuda"
    assert accepted["args"]["enable_return_hidden_states"] == "True" and accepted["args"]["disable_cuda_graph"] == "True"
    assert accepted["args"]["mem_fraction_static"] == "0.85" and accepted["args"]["dtype"] == "torch.bfloat16"
    refused = answers["refused"]
    assert "mem_fraction" in refused["refused"] and refused["refused"].startswith("TypeError")


@pytest.mark.timeout(900)
def test_both_engines_store_the_same_states_for_the_same_tiny_target_and_ids(
    beside: Path, extracted: dict, tiny_target: Path, tmp_path: Path
) -> None:
    from tests.pipeline_fixtures import write_prep

    assert extracted["result"].returncode == 0, extracted["result"].stderr
    root = tmp_path / "root"
    write_prep(root / "data" / "A1", extracted["records"])
    env = stage_env(root, "extract", sglang_settings(beside, tp_size=2), {"target": {"model": str(tiny_target)}})
    result = run_stage("extract", env, timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]

    hf, sglang = (ShardStore(Path(e["AERIE_OUTPUT"])).sample_files() for e in (extracted["env"], env))
    assert [p.relative_to(p.parents[1]) for p in hf] == [p.relative_to(p.parents[1]) for p in sglang]
    assert len(sglang) == RECORDS
    import torch

    for a, b in zip(hf, sglang):
        one, two = load_sample(a), load_sample(b)
        assert torch.equal(one["input_ids"], two["input_ids"]) and torch.equal(one["loss_mask"], two["loss_mask"])
        for key in ("aux_hidden_state", "hidden_state"):
            assert one[key].shape == two[key].shape and one[key].dtype == two[key].dtype == torch.float32
            torch.testing.assert_close(two[key], one[key], rtol=1e-5, atol=1e-5)
    manifest = json.loads((Path(env["AERIE_OUTPUT"]) / "manifest.json").read_text())
    assert manifest["engine"] == "sglang" and manifest["hidden_states"] == [1, 2, 3] and manifest["records"] == RECORDS
    assert read_progress(env)["records"] == RECORDS


@pytest.mark.timeout(900)
def test_both_engines_store_the_same_states_for_a_kimi_shaped_target_whose_ids_are_layer_inputs(
    beside: Path, kimi_target: Path, tmp_path: Path
) -> None:
    """SGLang 0.5.14's KimiK25ForConditionalGeneration hands the ids to its DeepseekV3 model, which captures
    the inputs of layers 0, 1, 2 for [0, 1, 2] (a Llama captures 1, 2, 3): both engines store those."""
    import torch

    from tests.pipeline_fixtures import make_records, text_vocab_size, write_prep

    records = make_records(6, text_vocab_size(kimi_target), seed=3)
    stores = {}
    for engine, settings in (("hf", EXTRACT_SETTINGS), ("sglang", sglang_settings(beside))):
        root = tmp_path / engine
        write_prep(root / "data" / "A1", records)
        env = stage_env(root, "extract", settings, {"target": {"model": str(kimi_target)}})
        result = run_stage("extract", env, timeout=800)
        assert result.returncode == 0, result.stderr[-3000:]
        assert json.loads((Path(env["AERIE_OUTPUT"]) / "manifest.json").read_text())["hidden_states"] == [0, 1, 2]
        stores[engine] = ShardStore(Path(env["AERIE_OUTPUT"])).sample_files()
    assert len(stores["hf"]) == len(stores["sglang"]) == 6
    for a, b in zip(stores["hf"], stores["sglang"]):
        one, two = load_sample(a), load_sample(b)
        for key in ("aux_hidden_state", "hidden_state"):
            torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-4)


def test_a_capture_environment_that_cannot_be_run_is_one_line(beside: Path, extracted: dict, tiny_target: Path,
                                                               tmp_path: Path) -> None:
    from tests.pipeline_fixtures import write_prep

    root = tmp_path / "root"
    write_prep(root / "data" / "A1", extracted["records"])
    settings = {**sglang_settings(beside), "specforge_python": str(tmp_path / "no-such-python")}
    result = run_stage("extract", stage_env(root, "extract", settings, {"target": {"model": str(tiny_target)}}))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"stages.extract.specforge_python {str(tmp_path / 'no-such-python')!r} cannot be run" in result.stderr


def test_a_misspelt_sglang_arg_fails_the_stage_in_one_line_naming_it(beside: Path, extracted: dict, tiny_target: Path,
                                                                    tmp_path: Path) -> None:
    from tests.pipeline_fixtures import write_prep

    root = tmp_path / "root"
    write_prep(root / "data" / "A1", extracted["records"])
    settings = sglang_settings(beside, sglang_args={"mem_fraction": 0.8})
    result = run_stage("extract", stage_env(root, "extract", settings, {"target": {"model": str(tiny_target)}}), timeout=600)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "the SGLang capture" in last and "mem_fraction" in last, result.stderr[-3000:]
    assert not ShardStore(root / "data" / "A1" / "extract").complete_shards()


@pytest.mark.timeout(1200)
def test_inv_run_with_the_sglang_engine_writes_shards_train_accepts_reports_eta_and_resumes_after_a_kill(
    beside: Path, tmp_path: Path
) -> None:
    from remote.demo import tiny_model, tiny_tokenizer
    from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout, wait_for

    target = tmp_path / "target"
    tiny_tokenizer.build_tokenizer(target)
    tiny_model.main([str(target), "--tokenizer", str(target)])
    source = tmp_path / "chats.jsonl"  # the sample's chats, eight of them: enough records for a rate
    chats = [json.loads(line) for line in SAMPLES["native"].read_text().splitlines()]
    source.write_text("".join(json.dumps({**chats[i % len(chats)], "id": f"c{i}"}) + "\n" for i in range(8)))
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    # NOTE: a pause per batch (the stand-in's, see tests/sglang_capture_cpu.py) so that the kill lands mid-extract.
    extract = {**sglang_settings(beside, env={"CPU_CAPTURE_PAUSE": "1"}), "shard_size": 1, "batch_size": 1, "route": "offline"}
    stages = {"prep": {"max_length": 256}, "extract": extract,
              "train": {"draft_vocab_size": 200, "epochs": 1, "batch_size": 1, "ttt_steps": 2, "eval_records": 0}}
    bench.inventory({"chat": {"source": str(source), "kind": "native"}}, stages,
                    target={"tokenizer": str(target), "model": str(target)})
    bench.inv("deploy")
    bench.inv("run")
    out = bench.root / "data" / "chat" / "extract"
    seen: list[dict] = []

    def extract_has(shards: int) -> bool:
        seen.append(bench.poll().get("chat/extract", {}))
        return out.is_dir() and len(ShardStore(out).complete_shards()) >= shards

    wait_for(lambda: extract_has(3), 600, "three shards")
    state = json.loads((bench.job_dir("chat", "extract") / "state.json").read_text())
    os.killpg(state["pgid"], signal.SIGKILL)  # the job's group: supervisor, stage, torchrun
    kept = ShardStore(out).complete_shards()
    bench.wait_state("chat/extract", {"died", "failed"}, timeout=120)
    wait_for(lambda: not _workers_alive(target), 30, "the capture's workers to end with their torchrun")
    assert any(job.get("eta_s") is not None and job.get("total") == 8 for job in seen), seen  # progress and ETA

    bench.inv("rerun", "--failed")
    final = bench.wait_state("pipeline/run", {"succeeded", "failed"}, timeout=900)
    assert final["state"] == "succeeded", bench.inv("logs", "chat", "--stage", "extract", check=False).stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "sglang" and manifest["records"] == len(ShardStore(out).sample_files()) == 8
    assert set(kept) <= set(ShardStore(out).complete_shards())
    job = bench.poll()["chat/extract"]
    assert job["message"] == f"8 records in 8 shard(s), {len(kept)} resumed", job
    trained = json.loads((bench.root / "data" / "draft" / "train" / "manifest.json").read_text())
    assert trained["records"] == 8 and trained["layers"] == manifest["layers"]
    assert (bench.root / "data" / "draft" / "train" / "draft" / "model.safetensors").is_file()


def _workers_alive(target: Path) -> bool:
    """Whether a capture worker for `target` still runs: each has a session of its own (torchrun's doing), so
    it is found by its command line, which names the target."""
    found = subprocess.run(["pgrep", "-f", f"sglang_worker .*{target}"], capture_output=True, text=True)
    return bool(found.stdout.split())


@pytest.mark.timeout(900)
def test_the_chunked_route_keeps_the_capture_s_workers_and_the_target_loaded_for_every_chunk(
    beside: Path, extracted: dict, tiny_target: Path, tmp_path: Path
) -> None:
    from benchmarks.harness.stage_settings import complete
    from remote.control_plane.progress import Progress
    from remote.orchestration.resident import Extractor, Relay
    from tests.pipeline_fixtures import context, write_prep

    root = tmp_path / "root"
    records = extracted["records"]
    chunks = [write_prep(root / "chunks" / name, part) for name, part in (("c0", records[:6]), ("c1", records[6:]))]
    env = stage_env(root, "extract", sglang_settings(beside), {"target": {"model": str(tiny_target)}})
    extractor = Extractor(context(env), complete("extract", sglang_settings(beside)))
    progress = Progress()
    started = time.monotonic()
    extractor.run(chunks[0], root / "chunks" / "c0" / "extract", Relay(progress))
    first = time.monotonic() - started
    workers = extractor.model
    assert workers.process.poll() is None  # still there, the target loaded, for the next chunk
    started = time.monotonic()
    extractor.run(chunks[1], root / "chunks" / "c1" / "extract", Relay(progress))
    second = time.monotonic() - started
    assert extractor.loads == 1 and extractor.model is workers
    workers.close()
    assert workers.process.returncode == 0  # end of requests: the workers end on their own
    done = [json.loads((c.parent / "extract" / "manifest.json").read_text()) for c in chunks]
    assert [m["records"] for m in done] == [6, RECORDS - 6] and all(m["engine"] == "sglang" for m in done)
    print(f"chunk with the load: {first:.1f} s; chunk with the workers kept: {second:.1f} s")
