"""`inv check` through the real task: it catches the server flag that ruined a training run.

SGLang cannot run here (it needs the GPU), so a loopback HTTP server answers
`/server_info` with the JSON SGLang's server returns; everything else is real.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from benchmarks.harness.checkout import Bench
from benchmarks.harness.json_http import JSONHandler

pytestmark = pytest.mark.e2e  # `inv check` as typed, against a stand-in server


def sglang_like(info: dict[str, Any]) -> Iterator[str]:
    class Handler(JSONHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_json(200 if self.path in ("/server_info", "/health") else 404,
                           info if self.path == "/server_info" else {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def draft_dir(tmp_path: Path, layers: list[int]) -> Path:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}}))
    return draft


def check_with(bench: Bench, info: dict[str, Any], layers: list[int]):  # noqa: ANN201
    from tests.helpers.targets import target_files

    target = target_files(bench.root.parent / "target", num_layers=61)
    for url in sglang_like(info):
        bench.inventory({"A": {"source": "x", "kind": "native"}}, {"infer": {"server_url": url}, "extract": {"layers": layers}},
                        target={"model": str(target), "tokenizer": str(target)})
        bench.inv("deploy")
        return bench.inv("check", check=False)


def test_check_flags_eagle_with_an_eagle3_draft(bench: Bench, tmp_path: Path) -> None:
    info = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": str(draft_dir(tmp_path, [2, 30, 58]))}
    done = check_with(bench, info, [2, 30, 58])
    assert done.returncode == 1
    assert "--speculative-algorithm EAGLE3" in " ".join(done.stdout.split())


def test_check_flags_auxiliary_layers_that_differ_from_the_extraction(bench: Bench, tmp_path: Path) -> None:
    info = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(draft_dir(tmp_path, [1, 29, 57]))}
    done = check_with(bench, info, [2, 30, 58])
    assert done.returncode == 1
    assert "[1, 29, 57] but extraction uses [2, 30, 58]" in " ".join(done.stdout.split())


def test_check_passes_a_consistent_server_and_lists_packages(bench: Bench, tmp_path: Path) -> None:
    info = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(draft_dir(tmp_path, [2, 30, 58]))}
    done = check_with(bench, info, [2, 30, 58])
    assert done.returncode == 0, done.stdout
    assert "EAGLE3, layers agree" in done.stdout and "package transformers" in done.stdout


def test_the_disk_check_sizes_the_states_as_the_plan_does_in_the_configured_dtype(tmp_path: Path) -> None:
    from remote import preflight, sizing
    from tests.helpers.plans import KIMI_BYTES_PER_TOKEN, kimi_config, prep_manifest, request

    prep_manifest(tmp_path, "A", 1000, 3_000_000)
    prep_manifest(tmp_path, "B", 1000, 1_000_000, stage="tokenize")
    model = kimi_config(tmp_path / "kimi")

    result = preflight.disk(tmp_path, ["A", "B"], [2, 30, 58], str(model), "bfloat16")

    planned = sizing.plan(request(tmp_path, model, [{"dataset": "A"}, {"dataset": "B"}]))["stored_bytes"]
    assert planned == sizing.stored_bytes(4_000_000, 2000, KIMI_BYTES_PER_TOKEN)  # states, ids and masks, framing
    assert f"need about {planned / 2**30:,.1f} GiB (4,000,000 tokens × 57,344 B in bfloat16" in result["detail"]
    # float32 states are twice as wide: the check follows stages.extract.dtype, as the plan does
    wide = preflight.disk(tmp_path, ["A", "B"], [2, 30, 58], str(model), "float32")["detail"]
    assert "4,000,000 tokens × 114,688 B in float32" in wide
    assert preflight.disk(tmp_path, ["A"], [2, 30, 58], None, "bfloat16")["detail"].endswith(
        "no estimate yet (needs prep's token counts and the target's config)")
