"""The pinned real SGLang (pyproject's ``[tool.aerie] no-deps`` list), imported on a CPU-only machine.

SGLang's modules import Triton and torchvision at module level. Neither can run
here: Triton is a GPU compiler, and PyPI's torchvision is built against CUDA
torch. SGLang ships its own stand-ins for Triton (``sglang/_platform_stubs.py``,
for Apple Silicon, where there is no Triton either); `install` runs them as
they run on a Mac and answers ``import torchvision`` with the same stub modules.
No kernel is ever called: the tests use SGLang's argument parser, its model
classes' ``set_eagle3_layers_to_capture`` and its EAGLE-3 draft's weight loader,
which are plain Python and torch.

SGLang runs in a child process of its own (`Child`, one per test worker, the
``sglang`` fixture): importing it patches transformers (it registers its own
config classes, e.g. for Kimi's ``kimi_k2``), which would change what the
other tests of the worker see. transformers is told first that torchvision is
absent (its answer is cached), so its own code paths do not change either.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parent.parent

#: The release pinned in pyproject.toml; the tests say so when another is installed.
PINNED = "0.5.23"

_installed = False


def install() -> None:
    """Make SGLang importable here (once per process)."""
    global _installed
    if _installed:
        return
    import torch
    from transformers.utils import import_utils

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"sglang is not installed: run .ci/setup (it installs sglang=={PINNED} without CUDA)")
    assert not import_utils.is_torchvision_available()  # cached False before the stub below can answer
    stubs = _load_platform_stubs(spec.submodule_search_locations[0])
    with mock.patch.object(sys, "platform", "darwin"), mock.patch.object(platform, "machine", lambda: "arm64"), \
            mock.patch.object(torch.backends.mps, "is_available", lambda: True):
        stubs.install_platform_stubs()
    sys.meta_path.insert(0, _StubFinder(stubs, "torchvision"))
    _installed = True


def _load_platform_stubs(package_dir: str) -> ModuleType:
    """SGLang's ``_platform_stubs`` loaded on its own: importing it as ``sglang._platform_stubs`` would run
    ``sglang/__init__``, which needs the stubs first."""
    spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", f"{package_dir}/_platform_stubs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class _StubFinder:
    """Answers ``import <name>`` and its submodules with SGLang's own stub modules."""

    def __init__(self, stubs: ModuleType, name: str) -> None:
        self.stubs, self.name = stubs, name

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):  # noqa: ANN201 (importlib's protocol)
        if fullname != self.name and not fullname.startswith(self.name + "."):
            return None
        module = self.stubs._MockModule(fullname)
        sys.modules[fullname] = module
        parent, _, child = fullname.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        return module.__spec__


def version() -> str:
    install()
    return importlib.import_module("sglang.version").__version__


def model_module(name: str) -> ModuleType:
    """``sglang.srt.models.<name>``."""
    install()
    return importlib.import_module(f"sglang.srt.models.{name}")


def _parser() -> argparse.ArgumentParser:
    """SGLang's own ``launch_server`` parser (``ServerArgs.add_cli_args``), refusing with SystemExit as it does."""
    install()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


#: What `parse` and `resolve` report of the arguments: what aerie sets, and what SGLang decides from it.
FIELDS = ("model_path", "host", "port", "device", "tp_size", "max_running_requests", "trust_remote_code",
          "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
          "speculative_num_draft_tokens")


def parse(argv: list[str]) -> dict[str, Any]:
    """`argv` through SGLang's own parser: {"args": the FIELDS, "names": every option's name} or
    {"refused": argparse's message}."""
    parser = _parser()
    with _refusal() as refused:
        args = parser.parse_args(argv)
    return refused or {"args": {k: getattr(args, k) for k in FIELDS}, "names": sorted(vars(args))}


def resolve(argv: list[str]) -> dict[str, Any]:
    """`argv` through ``prepare_server_args`` and SGLang's resolution (``resolve_once``), as a server starts:
    {"args": the FIELDS as resolved} or {"refused": the message}."""
    install()
    from sglang.srt.server_args import prepare_server_args

    with _refusal() as refused:
        args = prepare_server_args(argv)
        args.resolve_once()
    if refused:
        return refused
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(args)
    return {"args": {k: getattr(view, k) for k in FIELDS}}


@contextlib.contextmanager
def _refusal() -> Iterator[dict[str, str]]:
    """Catches a refusal (argparse's exit, a ValueError or assertion of SGLang's checks) as {"refused": text}."""
    refused: dict[str, str] = {}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            yield refused
    except SystemExit:
        refused["refused"] = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"
    except (ValueError, AssertionError, TypeError) as exc:
        refused["refused"] = f"{type(exc).__name__}: {exc}"


#: aerie's supported target architectures -> (SGLang model module, its class, the inner model class whose own
#: ``set_eagle3_layers_to_capture`` the outer one calls, if it does).
MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM", None),
    "MistralForCausalLM": ("mistral", "MistralForCausalLM", None),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM", None),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM", None),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeModel"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeModel"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM", None),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM", None),
    "KimiK25ForConditionalGeneration": ("kimi_k25", "KimiK25ForConditionalGeneration", None),
}
#: Kimi-K2.5's SGLang class builds a DeepseekV3ForCausalLM as its language_model and hands the call to it.
WRAPPED = {"KimiK25ForConditionalGeneration": "DeepseekV3ForCausalLM"}


def captures(arch: str, ids: list[int] | None, num_layers: int) -> list[int] | None:
    """The decoder layers whose inputs SGLang's own ``set_eagle3_layers_to_capture`` for `arch` captures,
    called on a stand-in holding only what that method reads (the pipeline-parallel rank, the config,
    the inner model and its layers) -- the real model needs a GPU, its weights and a distributed group.
    None where SGLang fails on the ids (the Qwen MoE models index their layers with them)."""
    outer = _standin(arch, num_layers)
    try:
        getattr(model_module(MODELS[arch][0]), MODELS[arch][1]).set_eagle3_layers_to_capture(outer, ids)
    except IndexError:
        return None
    inner = outer.language_model if arch in WRAPPED else outer
    return list(inner.model.layers_to_capture)


def _standin(arch: str, num_layers: int) -> Any:
    from types import MethodType, SimpleNamespace

    if arch in WRAPPED:
        language_model = _standin(WRAPPED[arch], num_layers)
        language_model.set_eagle3_layers_to_capture = MethodType(
            getattr(model_module(MODELS[WRAPPED[arch]][0]), MODELS[WRAPPED[arch]][1]).set_eagle3_layers_to_capture,
            language_model)
        return SimpleNamespace(language_model=language_model)
    module, _, inner_class = MODELS[arch]
    inner = SimpleNamespace(layers=[SimpleNamespace() for _ in range(num_layers)], layers_to_capture=[])
    if inner_class:
        inner.set_eagle3_layers_to_capture = MethodType(
            getattr(model_module(module), inner_class).set_eagle3_layers_to_capture, inner)
    return SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True, is_first_rank=True),
                           config=SimpleNamespace(num_hidden_layers=num_layers), model=inner)


# -- the draft through SGLang's EAGLE-3 loader -----------------------------------------------------------

_distributed = False


def load_draft(directory: str) -> dict[str, Any]:
    """aerie's draft checkpoint in `directory` loaded by SGLang's ``LlamaForCausalLMEagle3.load_weights``,
    every parameter NaN first (the loader skips names it does not know, silently): what is still NaN,
    the loaded tensors that differ from the file's, and whether ``hot_token_id`` is ``d2t + arange``."""
    install()  # NOTE: first, also when this is the child's first call (an xdist worker may start here)
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    _init_distributed()
    import sglang.srt.layers.rotary_embedding.base as rope
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    # NOTE: the CPU's RoPE path; with _is_cpu False SGLang looks for vllm's CUDA op (SGLang's own CPU
    # engine would set it, but needs sgl_kernel's CPU build).
    rope._is_cpu = True
    path = Path(directory)
    model = LlamaForCausalLMEagle3(LlamaConfig(**json.loads((path / "config.json").read_text())))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    state = load_file(str(path / "model.safetensors"))
    model.load_weights(iter(state.items()))
    params = dict(model.named_parameters())
    layer = "model.layers.0."
    expected = {
        "model.fc.weight": state["fc.weight"],
        layer + "self_attn.qkv_proj.weight": torch.cat([state[f"midlayer.self_attn.{x}_proj.weight"] for x in "qkv"]),
        layer + "self_attn.o_proj.weight": state["midlayer.self_attn.o_proj.weight"],
        layer + "mlp.gate_up_proj.weight": torch.cat([state[f"midlayer.mlp.{x}_proj.weight"] for x in ("gate", "up")]),
        layer + "mlp.down_proj.weight": state["midlayer.mlp.down_proj.weight"],
        **{layer + f"{n}.weight": state[f"midlayer.{n}.weight"]
           for n in ("input_layernorm", "post_attention_layernorm", "hidden_norm")},
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["lm_head.weight"],
    }
    differ = [n for n, t in expected.items() if not torch.equal(params[n][: t.shape[0]], t)]
    return {
        "nan": sorted(n for n, p in params.items() if torch.isnan(p).any()),
        "differ": differ,
        "hot_token_id_is_d2t_plus_arange": model.hot_token_id is not None and torch.equal(
            model.hot_token_id, state["d2t"] + torch.arange(state["d2t"].shape[0])),
    }


def _init_distributed() -> None:
    """SGLang's layers need a (one-process, gloo, loopback) model-parallel group even at tp 1."""
    global _distributed
    if _distributed:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from sglang.test.layer_ut_utils import init_single_process_dist

    init_single_process_dist(master_port=port)
    _distributed = True


# -- the child process and the fixture ------------------------------------------------------------------

CALLS = {"version": version, "captures": captures, "parse": parse, "resolve": resolve, "load_draft": load_draft}


class Child:
    """SGLang in a process of its own: `call` sends one request (a line of JSON) and waits for the answer."""

    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="sglang-child-", suffix=".log", delete=False)
        self.process = subprocess.Popen([sys.executable, "-m", "tests.sglang_real"], cwd=REPO, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)

    def call(self, name: str, *args: Any) -> Any:
        self.process.stdin.write(json.dumps({"call": name, "args": args}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the SGLang child ended: {Path(self.log.name).read_text()[-3000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{name}{tuple(args)} in the SGLang child: {answer['error']}")
        return answer["result"]

    def close(self) -> None:
        # NOTE: killed, not waited for: its interpreter takes seconds to tear SGLang's process group down.
        self.process.kill()
        self.process.wait()
        Path(self.log.name).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def sglang(request: pytest.FixtureRequest) -> Child:
    """The pinned real SGLang, imported once per test worker in a child process."""
    from tests.helpers.session import built_once  # here: this file is also the child's script

    return built_once(request, Child, stop=Child.close)


def serve() -> None:
    """The child's loop: one JSON request a line on stdin, one answer a line on stdout."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # SGLang's prints must not mix with the answers
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"result": CALLS[request["call"]](*request["args"])}
        except Exception as exc:  # noqa: BLE001 (reported to the test, which fails with it)
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
