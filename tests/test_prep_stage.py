"""The prep stage: outputs in place and described, losses loud, a zero yield fails the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from remote.prep.errors import PrepError
from remote.stages import StageContext
from remote.stages.prep import run
from benchmarks.harness.stage_settings import complete
from tests.prep_fixtures import FIXTURES, REPO, tiny_tokenizer, tiny_tokenizer_dir  # noqa: F401

NATIVE_PARTS = ["sharegpt.jsonl", "openai_tools.jsonl", "agent_trajectory.jsonl", "mixed.jsonl"]


def _release(tmp_path: Path, tokenizer_dir: Path, parts: list[str]) -> Path:
    """A release directory holding the tokenizer and the data under relative paths."""
    release = tmp_path / "release"
    (release / "data").mkdir(parents=True)
    (release / "tokenizer").symlink_to(tokenizer_dir)
    text = "".join((FIXTURES / part).read_text() for part in parts)
    (release / "data" / "input.jsonl").write_text(text)
    return release


def _env(tmp_path: Path, kind: str, config: dict[str, Any]) -> dict[str, str]:
    root = tmp_path / "root"
    output = root / "data" / "A1" / "prep"
    output.mkdir(parents=True, exist_ok=True)
    return {
        "AERIE_ROOT": str(root),
        "AERIE_RELEASE": "r-test",
        "AERIE_DATASET": "A1",
        "AERIE_STAGE": "prep",
        "AERIE_SOURCE": "data/input.jsonl",
        "AERIE_KIND": kind,
        "AERIE_OUTPUT": str(output),
        "AERIE_DATA": str(root / "data" / "A1"),
        "AERIE_PROGRESS": str(root / "progress.json"),
        "AERIE_CONFIG": json.dumps(config),
    }


def _config(stage: dict[str, Any] | None = None, tokenizer: str | None = "tokenizer", **dataset: Any) -> dict[str, Any]:
    return {
        "dataset": {"source": "data/input.jsonl", **dataset},
        "stage": complete("prep", {"max_length": 4096, **(stage or {})}),
        "inventory": {"target": {"tokenizer": tokenizer, "trust_remote_code": False}},
    }


def _run_stage(release: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "remote.stages.prep"], cwd=release, env=full_env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.e2e
def test_native_stage_writes_conversations_shards_and_a_manifest(tmp_path, tiny_tokenizer_dir):
    release = _release(tmp_path, tiny_tokenizer_dir, NATIVE_PARTS)
    env = _env(tmp_path, "native", _config({"shard_size": 3}))
    output = Path(env["AERIE_OUTPUT"])
    (output / "tokens-00009.parquet").write_text("left by an older run")
    (output / "manifest.json").write_text("{}")

    result = _run_stage(release, env)

    assert result.returncode == 0, result.stderr
    manifest = json.loads((output / "manifest.json").read_text())
    kept = manifest["kept"]
    assert (manifest["rows"], kept, manifest["skipped"]) == (18, 11, 7)
    assert manifest["skip_reasons"]["unknown role 'narrator'"] == 1
    assert manifest["formats"] == {"sharegpt": 4, "openai_tools": 2, "agent_trajectory": 3, "openai": 1, "swe_agent": 1}
    assert manifest["release"] == "r-test"
    assert manifest["tokenizer"] == str(tiny_tokenizer_dir.resolve())
    assert (manifest["tool_declarations"], manifest["dropped_fields"]) == ({"json": 2}, {})
    shards = sorted(p.name for p in output.glob("tokens-*.parquet"))
    assert shards == ["tokens-00000.parquet", "tokens-00001.parquet", "tokens-00002.parquet", "tokens-00003.parquet"]
    assert sorted(manifest["outputs"]) == sorted(["conversations.jsonl", *shards])
    assert not [p for p in output.iterdir() if p.name.startswith(".")]

    table = pa.concat_tables(pq.read_table(output / name) for name in shards)
    assert table.schema.field("id").type == pa.string()
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    lengths = [len(ids) for ids in table.column("input_ids").to_pylist()]
    assert manifest["tokens"]["total"] == sum(lengths) and manifest["tokens"]["max"] == max(lengths)
    assert lengths == [len(m) for m in table.column("loss_mask").to_pylist()]

    records = [json.loads(line) for line in (output / "conversations.jsonl").read_text().splitlines()]
    assert len(records) == kept == table.num_rows
    assert [r["id"] for r in records] == table.column("id").to_pylist()
    source_turns = json.loads((FIXTURES / "sharegpt.jsonl").read_text().splitlines()[0])["conversations"]
    assert records[0] == {
        "id": "sg-1",
        "conversations": [
            {"role": {"human": "user", "gpt": "assistant"}[t["from"]], "content": t["value"]} for t in source_turns
        ],
    }
    assert {t["role"] for r in records for t in r["conversations"]} <= {"system", "user", "assistant", "tool"}
    assert "tools" in records[3] and records[3]["conversations"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'

    progress = json.loads(Path(env["AERIE_PROGRESS"]).read_text())
    assert progress["records"] == kept
    assert sum(progress["skip_reasons"].values()) == 7


@pytest.mark.e2e
def test_a_dataset_that_yields_nothing_fails_the_stage_with_its_top_reasons(tmp_path, tiny_tokenizer_dir):
    release = _release(tmp_path, tiny_tokenizer_dir, ["unknown_roles.jsonl"])
    env = _env(tmp_path, "native", _config())

    result = _run_stage(release, env)

    assert result.returncode == 1
    assert "no records kept from 3 rows" in result.stderr
    assert "unknown role 'narrator': 2; unknown role 'critic': 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(Path(env["AERIE_OUTPUT"]).iterdir()) == []
    progress = json.loads(Path(env["AERIE_PROGRESS"]).read_text())
    assert progress["records"] == 0 and progress["skip_reasons"] == {"unknown role 'narrator'": 2, "unknown role 'critic'": 1}


def _context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, config: dict[str, Any], release: Path) -> StageContext:
    env = _env(tmp_path, kind, config)
    monkeypatch.setenv("AERIE_PROGRESS", env["AERIE_PROGRESS"])
    monkeypatch.chdir(release)
    return StageContext.from_env(env)


def test_prompts_stage_writes_system_and_first_user_turn_per_record(tmp_path, monkeypatch, tiny_tokenizer_dir):
    parts = ["prompts_alpaca.jsonl", "prompts_question.jsonl", "agent_trajectory.jsonl", "swe_agent.jsonl"]
    release = _release(tmp_path, tiny_tokenizer_dir, parts)
    ctx = _context(tmp_path, monkeypatch, "prompts", _config(tokenizer=None), release)

    assert run(ctx) == 0

    prompts = [json.loads(line) for line in (ctx.output / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 8
    assert prompts[3] == {"id": "q-1", "conversations": [{"role": "user", "content": "What is the boiling point of water at sea level in Fahrenheit?"}]}
    agent = prompts[5]
    assert agent["id"] == "astropy__astropy-12907"
    assert [t["role"] for t in agent["conversations"]] == ["system", "user"]
    assert agent["conversations"][1]["content"].startswith("<uploaded_files>")
    assert prompts[7]["conversations"][0]["content"].startswith("SETTING:")
    manifest = json.loads((ctx.output / "manifest.json").read_text())
    assert (manifest["kind"], manifest["kept"], manifest["outputs"]) == ("prompts", 8, ["prompts.jsonl"])
    assert not list(ctx.output.glob("tokens-*"))


def test_kept_ratio_under_the_minimum_fails_the_stage_and_publishes_nothing(tmp_path, monkeypatch, tiny_tokenizer_dir, capsys):
    release = _release(tmp_path, tiny_tokenizer_dir, ["mixed.jsonl"])
    ctx = _context(tmp_path, monkeypatch, "native", _config({"min_kept_ratio": 0.5}), release)

    assert run(ctx) == 1

    assert "kept 4 of 11 rows (36.4%), under min_kept_ratio 50.0%" in capsys.readouterr().err
    assert list(ctx.output.iterdir()) == []


def test_two_processes_write_the_same_outputs_as_one(tmp_path, monkeypatch, tiny_tokenizer_dir):
    outputs = []
    for procs in (1, 2):
        case = tmp_path / f"procs-{procs}"
        release = _release(case, tiny_tokenizer_dir, NATIVE_PARTS)
        ctx = _context(case, monkeypatch, "native", _config({"num_proc": procs, "batch_size": 2}), release)
        assert run(ctx) == 0
        table = pq.read_table(ctx.output / "tokens-00000.parquet")
        outputs.append(((ctx.output / "conversations.jsonl").read_text(), table.to_pylist()))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_config(source="nope.jsonl"), "dataset file .*nope.jsonl does not exist"),
        (_config({"overlong": "chop"}), "stages.prep.overlong must be one of truncate, drop \\(got 'chop'\\)"),
        (_config({"reasoning": "all"}), "stages.prep.reasoning must be one of expand, preserve \\(got 'all'\\)"),
        (_config(tokenizer=None), "target.tokenizer is not set"),
        (_config(tokenizer="no-such-tokenizer-dir/"), "cannot load tokenizer 'no-such-tokenizer-dir/'"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, monkeypatch, tiny_tokenizer_dir, config, message):
    release = _release(tmp_path, tiny_tokenizer_dir, ["sharegpt.jsonl"])
    ctx = _context(tmp_path, monkeypatch, "native", config, release)
    if "nope" in message:
        ctx = StageContext(**{**ctx.__dict__, "source": "nope.jsonl"})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PrepError, match=message):
        run(ctx)


def test_the_manifest_counts_turns_records_and_learned_reasoning(tmp_path, monkeypatch, tiny_tokenizer_dir):
    from tests.prep_fixtures import FAITHFUL_ROWS

    release = _release(tmp_path, tiny_tokenizer_dir, [])
    rows = [FAITHFUL_ROWS["multi_turn_reasoning"], FAITHFUL_ROWS["reasoning"]]
    (release / "data" / "input.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = _context(tmp_path, monkeypatch, "native", _config(), release)

    assert run(ctx) == 0

    manifest = json.loads((ctx.output / "manifest.json").read_text())
    assert (manifest["rows"], manifest["kept"], manifest["records"]) == (2, 2, 4)
    assert (manifest["assistant_turns"], manifest["turns_expanded"]) == (4, 2)
    assert 0 < manifest["reasoning_tokens"] < manifest["learned_tokens"] == manifest["tokens"]["loss_tokens"]
    assert manifest["encoding"]["method"] == "fast tokenizer, mask by pieces"
    assert manifest["settings"]["reasoning"] == "expand"
    ids = [json.loads(line)["id"] for line in (ctx.output / "conversations.jsonl").read_text().splitlines()]
    assert ids == ["m#2", "m#4", "m", "r"] == pq.read_table(ctx.output / "tokens-00000.parquet").column("id").to_pylist()


def test_the_tokenize_stage_renders_contexts_with_the_infer_stages_template_kwargs(tmp_path, monkeypatch, tiny_tokenizer_dir):
    from remote.prep.prep_settings import Target

    release = _release(tmp_path, tiny_tokenizer_dir, [])
    row = {"id": "p-1", "conversations": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
    (release / "data" / "input.jsonl").write_text(json.dumps(row) + "\n")
    env = _env(tmp_path, "native", _config()) | {"AERIE_STAGE": "tokenize"}
    infer = Path(env["AERIE_DATA"]) / "infer"
    infer.mkdir(parents=True)
    (infer / "manifest.json").write_text(json.dumps({"sampling": {"chat_template_kwargs": {"thinking": False}}}))
    monkeypatch.setenv("AERIE_PROGRESS", env["AERIE_PROGRESS"])
    monkeypatch.chdir(release)
    ctx = StageContext.from_env(env)

    assert run(ctx) == 0

    ids = pq.read_table(ctx.output / "tokens-00000.parquet").column("input_ids").to_pylist()[0]
    text = Target(str(tiny_tokenizer_dir)).load().decode(ids)
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>Hello.<|im_end|>")
    assert json.loads((ctx.output / "manifest.json").read_text())["settings"]["chat_template_kwargs"] == {"thinking": False}
