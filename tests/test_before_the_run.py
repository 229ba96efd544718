"""Mistakes caught before the run (issue 29): what the inventory and the target's config.json on the host
already say is refused by `inv plan`, `inv check` and `inv run` before any job starts, `inv check` works on
a host where nothing is deployed, and a syntax error under remote/ stops `inv deploy` naming its file and line.

The target is a directory holding the tiny tokenizer `inv demo` builds (real) and a Llama config.json:
nothing here loads weights, and the checks read the config alone, as extract's own check does.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.harness.checkout import SAMPLES, Bench, copy_checkout
from benchmarks.harness.json_http import JSONHandler
from remote import readiness
from remote.eagle3.model_config import of
from tests.helpers.targets import LLAMA, target_files


def bench_for(tmp_path: Path, backend: str = "local", sshd=None) -> Bench:  # noqa: ANN001
    return Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", backend, sshd)


def inventory(bench: Bench, target: Path, layers: list[int], kinds: dict[str, str], infer: dict | None = None) -> None:
    datasets = {name: {"source": str(SAMPLES[kind]), "kind": kind} for name, kind in kinds.items()}
    bench.inventory(datasets, {"extract": {"layers": layers}, "infer": infer or {}},
                    target={"model": str(target), "tokenizer": str(target)})


# -- the host's side, in-process ------------------------------------------------------------------------


def test_layer_ids_are_checked_with_the_architecture_s_own_meaning_of_an_id(tmp_path: Path) -> None:
    """The same ids on the same depth: Llama's id is a layer's output (ids up to N - 2), DeepSeek's its input (N - 1)."""
    llama = readiness.layers([0, 1, 3], of({"architectures": [LLAMA], "num_hidden_layers": 4}))
    deepseek = readiness.layers([0, 1, 3], of({"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 4}))
    assert llama["status"] == "fail" and "[3] out of range for a 4-layer LlamaForCausalLM" in llama["detail"]
    assert deepseek["status"] == "ok"
    kimi = of({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}})
    assert readiness.layers([2, 30, 58], kimi)["status"] == "ok"  # Kimi-K2.5 keeps its depth in text_config
    assert readiness.layers([2, 30, 61], kimi)["status"] == "fail"


def test_a_hub_id_is_looked_up_in_the_host_s_hub_cache_and_a_target_only_there_is_named_for_the_fix(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = readiness.tokenizer(tmp_path, "moonshotai/Kimi-K2.5")
    assert missing["status"] == "warn" and "not in the host's Hugging Face cache" in missing["detail"]
    snapshot = tmp_path / "hub" / "models--moonshotai--Kimi-K2.5" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer_config.json").write_text("{}")
    assert readiness.tokenizer(tmp_path, "moonshotai/Kimi-K2.5")["status"] == "ok"
    assert readiness.tokenizer(tmp_path, "/nowhere/tokenizer")["status"] == "fail"
    # The target must be a directory (extract reads it there); one only in the cache is named for the fix.
    (snapshot / "config.json").write_text(json.dumps({"architectures": [LLAMA], "num_hidden_layers": 4}))
    found, config = readiness.target(tmp_path, "moonshotai/Kimi-K2.5")
    assert found["status"] == "fail" and config is None
    assert found["detail"].endswith(f"it is in the host's Hugging Face cache: set target.model to {snapshot}")


def test_only_the_datasets_a_run_takes_ask_for_a_server_and_a_stage_s_own_command_skips_its_checks(
        tmp_path: Path) -> None:
    from local.tasks import planning
    from local.inventory.schema import load

    bench = bench_for(tmp_path)
    inventory(bench, tmp_path / "target", [0, 1, 2], {"A": "native", "B": "prompts"})
    loaded = load(str(bench.checkout / "inventories" / "test.yaml"))
    assert planning.readiness(loaded, str(bench.root))["checks"] == ["tokenizer", "target", "server"]
    assert planning.readiness(loaded, str(bench.root), ["A"])["checks"] == ["tokenizer", "target"]
    loaded.stages.extract.command = "{python} my_extract.py"  # the user's code reads the target as it likes
    assert planning.readiness(loaded, str(bench.root), ["B"])["checks"] == ["tokenizer", "server"]


def test_a_server_url_that_is_not_a_url_is_a_failed_check_not_a_traceback(free_port: int) -> None:
    bad = readiness.server(["B"], "127.0.0.1:30000", managed=False)
    assert bad["status"] == "fail" and "'127.0.0.1:30000' is not a URL" in bad["detail"]
    assert readiness.server(["B"], "127.0.0.1:30000", managed=True)["status"] == "fail"  # the runner would wait on it
    closed = readiness.server(["B"], f"http://127.0.0.1:{free_port}/v1", managed=False)
    assert closed["status"] == "fail" and closed["detail"].startswith("prompts datasets B need an inference server")
    assert readiness.server(["B"], f"http://127.0.0.1:{free_port}/v1", managed=True)["status"] == "ok"


# -- through the real tasks ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_inv_run_refuses_layer_ids_outside_the_target_before_any_job_starts(tmp_path: Path) -> None:
    bench = bench_for(tmp_path)
    inventory(bench, target_files(tmp_path / "target"), [2, 30, 58], {"A": "native"})  # Kimi's ids on a 4-layer Llama
    bench.inv("deploy")

    refused = bench.inv("run", check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "nothing was started" in line
    assert "[30, 58] out of range for a 4-layer LlamaForCausalLM target" in line and "0..2" in line
    assert not (bench.root / "jobs").exists()  # no job, not even the runner

    planned = bench.inv("plan", check=False)
    assert planned.returncode == 1 and "cannot run: layers" in planned.stdout
    checked = bench.inv("check", check=False)
    assert checked.returncode == 1 and "out of range" in " ".join(checked.stdout.split())


@pytest.mark.e2e
def test_inv_run_refuses_prompts_datasets_with_no_server_answering_and_none_managed(tmp_path: Path,
                                                                                 free_port: int) -> None:
    bench = bench_for(tmp_path)
    target = target_files(tmp_path / "target")
    url = f"http://127.0.0.1:{free_port}/v1"  # nothing listens there, and no server_command starts anything
    inventory(bench, target, [0, 1, 2], {"A": "native", "B": "prompts"}, {"server_url": url})
    bench.inv("deploy")

    refused = bench.inv("run", check=False)
    assert refused.returncode == 2
    assert f"prompts datasets B need an inference server: none answers at {url}" in refused.stderr
    assert "stages.infer.server_command" in refused.stderr
    assert not (bench.root / "jobs").exists()
    # With a server answering there, the same inventory is not refused for it.
    server = ThreadingHTTPServer(("127.0.0.1", free_port), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        planned = json.loads(bench.inv("plan", "--json").stdout)
    finally:
        server.shutdown()
    assert planned["refusals"] == [], planned["refusals"]


class _Health(JSONHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_json(200 if self.path == "/health" else 404, {})


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["local", "ssh"])
def test_check_runs_on_a_fresh_host_where_nothing_was_deployed(tmp_path: Path, backend: str,
                                                               request: pytest.FixtureRequest) -> None:
    sshd = request.getfixturevalue("sshd") if backend == "ssh" else None
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "new" / "disk" / "root", backend, sshd)  # no folder yet
    inventory(bench, target_files(tmp_path / "target"), [0, 1, 2], {"A": "native"})

    done = bench.inv("check", check=False)
    table = " ".join(done.stdout.split())
    assert "nothing is deployed" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr  # gpus and the server's flags only warn
    assert "python │ ok" in table and "layers │ ok │ [0, 1, 2] on a 4-layer LlamaForCausalLM" in table
    assert not (tmp_path / "new").exists()  # it ran from the sources it sent: nothing written on the host


def test_a_file_with_current_bytecode_is_not_compiled_again_and_one_edited_since_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins
    import os
    import py_compile

    from local.exceptions import AerieError
    from local.host import releases

    source = tmp_path / "remote" / "stage.py"
    source.parent.mkdir()
    source.write_text("X = 1\n")
    py_compile.compile(str(source), doraise=True)
    compiled: list[str] = []
    monkeypatch.setattr(releases, "compile", lambda code, name, mode: compiled.append(name) or builtins.compile(code, name, mode),
                        raising=False)

    releases.check_sources(tmp_path)
    assert compiled == []  # its bytecode is current: it compiled

    source.write_text("X = (\n")  # as many bytes, written at another time
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime - 10))
    with pytest.raises(AerieError, match=r"^remote/ does not compile, nothing was sent: remote/stage.py:1: '\(' was never closed$"):
        releases.check_sources(tmp_path)
    assert compiled == ["remote/stage.py"]


@pytest.mark.e2e
def test_deploy_names_the_file_and_line_of_a_syntax_error_in_prep_s_code(tmp_path: Path) -> None:
    """prep's code is imported by the deploy's validation, before the files to send are compiled."""
    bench = bench_for(tmp_path)
    bench.inventory({"A": {"source": "x", "kind": "native"}})
    content = bench.checkout / "remote" / "prep" / "content.py"
    lines = content.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("from ")) + 1
    lines[at - 1] += " ((("
    content.write_text("\n".join(lines) + "\n")

    done = bench.inv("deploy", check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == f"aerie: remote/ does not compile, nothing was sent: remote/prep/content.py:{at}: invalid syntax"
    assert not (bench.root / "current").exists()


@pytest.mark.e2e
def test_check_install_puts_pyproject_s_host_extra_into_the_host_s_python_with_pip(tmp_path: Path) -> None:
    """Real pip, offline (PIP_NO_INDEX in host.env): into this virtualenv, which has them all, it changes nothing."""
    from local.host.packages import requirements

    bench = bench_for(tmp_path)
    bench.host_settings["env"] = {"PIP_NO_INDEX": "1"}
    inventory(bench, target_files(tmp_path / "target"), [0, 1, 2], {"A": "native"})

    done = bench.inv("check", "--install", check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"installing into {bench.python} on localhost: {' '.join(requirements())}" in done.stdout
    assert "Requirement already satisfied: torch==2.13.0" in done.stdout
    assert done.stdout.index("Requirement already satisfied") < done.stdout.index("checks on localhost")
