"""Sizing Kimi-K2.5 per extract engine from its headers alone, before a weight is read: the extract stage's
refusal on this machine, `inv plan` and `inv check` on an 8 x H200 host (a stand-in nvidia-smi)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from remote import sizing
from remote.vocabulary import plan_texts
from remote.eagle3 import StageInputError, target_memory
from tests.kimi_headers import TEXT_CONFIG, build_kimi_k25_headers
from tests.pipeline_fixtures import make_records, run_stage, stage_env, write_prep
from tests.helpers.eight_h200 import eight_h200  # noqa: F401 (a fixture)

H200_MIB = 143_771


@pytest.fixture(scope="module")
def kimi_k25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_kimi_k25_headers(tmp_path_factory.mktemp("kimi-k25-headers"))


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_the_headers_count_the_parameters_transformers_builds_for_kimi_k25(kimi_k25: Path) -> None:
    """The HF engine's count from the headers (INT4 experts as the dense weights they become) is the parameter
    count of transformers' own DeepseekV3 built from the same text config on the meta device (its state dict:
    the routers' score-correction biases are buffers the checkpoint fills)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from remote.eagle3.target import quantization_config
    from remote.eagle3.target_tensors import read_tensors

    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**TEXT_CONFIG, "model_type": "deepseek_v3"}))
    built = sum(t.numel() for t in model.state_dict().values())  # the router's bias is a buffer, loaded too

    params, quantized = target_memory.hf_parameters(read_tensors(kimi_k25), quantization_config(kimi_k25), wrapper=True)

    assert params == built
    assert 1.02e12 < params < 1.03e12 and 0.985 < quantized / params < 0.99  # the routed experts: 98.9 %


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_on_eight_h200_the_hf_engine_does_not_fit_and_sglang_does(kimi_k25: Path) -> None:
    sizes = target_memory.engines(kimi_k25, "bfloat16", [H200_MIB * 2**20] * 8, host_bytes=0)

    assert not sizes["hf"]["fits"] and sizes["sglang"]["fits"]
    assert sizes["hf"]["need_bytes"] == 2 * sizes["hf"]["params"]
    assert 590e9 < sizes["sglang"]["stored_bytes"] < 600e9  # INT4 experts as stored: ~594 GB on disk
    line = target_memory.refusal(sizes, "hf")
    assert line == ("target 2.05 TB in bfloat16 once its INT4 experts are dequantized; the 8 GPUs hold 1.21 TB: "
                    "use stages.extract.engine: sglang")
    assert target_memory.refusal(sizes, "sglang") is None


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_sglang_is_refused_on_gpus_too_small_for_its_share(kimi_k25: Path) -> None:
    sizes = target_memory.engines(kimi_k25, "bfloat16", [80 * 2**30] * 4, host_bytes=0)  # 4 x 80 GiB: 149 GB a GPU

    line = target_memory.refusal(sizes, "sglang")

    assert not sizes["sglang"]["fits"] and line.startswith("target 595 GB as stored; SGLang needs 160 GB on each of the 4 GPUs")
    assert line.endswith("no engine fits this host")


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_extract_with_the_hf_engine_refuses_kimi_k25_here_in_one_line_before_reading_a_weight(
        kimi_k25: Path, tmp_path: Path) -> None:
    write_prep(tmp_path / "data" / "A1", make_records(3, TEXT_CONFIG["vocab_size"]))
    settings = {"layers": [2, 30, 58], "dtype": "bfloat16", "batch_size": 1, "shard_size": 4, "engine": "hf"}
    env = stage_env(tmp_path, "extract", settings, {"target": {"model": str(kimi_k25)}})

    started = time.monotonic()
    result = run_stage("extract", env)
    seconds = time.monotonic() - started

    assert result.returncode != 0 and "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    # this machine: no GPU, its RAM; a GPU runner would name its GPUs instead
    assert re.search(r"target 2\.05 TB in bfloat16 once its INT4 experts are dequantized; "
                     r"(this host's RAM \(no GPU\) holds|the \d+ GPUs hold) [\d.]+ [GT]B: use stages\.extract\.engine: sglang", line), line
    assert not list(Path(env["AERIE_OUTPUT"]).glob("**/*.ckpt"))
    print(f"refused in {seconds:.1f} s")  # the figure for docs/hidden-states.md; never asserted


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_the_plan_on_eight_h200_says_which_engine_fits_and_which_does_not(kimi_k25: Path, tmp_path: Path, eight_h200: Path) -> None:
    request = {"root": str(tmp_path), "model": str(kimi_k25), "layers": [2, 30, 58], "dtype": "bfloat16",
               "datasets": [], "engine": "aerie", "route": "offline", "extract_engine": "hf"}

    result = sizing.plan(request)

    engines = result["extract_engines"]
    assert engines["gpus"] == [H200_MIB * 2**20] * 8
    assert not engines["engines"]["hf"]["fits"] and engines["engines"]["sglang"]["fits"]
    assert plan_texts.engine_refusal(result).endswith("the 8 GPUs hold 1.21 TB: use stages.extract.engine: sglang")
    assert plan_texts.engine_refusal({**result, "extract_engines": {**engines, "configured": "sglang"}}) is None
    assert engines["engines"]["sglang"]["rate_basis"] == "stated (estimate)"


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_the_check_fails_the_configured_engine_that_cannot_hold_the_target_and_warns_of_the_other(
        kimi_k25: Path, eight_h200: Path) -> None:
    from remote import preflight

    checks = {c["name"]: c for c in preflight.extract_engines(str(kimi_k25), "bfloat16", "hf")}

    assert checks["extract engine hf (configured)"]["status"] == "fail"
    assert "use stages.extract.engine: sglang" in checks["extract engine hf (configured)"]["detail"]
    assert checks["extract engine sglang"]["status"] == "ok" and "85.1 GB on each GPU" in checks["extract engine sglang"]["detail"]


def small_checkpoint(path: Path, experts: int = 2) -> Path:
    """config.json, two safetensors files of sparse data and their index: a checkpoint as Kimi-K2.5's is laid out."""
    from tests.kimi_headers import write_sparse

    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    shards = {"model-1.safetensors": {f"model.layers.0.mlp.experts.{e}.weight": ("BF16", [16, 8]) for e in range(experts)},
              "model-2.safetensors": {"lm_head.weight": ("BF16", [32, 8])}}
    for name, tensors in shards.items():
        write_sparse(path / name, tensors)
    weight_map = {tensor: name for name, tensors in shards.items() for tensor in tensors}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return path


def test_a_plan_reads_the_headers_once_until_a_file_of_the_checkpoint_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from remote.eagle3 import target_tensors
    from remote.vocabulary import layout

    model, root = small_checkpoint(tmp_path / "model"), tmp_path / "root"
    first = target_memory.engines(model, "float32", [], 10**9, root)
    (record,) = layout.target_sizes(root).iterdir()
    reads: list[Path] = []
    monkeypatch.setattr(target_memory, "read_tensors", lambda path: reads.append(path) or target_tensors.read_tensors(path))

    assert target_memory.engines(model, "float32", [], 10**9, root) == first and reads == []
    assert target_memory.engines(model, "float32", [], 10**9) == first and reads == [model]  # no root: nothing kept

    small_checkpoint(model, experts=1)  # re-downloaded: one expert fewer
    changed = target_memory.engines(model, "float32", [], 10**9, root)
    assert reads == [model, model] and changed["sglang"]["stored_bytes"] == first["sglang"]["stored_bytes"] - 256
    assert target_memory.engines(model, "float32", [], 10**9, root) == changed and len(reads) == 2

    record.write_text('{"files": ')  # torn: read again, and kept again
    assert target_memory.engines(model, "float32", [], 10**9, root) == changed and len(reads) == 3
    kept = json.loads(record.read_text())
    assert kept["footprint"]["stored"] == changed["sglang"]["stored_bytes"]

    record.write_text(json.dumps({**kept, "footprint": {**kept["footprint"], "params": "512"}}))  # not a count
    assert target_memory.engines(model, "float32", [], 10**9, root) == changed and len(reads) == 4


def test_a_dangling_link_among_the_weights_is_the_reader_s_one_line_not_a_record_of_it(tmp_path: Path) -> None:
    model = small_checkpoint(tmp_path / "model")
    (model / "model-2.safetensors").unlink()
    (model / "model-2.safetensors").symlink_to("../../blobs/gone")  # a hub cache's snapshot, its blob deleted

    with pytest.raises(StageInputError, match=r"model-2\.safetensors is not a readable safetensors file .*re-download it"):
        target_memory.engines(model, "float32", [], 10**9, tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_a_root_where_the_footprint_cannot_be_kept_still_sizes_the_target(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("a file where the root's cache directory would go")

    sizes = target_memory.engines(small_checkpoint(tmp_path / "model"), "float32", [], 10**9, tmp_path / "root")

    assert sizes["hf"]["params"] == 2 * 128 + 256 and sizes["sglang"]["stored_bytes"] == 2 * (2 * 128 + 256)


def test_a_truncated_safetensors_header_is_one_line_naming_the_file(tmp_path: Path) -> None:
    from remote.eagle3.target_tensors import read_tensors

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")

    with pytest.raises(StageInputError, match=r"model\.safetensors is not a readable safetensors file"):
        read_tensors(tmp_path)


@pytest.mark.e2e  # the 64 headers take seconds to write and read
def test_inv_plan_shows_each_engine_against_the_gpus_and_inv_run_refuses_hf_before_any_job(
        kimi_k25: Path, tmp_path: Path, eight_h200: Path) -> None:
    from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout
    from remote.demo.tiny_tokenizer import build_tokenizer

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    build_tokenizer(tmp_path / "tokenizer")
    datasets = {"A1": {"source": "nebius/DeepSWE-Kimi-trajectories", "kind": "native", "rows": 1000,
                       "sample": str(SAMPLES["native"])}}
    bench.inventory(datasets, {"extract": {"engine": "hf", "route": "offline", "disk_budget": "100T"}},
                    target={"model": str(kimi_k25), "tokenizer": str(tmp_path / "tokenizer")})
    bench.inv("deploy", timeout=300)

    shown = " ".join(bench.inv("plan", timeout=300).stdout.split())
    assert "extract engines on 8 GPUs, 1.21 TB (nvidia-smi); stages.extract.engine: hf" in shown
    assert re.search(r"hf │ 2\.05 TB \(bfloat16 once its INT4 experts are dequantized\) │ 1\.21 TB \(the 8 GPUs\) │ no", shown), shown
    assert re.search(r"sglang │ 85\.1 GB per GPU .* │ 151 GB per GPU \(the 8 GPUs\) │ yes │ [\d.,]+ h at 10,000 tok/s stated", shown), shown

    refused = bench.inv("run", check=False, timeout=300)
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and line.endswith("the 8 GPUs hold 1.21 TB: use stages.extract.engine: sglang"), line
    assert not (bench.root / "jobs" / "pipeline").exists()  # nothing started


def test_the_extract_job_sizes_against_the_gpus_cuda_visible_devices_leaves_it(eight_h200: Path) -> None:
    assert len(target_memory.nvidia_smi_gpus()) == 8
    assert target_memory.nvidia_smi_gpus("0,3") == [H200_MIB * 2**20] * 2
    assert target_memory.nvidia_smi_gpus("GPU-5") == [H200_MIB * 2**20]
    assert target_memory.nvidia_smi_gpus("") == []


def test_a_dense_weight_or_a_lost_scale_breaks_a_packed_module_s_set() -> None:
    from remote.eagle3.target_tensors import Tensor, unpaired_quantized
    from tests.tiny_kimi import QUANTIZATION_CONFIG

    def packed(module: str, *leaves: str) -> list[Tensor]:
        return [Tensor(f"{module}.{leaf}", "I32", (4, 4), 64) for leaf in leaves]

    whole = packed("m.experts.0.up_proj", "weight_packed", "weight_scale", "weight_shape")
    dense = packed("m.experts.1.up_proj", "weight", "weight_packed", "weight_scale", "weight_shape")
    lost = packed("m.experts.2.up_proj", "weight_packed", "weight_shape")
    plain = packed("m.self_attn.o_proj", "weight")

    assert unpaired_quantized(whole + plain, QUANTIZATION_CONFIG) == []
    assert unpaired_quantized(whole + dense + lost + plain, QUANTIZATION_CONFIG) == [
        "m.experts.1.up_proj.weight", "m.experts.2.up_proj.weight_scale (missing)"]
    assert unpaired_quantized(dense, None) == []  # not pack-quantized: transformers' own report decides
