"""A SpecForge environment's python on a machine without a GPU, for the sglang engine's tests only.

    python tests/sglang_capture_cpu.py -m MODULE ARGS...     # as `python -m MODULE ARGS...`

The tests give it as ``stages.extract.specforge_python``, with ``specforge_env: {PYTHONPATH:
<.venv/specforge-sglang>}``: SpecForge's pinned SGLang 0.5.14 and the transformers 5.8.1 it pins,
installed by .ci/setup beside (not over) the SGLang 0.5.23 and transformers of the other tests.
For torchrun (``-m torch.distributed.run``) it is plain python. For aerie's capture worker
(`remote.eagle3.sglang_worker`) everything is the real code -- SpecForge's ``init_distributed``
(gloo), its ``OfflineSGLangCapture``, aerie's whole worker -- except what needs a GPU:

- ``triton``: SGLang 0.5.14's own stand-in (``sglang/_triton_stub.py``, for hosts without Triton),
  loaded from its file; ``torchvision`` (the CUDA build on PyPI does not load on CPU torch): a
  module whose every attribute is a stand-in, enough for transformers 5.8.1's image utilities;
  ``torch.compile``: the identity (SGLang compiles kernels at import, through Triton);
- SpecForge's ``OfflineSGLangCaptureBackend`` (SGLang's model runner, attention backends, KV pool,
  CUDA streams): `CpuCaptureBackend`, with the same signature (a test holds it to the real class
  with `inspect`). It builds the ``ServerArgs`` the real one builds, with SGLang 0.5.14's own class
  (a CUDA device and an H200's memory stood in for its device probe), picks the target's model
  class with SGLang's own ``ModelRegistry`` and sets the layers with that class's own
  ``set_eagle3_layers_to_capture``; the forward pass is transformers' on the CPU, keeping the
  inputs of the decoder layers SGLang chose and the final norm's output, as SGLang's does.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import runpy
import sys
import types
from pathlib import Path
from typing import Any, List, Optional
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
WORKER = "remote.eagle3.sglang_worker"
#: An H200's memory as nvidia-smi reports it (MiB): what SGLang's device probe would find on the host.
H200_MIB = 143_771
#: SGLang wrappers whose ``set_eagle3_layers_to_capture`` hands the call to an inner language model.
WRAPPED = {"KimiK25ForConditionalGeneration": "DeepseekV3ForCausalLM"}


def install_stubs() -> None:
    """Triton, torchvision and torch.compile stood in, before anything imports SGLang."""
    import torch

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not importable: put .venv/specforge-sglang on PYTHONPATH (.ci/setup installs it)")
    path = Path(spec.submodule_search_locations[0]) / "_triton_stub.py"
    stub_spec = importlib.util.spec_from_file_location("_sglang_triton_stub", path)
    stub = importlib.util.module_from_spec(stub_spec)
    sys.modules[stub_spec.name] = stub
    stub_spec.loader.exec_module(stub)
    stub.install()
    sys.meta_path.insert(0, _StandInFinder("torchvision"))
    torch.compile = lambda model=None, **_options: model if model is not None else (lambda function: function)


class _AnyClass(type):
    """A class whose every attribute is another such class: an enum member, a base class, a function."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyClass(name, (), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return None


class _AnyModule(types.ModuleType):
    """A package whose every attribute is a stand-in: a submodule, or a class when capitalised."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyClass(name, (), {}) if name[:1].isupper() else importlib.import_module(f"{self.__name__}.{name}")


class _StandInFinder:
    """Answers ``import <name>`` and its submodules with `_AnyModule`s (a loader of its own, so the
    import system keeps them)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):  # noqa: ANN201 (importlib's protocol)
        if fullname == self.name or fullname.startswith(self.name + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _AnyModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def server_args(**kwargs: Any):
    """SGLang 0.5.14's own ``ServerArgs(**kwargs)``, its device probe answered as on an H200 host."""
    import torch
    import sglang.srt.server_args as module

    with mock.patch.object(module, "get_device", lambda *args: "cuda"), \
            mock.patch.object(module, "get_device_memory_capacity", lambda *args: H200_MIB), \
            mock.patch.object(torch.cuda, "get_device_capability", lambda *args: (9, 0)):
        return module.ServerArgs(**kwargs)


def sglang_model(architecture: str, num_layers: int) -> Any:
    """SGLang's model class for `architecture` (its own ModelRegistry) bound to an object holding only what
    its ``set_eagle3_layers_to_capture`` reads: the pipeline rank, the config, the inner model's layers."""
    from types import MethodType, SimpleNamespace

    from sglang.srt.models.registry import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls([architecture])
    model = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True, is_first_rank=True),
                            config=SimpleNamespace(num_hidden_layers=num_layers),
                            model=SimpleNamespace(layers=[SimpleNamespace() for _ in range(num_layers)], layers_to_capture=[]))
    if architecture in WRAPPED:
        model.language_model = sglang_model(WRAPPED[architecture], num_layers)
    for name in ("set_eagle3_layers_to_capture", "set_dflash_layers_to_capture"):
        if hasattr(cls, name):
            setattr(model, name, MethodType(getattr(cls, name), model))
    return model


class _Built(Exception):
    """Raised by the recorder once SpecForge's build has made its ServerArgs: the rest needs a GPU."""


def real_server_args(path: str, *, torch_dtype: Any = None, trust_remote_code: bool = False, **kwargs: Any):
    """The ``ServerArgs`` SpecForge's real ``OfflineSGLangCaptureBackend.build`` makes for these arguments
    (its own code runs until then), built by SGLang 0.5.14's own class; raises what that class raises."""
    from specforge.offline_capture.sglang_backend import capture as real

    made: dict[str, Any] = {}

    def record(**fields: Any) -> Any:
        made["args"] = server_args(**fields)
        raise _Built

    with mock.patch.object(real, "ServerArgs", record):
        try:
            real.OfflineSGLangCaptureBackend.build(path, torch_dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                   **kwargs)
        except _Built:
            pass
    return made["args"]


class CpuCaptureBackend:
    """Stands in for SpecForge 0.2.0's ``OfflineSGLangCaptureBackend`` on a CPU (same signature)."""

    def __init__(self, model_runner: Any) -> None:
        self.model_runner = model_runner

    @classmethod
    def build(
        cls,
        pretrained_model_name_or_path: str,
        *,
        torch_dtype: Optional[Any] = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> "CpuCaptureBackend":
        import torch.distributed as dist
        from specforge.distributed import get_tp_group

        from remote.eagle3.extractor import decoder_of, load_target
        from remote.eagle3.layer_ids import target_architecture
        from remote.eagle3.target import read_shape

        # NOTE: SpecForge's own build makes the ServerArgs, through SGLang 0.5.14's own class, which
        # refuses a field it does not have (a misspelt stages.extract.sglang_args key) as on the host.
        args = real_server_args(pretrained_model_name_or_path, torch_dtype=torch_dtype,
                                trust_remote_code=trust_remote_code, **kwargs)
        if args.tp_size != dist.get_world_size(get_tp_group()):
            raise RuntimeError(f"ServerArgs.tp_size {args.tp_size} is not the tensor-parallel group's size")
        path = Path(pretrained_model_name_or_path)
        model = sglang_model(target_architecture(path), read_shape(path).num_layers)
        dtype = str(torch_dtype).removeprefix("torch.") if torch_dtype is not None else "float32"
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        # NOTE: importing SGLang registered its own `kimi_k2` config with transformers; aerie's HF loader reads
        # an unknown Kimi text config as DeepseekV3's, as it does where SGLang is not imported.
        with mock.patch.dict(CONFIG_MAPPING._extra_content):
            CONFIG_MAPPING._extra_content.pop("kimi_k2", None)
            decoder = decoder_of(load_target(path, dtype, trust_remote_code, "cpu"))
        return cls(types.SimpleNamespace(model=model, server_args=args, decoder=decoder))

    def set_capture_layers(self, layer_ids: Optional[List[int]] = None, *, capture_method: str) -> None:
        setter = {"eagle3": "set_eagle3_layers_to_capture", "dflash": "set_dflash_layers_to_capture"}.get(capture_method)
        if setter is None or not callable(getattr(self.model_runner.model, setter, None)):
            raise ValueError(f"offline SGLang capture method {capture_method!r} is not one this target exposes")
        getattr(self.model_runner.model, setter)(layer_ids)

    def capture(self, *, input_ids: Any, attention_mask: Any, loss_mask: Any):
        import os
        import time

        import torch

        time.sleep(float(os.environ.get("CPU_CAPTURE_PAUSE", "0")))  # a test's slower GPU, to kill it mid-run

        from remote.eagle3.extractor import capture

        model = self.model_runner.model
        captured = list(getattr(model, "language_model", model).model.layers_to_capture)
        rows = [row.view(-1).tolist() for row in torch.split(input_ids, 1, dim=0)]
        states = capture(self.model_runner.decoder, rows, captured, "cpu")
        data = list(zip(torch.split(input_ids, 1, dim=0), torch.split(attention_mask, 1, dim=0),
                        torch.split(loss_mask, 1, dim=0)))
        return data, tuple(aux for aux, _ in states), tuple(final for _, final in states)


def signatures() -> dict[str, Any]:
    """Each method's parameters (name, kind, default) in SpecForge's real backend and in `CpuCaptureBackend`."""
    import inspect

    from specforge.offline_capture.sglang_backend.capture import OfflineSGLangCaptureBackend

    def shape(function: Any) -> list[list[str]]:
        return [[p.name, p.kind.name, repr(p.default)] for p in inspect.signature(function).parameters.values()]

    return {name: {"real": shape(getattr(OfflineSGLangCaptureBackend, name)), "cpu": shape(getattr(CpuCaptureBackend, name))}
            for name in ("__init__", "build", "set_capture_layers", "capture")}


def probe_server_args(path: str, tp_size: int, dtype: str, trust_remote_code: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
    """What SGLang 0.5.14 makes of the ServerArgs SpecForge's build would make on a `tp_size`-GPU host:
    {"args": a few resolved fields} or {"refused": the error}."""
    import torch
    from specforge.offline_capture.sglang_backend import capture as real

    with mock.patch.object(real.dist, "get_world_size", lambda group=None: tp_size):
        try:
            args = real_server_args(path, torch_dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code, **kwargs)
        except (TypeError, ValueError, AssertionError) as exc:
            return {"refused": f"{type(exc).__name__}: {exc}"}
    fields = ("model_path", "tp_size", "pp_size", "device", "dtype", "trust_remote_code", "enable_return_hidden_states",
              "disable_cuda_graph", "chunked_prefill_size", "mem_fraction_static", *kwargs)
    return {"args": {name: str(getattr(args, name)) for name in fields}}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import sglang.version
    import transformers

    return {"sglang": sglang.version.__version__, "transformers": transformers.__version__, "specforge": version("specforge")}


PROBES = {"signatures": signatures, "server_args": probe_server_args, "versions": versions}


def install_backend() -> None:
    """`CpuCaptureBackend` where SpecForge's ``from_pretrained`` imports its backend from."""
    import specforge.offline_capture.sglang_backend as backend

    backend.OfflineSGLangCaptureBackend = CpuCaptureBackend


def main(argv: list[str]) -> None:
    if argv[:1] == ["--probe"]:  # the tests' questions: one JSON answer on stdout
        import json

        install_stubs()
        answer = PROBES[argv[1]](*json.loads(argv[2]) if len(argv) > 2 else [])
        print("PROBE " + json.dumps(answer), flush=True)
        return
    if argv[:1] == ["--probes"]:  # several questions, {name: [probe, *args]}, asked of one SGLang import
        import json

        install_stubs()
        answers = {name: PROBES[probe](*args) for name, (probe, *args) in json.loads(argv[1]).items()}
        print("PROBE " + json.dumps(answers), flush=True)
        return
    if argv[:1] != ["-m"] or len(argv) < 2:
        raise SystemExit("usage: sglang_capture_cpu.py -m MODULE ARGS...")
    module = argv[1]
    if module == WORKER:
        install_stubs()
        install_backend()
    sys.argv = [module, *argv[2:]]
    sys.path.insert(0, "")  # as `python -m` does: the working directory first
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
