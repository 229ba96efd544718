"""`python -m remote.prep.validate`: prep over each sample, reported as tagged JSON; the tiny tokenizer."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys

from remote.prep.validate import validate
from remote.demo.tiny_tokenizer import build_tokenizer
from remote.vocabulary.wire import decode
from benchmarks.harness.stage_settings import complete
from tests.prep_fixtures import REPO, tiny_tokenizer, tiny_tokenizer_dir  # noqa: F401

SAMPLES = REPO / "inventories" / "samples"


def _request(tokenizer_dir, **datasets) -> dict:
    return {"target": {"tokenizer": str(tokenizer_dir), "trust_remote_code": False}, "stage": complete("prep"), "datasets": datasets}


@pytest.mark.e2e
def test_validate_cli_reports_every_sample_and_a_missing_one_as_an_error(tiny_tokenizer_dir):
    datasets = {
        path.stem: {"kind": "prompts" if path.stem.startswith("prompts") else "native", "sample": str(path)}
        for path in sorted(SAMPLES.glob("*.jsonl"))
    }
    datasets["Z9"] = {"kind": "native", "sample": str(SAMPLES / "absent.jsonl")}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "remote.prep.validate", json.dumps(_request(tiny_tokenizer_dir, **datasets))],
        capture_output=True, text=True, env=env, timeout=120,
    )

    assert result.returncode == 0, result.stderr
    entries = {e["dataset"]: e for e in decode(result.stdout)}
    assert list(entries) == list(datasets)
    for name, entry in entries.items():
        if name == "Z9":
            continue
        assert entry["error"] is None, entry
        assert entry["kept"] == entry["rows"] > 0, entry
        assert entry["skipped"] == 0 and entry["skip_reasons"] == {}
        assert entry["mean_tokens"] > 10
    assert entries["swe_agent"]["formats"] == {"swe_agent": 1}
    assert entries["openthoughts"]["formats"] == {"openthoughts": 2}
    assert entries["prompts_alpaca"]["kind"] == "prompts"
    assert entries["Z9"]["kept"] == 0
    assert entries["Z9"]["error"] == f"datasets.Z9.sample: {SAMPLES / 'absent.jsonl'} does not exist"


def test_validate_counts_skip_reasons_of_a_sample_with_bad_rows(tiny_tokenizer_dir):
    sample = REPO / "tests" / "fixtures" / "prep" / "unknown_roles.jsonl"
    [entry] = validate(_request(tiny_tokenizer_dir, B2={"kind": "native", "sample": str(sample)}))
    assert (entry["rows"], entry["kept"], entry["skipped"]) == (3, 0, 3)
    assert entry["skip_reasons"] == {"unknown role 'narrator'": 2, "unknown role 'critic'": 1}
    assert entry["error"] is None


def test_without_the_tokenizer_rows_are_still_normalised_and_counted_but_not_tokens(tmp_path):
    sample = str(SAMPLES / "sharegpt.jsonl")
    entries = validate(_request(tmp_path / "nothing-here", A1={"kind": "native", "sample": sample}, P1={"kind": "prompts", "sample": sample}))
    for entry in entries:
        assert entry["error"] is None and entry["kept"] == 3 and entry["mean_tokens"] is None
        assert entry["note"].startswith(f"tokens not counted: cannot load tokenizer '{tmp_path / 'nothing-here'}'")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"conversations": [{"from": "narrator", "value": "hi"}]}\n')
    [entry] = validate(_request(tmp_path / "nothing-here", A1={"kind": "native", "sample": str(broken)}))
    assert entry["kept"] == 0 and "unknown role 'narrator'" in entry["skip_reasons"]


def test_prompts_validate_without_a_tokenizer():
    request = {"target": {}, "stage": complete("prep"), "datasets": {"P1": {"kind": "prompts", "sample": str(SAMPLES / "prompts_problem.jsonl")}}}
    [entry] = validate(request)
    assert (entry["kept"], entry["error"], entry["mean_tokens"]) == (2, None, None)


def test_the_tokenizer_is_loaded_once_and_only_when_a_sample_is_there_to_read(tmp_path, monkeypatch):
    from remote.prep.prep_settings import Target

    loads = []
    monkeypatch.setattr(Target, "load", lambda self: loads.append(self.tokenizer))
    nothing = _request(tmp_path / "tokenizer", A={"kind": "native"}, B={"kind": "native", "sample": str(tmp_path / "gone.jsonl")})
    assert [bool(e["error"]) for e in validate(nothing)] == [True, True] and loads == []
    two = _request(tmp_path / "tokenizer", A={"kind": "prompts", "sample": str(SAMPLES / "prompts_alpaca.jsonl")},
                   B={"kind": "prompts", "sample": str(SAMPLES / "prompts_question.jsonl")})
    assert [e["error"] for e in validate(two)] == [None, None] and loads == [str(tmp_path / "tokenizer")]


def test_validate_cli_refuses_a_request_that_is_not_json():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "remote.prep.validate", "{oops"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "validate: the request is not JSON (Expecting property name enclosed in double quotes at position 1)"


def test_the_tiny_tokenizer_is_small_deterministic_and_kimi_shaped(tmp_path, tiny_tokenizer_dir, tiny_tokenizer):
    again = build_tokenizer(tmp_path / "again")
    assert (again / "tokenizer.json").read_bytes() == (tiny_tokenizer_dir / "tokenizer.json").read_bytes()
    assert 256 < len(tiny_tokenizer) <= 2048
    for token in ("<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>", "<|tool_call_begin|>", "<|tool_calls_section_end|>"):
        assert len(tiny_tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "tool", "tool_call_id": "t:0", "content": "ok"}],
        tokenize=False,
    )
    assert text == (
        "<|im_user|>user<|im_middle|>hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>hello<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of t:0\nok<|im_end|>"
    )


def test_validate_reports_how_tools_were_declared_and_the_turn_fields_prep_dropped(tmp_path, tiny_tokenizer_dir):
    from local.views.validation_table import details
    from tests.prep_fixtures import AGENT_WITH_THOUGHTS

    agent = tmp_path / "agent.jsonl"
    agent.write_text(json.dumps(AGENT_WITH_THOUGHTS) + "\n" + json.dumps({**AGENT_WITH_THOUGHTS, "id": "web-18"}) + "\n")
    entries = validate(_request(tiny_tokenizer_dir, G={"kind": "native", "sample": str(SAMPLES / "glaive_toolcall.jsonl")},
                                A={"kind": "native", "sample": str(agent)}))
    glaive, web = entries
    # The tiny tokenizer's template is plain Jinja: JSON, as most templates declare tools.
    assert glaive["tool_declarations"] == {"json": 3} and glaive["dropped_fields"] == {}
    assert web["dropped_fields"] == {"thoughts": 6, "actions": 4} and web["tool_declarations"] == {}
    assert details(glaive) == "G: tools declared as JSON in 3 rows"
    assert details(web) == "A: thoughts dropped in 6 turns, actions dropped in 4 turns"
    assert details({**web, "dropped_fields": {"thoughts": 1}, "tool_declarations": {"typescript": 1}}) == (
        "A: tools declared TypeScript-style in 1 row; thoughts dropped in 1 turn")
    assert details({**web, "dropped_fields": {}}) is None


def test_validate_of_a_prompts_sample_says_how_many_turns_per_row_infer_will_ask(tiny_tokenizer_dir, tmp_path):
    from local.views.validation_table import _learned, details
    from tests.regeneration_rows import write_rows

    sample = write_rows(tmp_path / "chats.jsonl")  # 5 + 3 + 3 + 3 turns
    [entry] = validate(_request(tiny_tokenizer_dir, B={"kind": "prompts", "sample": str(sample)}))
    assert (entry["records"], entry["turns_to_ask"], entry["turns_left_out"]) == (4, 14, 0)
    assert _learned(entry) == ("4", "14 (3.5/row)", "by infer")
    assert details(entry) == "B: infer will ask 14 turns of 4 rows (3.5 per row)"
