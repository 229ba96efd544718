"""`remote.control_plane.inference_server` (starting, waiting for, stopping the inference server) and `remote.eagle3.server_check` (asking it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks.harness.sshd import free_port
from remote.control_plane import inference_server, processes
from remote.eagle3 import server_check
from tests.infer_fixtures import ScriptedServer

KIMI_LAYERS = [2, 30, 58]


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, _, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(pgrp) == pgid and state != "Z":
                members.append(int(entry.name))
    return members


def test_stop_ends_the_servers_whole_process_group(tmp_path: Path) -> None:
    # Like SGLang: the launched command forks workers that outlive a plain kill of the parent.
    pid = inference_server.start("sleep 300 & sleep 300 & wait", tmp_path / "server.log")
    deadline = time.monotonic() + 5
    while len(group_members(pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(group_members(pid)) == 3

    inference_server.stop(processes.identity(pid), grace=5)

    assert group_members(pid) == []
    assert not inference_server.is_running(pid)


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    pid = inference_server.start("trap '' TERM; sleep 300 & wait; sleep 300", tmp_path / "server.log")
    time.sleep(0.2)
    started = time.monotonic()
    inference_server.stop(processes.identity(pid), grace=0.5)
    assert group_members(pid) == []
    assert time.monotonic() - started < 5


def test_a_server_that_exits_while_starting_fails_at_once_with_its_last_log_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    pid = inference_server.start("echo 'loading'; echo 'CUDA out of memory' >&2; exit 3", log)
    started = time.monotonic()
    with pytest.raises(inference_server.ServerError, match=r"exited while starting: CUDA out of memory"):
        inference_server.wait_healthy(f"http://127.0.0.1:{free_port()}/v1", timeout=60, pid=pid, log_path=log)
    assert time.monotonic() - started < 10


def test_a_refused_flag_is_named_by_the_error_line_of_this_start_not_the_usage_after_it(tmp_path: Path) -> None:
    # As `transformers serve --dtyp`: the error, then a page of options, then a hint. The log keeps every start's.
    log = tmp_path / "server.log"
    log.write_text("RuntimeError: an earlier start's\n")
    url = f"http://127.0.0.1:{free_port()}/v1"
    options = "; ".join(f"echo '  --option-{i} TEXT  the option {i}'" for i in range(100))
    since = inference_server.log_end(log)
    pid = inference_server.start(f"echo 'Usage: serve [OPTIONS]'; echo \"Error: No such option '--dtyp'.\"; {options}; "
                                 "echo 'Did you mean: --dtype?'; exit 2", log)
    with pytest.raises(inference_server.ServerError) as refused:
        inference_server.wait_healthy(url, timeout=60, pid=pid, log_path=log, since=since)
    assert f"exited while starting: Error: No such option '--dtyp'. (log: {log})" in str(refused.value)

    since = inference_server.log_end(log)
    pid = inference_server.start("exit 1", log)  # says nothing: no earlier start's error is taken for its own
    with pytest.raises(inference_server.ServerError, match=r"exited while starting: \(nothing in its log "):
        inference_server.wait_healthy(url, timeout=60, pid=pid, log_path=log, since=since)

    since = inference_server.log_end(log)  # killed: a line that only mentions an error is not the reason
    pid = inference_server.start("echo 'Ignore import error when loading sglang.srt.models.mllama4'; echo Killed; exit 137", log)
    with pytest.raises(inference_server.ServerError, match=r"exited while starting: Killed \(log: "):
        inference_server.wait_healthy(url, timeout=60, pid=pid, log_path=log, since=since)


def test_waiting_for_a_silent_port_gives_up_after_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(inference_server.ServerError, match=r"not healthy after 1s"):
        inference_server.wait_healthy(f"http://127.0.0.1:{free_port()}/v1", timeout=1)
    assert time.monotonic() - started < 5


def test_an_empty_launch_command_is_refused_with_the_key_to_set(tmp_path: Path) -> None:
    with pytest.raises(inference_server.ServerError, match="launch command is empty"):
        inference_server.start("  ", tmp_path / "server.log")


def test_the_started_command_gets_the_given_environment_and_writes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "server.log"
    pid = inference_server.start('echo "offline=$HF_HUB_OFFLINE"', log, {"HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 5
    while inference_server.is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert log.read_text() == "offline=1\n"


def test_a_server_without_health_endpoint_is_healthy_when_it_lists_models() -> None:
    with ScriptedServer() as fake:
        assert not inference_server.is_healthy(fake.url)
        fake.routes["/v1/models"] = {"object": "list", "data": [{"id": "tiny"}]}
        assert inference_server.is_healthy(fake.url)


def write_draft(path: Path, config: dict) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def eagle3_draft(layers: list[int] | None) -> dict:
    config: dict = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "draft_vocab_size": 32000}
    if layers is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True}
    return config


def test_server_info_reads_sglangs_older_endpoint_and_the_drafts_config(tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "draft", eagle3_draft(KIMI_LAYERS))
    with ScriptedServer() as fake:
        fake.routes["/get_server_info"] = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": draft}
        info = server_check.server_info(fake.url)
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["draft_config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == KIMI_LAYERS


def test_server_info_of_a_server_that_is_not_sglang_says_so() -> None:
    with ScriptedServer() as fake:
        with pytest.raises(inference_server.ServerError, match="no /server_info or /get_server_info"):
            server_check.server_info(fake.url)


def test_eagle_with_an_eagle3_draft_is_flagged(tmp_path: Path) -> None:
    info = {
        "speculative_algorithm": "EAGLE",
        "speculative_draft_model_path": "/models/draft",
        "draft_config": eagle3_draft(KIMI_LAYERS),
    }
    [problem] = server_check.check_server_config(info, KIMI_LAYERS)
    assert "--speculative-algorithm EAGLE3" in problem


def test_eagle3_with_the_extractions_layers_has_no_problems() -> None:
    info = {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/draft",
        "draft_config": eagle3_draft(KIMI_LAYERS),
    }
    assert server_check.check_server_config(info, KIMI_LAYERS) == []


def test_a_draft_reading_other_layers_than_the_extraction_is_flagged() -> None:
    info = {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/draft",
        "draft_config": eagle3_draft([1, 29, 57]),
    }
    [problem] = server_check.check_server_config(info, KIMI_LAYERS)
    assert "[1, 29, 57]" in problem and "[2, 30, 58]" in problem


def test_a_draft_without_layer_ids_uses_sglangs_default_layers_of_the_target() -> None:
    info = {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/draft",
        "draft_config": eagle3_draft(None),
        "target_config": {"text_config": {"num_hidden_layers": 61}},
    }
    assert server_check.aux_layers(info) == [1, 29, 57]
    assert len(server_check.check_server_config(info, KIMI_LAYERS)) == 1


def test_a_server_without_speculative_decoding_has_no_problems() -> None:
    assert server_check.check_server_config({"speculative_algorithm": None}, KIMI_LAYERS) == []



def kimi_info(draft_ids: list[int] | None, architecture: str = "KimiK25ForConditionalGeneration") -> dict:
    return {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/draft",
            "draft_config": eagle3_draft(draft_ids),
            "target_config": {"architectures": [architecture], "text_config": {"num_hidden_layers": 61}}}


def test_on_kimi_a_draft_reading_the_same_layers_under_other_ids_is_not_flagged() -> None:
    # SGLang's DeepseekV3 adds 1 only when the first id is 1: [1, 29, 57] captures the inputs of 2, 30, 58.
    assert server_check.check_server_config(kimi_info([1, 29, 57]), KIMI_LAYERS) == []
    # A draft without ids: SGLang's default, the inputs of [2, N // 2, N - 3] -- the same layers again.
    assert server_check.aux_layers(kimi_info(None)) == [2, 30, 58]
    assert server_check.check_server_config(kimi_info(None), KIMI_LAYERS) == []


def test_a_draft_one_layer_off_is_flagged_naming_the_layers_each_side_reads() -> None:
    [problem] = server_check.check_server_config(kimi_info([3, 31, 59]), KIMI_LAYERS)
    assert "inputs of decoder layers [3, 31, 59], extract stored those of [2, 30, 58]" in problem
    # On Llama the same draft-less server reads other layers than the ids [2, 30, 58] store.
    [problem] = server_check.check_server_config(kimi_info(None, "LlamaForCausalLM"), KIMI_LAYERS)
    assert "[2, 30, 58], extract stored those of [3, 31, 59]" in problem
