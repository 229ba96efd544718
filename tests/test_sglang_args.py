"""What aerie hands SGLang, held against the pinned real SGLang (its parser, its resolution, its draft loader).

The real package runs on the CPU in a child process (tests/sglang_real.py): its
``ServerArgs.add_cli_args`` parser and ``prepare_server_args`` + ``resolve_once``
(what ``launch_server`` does before it loads a weight, ``--device cpu``), and
``LlamaForCausalLMEagle3.load_weights`` on a draft aerie wrote. The stand-in
server of the eval tests is fed the same bad command lines as the real parser.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from benchmarks.harness.stage_settings import complete
from local.inventory.fields import dump
from local.inventory.stages import default_grid
from remote.eagle3 import server_check
from remote.eagle3 import checkpoint, draft_config
from remote.eagle3.model import Eagle3Draft
from remote.eagle3.target import draft_base, read_target
from remote.eval.eval_settings import BASELINE, EvalSettings, Server, Setting
from remote.eval.sglang import SPECULATIVE_MAX_RUNNING, batching_warnings, launch_argv, launch_command
from tests.pipeline_fixtures import kimi_target, tiny_target
from tests.sglang_real import sglang
from tests.stages import sglang_standin

__all__ = ["kimi_target", "sglang", "tiny_target"]  # fixtures used below

pytestmark = pytest.mark.e2e  # the real SGLang, imported in a process of its own


@pytest.fixture(scope="module")
def draft(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft for the tiny target, written by aerie's checkpoint writer."""
    return write_draft(tiny_target, tmp_path_factory.mktemp("draft") / "draft")


def write_draft(target: Path, directory: Path) -> Path:
    config = draft_config.build(draft_base(read_target(target)), [0, 1, 2], 200)
    torch.manual_seed(0)
    model = Eagle3Draft(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_()  # every weight distinct from a fresh init, and from the NaN fill
        model.d2t.copy_(torch.arange(200) * 2)  # draft id i is target id 3i
        model.t2d[torch.arange(200) * 3] = True
    return checkpoint.save(model, directory)


def eval_settings(target: Path, draft: Path, server_args: list[str], more: dict[str, Path] | None = None) -> EvalSettings:
    drafts = {"draft": str(draft), **{name: str(path) for name, path in (more or {}).items()}}
    return EvalSettings.from_config(complete("eval", {"launcher": "{python} -m sglang.launch_server", "model": str(target),
                                                      "port": 30100, "server_args": server_args, "drafts": drafts}))


def grid() -> list[Setting]:
    return [Setting.of(dump(point)) for point in default_grid()]


def draft_server(settings: EvalSettings, setting: Setting) -> Server:
    """`setting` serving the settings' first draft."""
    name, path = next(iter(settings.drafts.items()))
    return Server(name, path, setting)


def test_every_server_inv_eval_starts_resolves_in_sglang_as_aerie_means_it(
        sglang, tiny_target: Path, draft: Path, tmp_path: Path) -> None:
    second = write_draft(tiny_target, tmp_path / "second")
    settings = eval_settings(tiny_target, draft, ["--device", "cpu"], {"second": second})
    servers = settings.servers()
    assert len(servers) == 1 + 2 * len(grid())  # the baseline, then both drafts with every setting
    for server in servers:
        argv = launch_argv(settings, server)
        assert shlex.split(launch_command(settings, server))[-len(argv):] == argv
        parsed, resolved = sglang.call("parse", argv), sglang.call("resolve", argv)
        for answer in (parsed, resolved):
            args = answer["args"]
            assert (args["model_path"], args["host"], args["port"]) == (str(tiny_target), "127.0.0.1", 30100)
            # The same cap on the baseline and on every speculative server.
            assert args["max_running_requests"] == SPECULATIVE_MAX_RUNNING
            if server.setting is None:
                assert args["speculative_algorithm"] is None
            else:
                # SGLang keeps each grid point as given, and serves the draft named: nothing is silently rewritten.
                setting = server.setting
                assert (args["speculative_algorithm"], args["speculative_draft_model_path"]) == ("EAGLE3", server.path)
                assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) \
                    == (setting.num_steps, setting.topk, setting.num_draft_tokens)


def test_without_aeries_flag_sglang_would_cap_only_the_speculative_servers(sglang, tiny_target: Path, draft: Path) -> None:
    base = ["--model-path", str(tiny_target), "--device", "cpu"]
    assert sglang.call("resolve", base)["args"]["max_running_requests"] is None
    assert sglang.call("resolve", base + grid()[0].flags(str(draft)))["args"]["max_running_requests"] == 48
    # The user's own value is kept, on every server.
    settings = eval_settings(tiny_target, draft, ["--device", "cpu", "--max-running-requests", "16"])
    for server in (BASELINE, draft_server(settings, grid()[0])):
        assert sglang.call("resolve", launch_argv(settings, server))["args"]["max_running_requests"] == 16


def test_a_config_file_is_passed_through_with_a_warning(tiny_target: Path, draft: Path) -> None:
    settings = eval_settings(tiny_target, draft, ["--config", "/etc/sglang.yaml"])
    assert "--max-running-requests" not in launch_argv(settings, BASELINE)
    [warning] = batching_warnings(settings)
    assert "caps the speculative servers at 48" in warning


def test_sglang_silently_rewrites_a_grid_point_the_inventory_refuses(sglang, tiny_target: Path, draft: Path) -> None:
    from local.inventory.stages import GridPoint

    argv = ["--model-path", str(tiny_target), "--device", "cpu", *Setting(3, 1, 7).flags(str(draft))]
    assert sglang.call("resolve", argv)["args"]["speculative_num_draft_tokens"] == 4  # not 7: why aerie refuses it
    with pytest.raises(ValueError, match="num_steps \\+ 1 = 4"):
        GridPoint(num_steps=3, topk=1, num_draft_tokens=7)


def test_the_flag_inv_check_asks_for_is_one_sglang_takes(sglang, tiny_target: Path, draft: Path) -> None:
    info = {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": str(draft),
            "draft_config": json.loads((draft / "config.json").read_text())}
    [problem] = server_check.check_server_config(info, [0, 1, 2])
    flag = problem.split("relaunch with ")[1].split()
    argv = ["--model-path", str(tiny_target), "--device", "cpu", *flag, "--speculative-draft-model-path", str(draft)]
    assert sglang.call("resolve", argv)["args"]["speculative_algorithm"] == "EAGLE3"
    # And SGLang itself takes EAGLE with an EAGLE-3 draft without a word: only inv check says so.
    argv[argv.index("EAGLE3")] = "EAGLE"
    assert sglang.call("resolve", argv)["args"]["speculative_algorithm"] == "EAGLE"
    assert sglang_standin.parse(argv).speculative_algorithm == "EAGLE"  # the stand-in takes it too (and accepts nothing)


@pytest.mark.parametrize("which", ["llama", "kimi"])
def test_sglangs_eagle3_loader_takes_every_weight_of_aeries_draft_bit_for_bit(
        sglang, which: str, tiny_target: Path, kimi_target: Path, tmp_path: Path) -> None:
    written = write_draft(tiny_target if which == "llama" else kimi_target, tmp_path / "draft")

    loaded = sglang.call("load_draft", str(written))

    # Every parameter was NaN before loading; only the embeddings, which SGLang takes from the target, still are.
    assert loaded["nan"] == ["model.embed_tokens.weight"]
    assert loaded["differ"] == []
    assert loaded["hot_token_id_is_d2t_plus_arange"]


# -- the stand-in refuses what SGLang refuses -------------------------------------------------------------

BAD = {
    "an unknown flag": ["--speculative-layers", "2,30,58"],
    "a number that is not one": ["--speculative-num-steps", "three"],
    "a misspelt algorithm": ["--speculative-algorithm", "EAGLE-3"],
    "a flag without its value": ["--speculative-eagle-topk"],
    "a port that is not a number": ["--port", "http"],
}


def standin_refuses(argv: list[str]) -> bool:
    try:
        sglang_standin.parse(argv)
    except SystemExit:
        return True
    return False


@pytest.mark.parametrize("mistake", sorted(BAD))
def test_the_standin_server_refuses_what_sglang_refuses(sglang, mistake: str, tiny_target: Path) -> None:
    argv = ["--model-path", str(tiny_target), "--device", "cpu", *BAD[mistake]]
    assert "refused" in sglang.call("resolve", argv), f"SGLang takes {mistake}: drop it from BAD"
    assert standin_refuses(argv)


def test_the_standin_takes_every_command_inv_eval_builds_and_reads_it_as_sglang_does(
        sglang, tiny_target: Path, draft: Path, tmp_path: Path) -> None:
    second = write_draft(tiny_target, tmp_path / "second")
    settings = eval_settings(tiny_target, draft, ["--device", "cpu", "--tp-size", "1"], {"second": second})
    for server in settings.servers():
        argv = launch_argv(settings, server)
        real = sglang.call("parse", argv)
        ours = vars(sglang_standin.parse(argv))
        assert set(ours) <= set(real["names"])  # the stand-in knows no flag SGLang lacks
        assert {k: ours[k] for k in ours if k in real["args"]} == {k: v for k, v in real["args"].items() if k in ours}


def test_the_standin_reads_a_lower_case_algorithm_as_sglang_does(sglang, tiny_target: Path, draft: Path) -> None:
    argv = ["--model-path", str(tiny_target), "--device", "cpu", "--speculative-algorithm", "eagle3",
            "--speculative-draft-model-path", str(draft), *grid()[0].flags(str(draft))[4:]]
    assert sglang.call("resolve", argv)["args"]["speculative_algorithm"] == sglang_standin.parse(argv).speculative_algorithm
