"""A model's config.json has one reader (`remote.eagle3.model_config`) and one error policy: a missing or
malformed file is the same one line, naming the setting, the file and the fix, wherever it is read.

Every reader is held to it from the ast; the line is compared across the host's readers in-process and
through `inv plan` and `inv run` as typed. The targets are config files alone: nothing here loads weights.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from remote.eagle3 import layer_ids, model_config, target
from remote.eagle3.model_config import ConfigError

REMOTE = Path(__file__).resolve().parents[1] / "remote"
READER = REMOTE / "eagle3" / "model_config.py"
#: Kimi-K2.5's shape (moonshotai/Kimi-K2.5's config.json): the language model in text_config, and the
#: INT4 experts' quantization_config inside it; `architectures` at the top, where SGLang reads it.
KIMI = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "tie_word_embeddings": False,
    "text_config": {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840,
                    "kv_lora_rank": 512, "quantization_config": {"quant_method": "compressed-tensors",
                                                                 "config_groups": {"group_0": {"weights": {"num_bits": 4}}}}},
    "vision_config": {"hidden_size": 1152},
}
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 785}


# -- every read goes through the reader ------------------------------------------------------------------


def config_json_reads(source: str) -> list[int]:
    """Lines of `source` that parse a ``config.json`` as JSON: ``json.load(s)``/``read_json`` of an expression
    naming one, directly or through a name bound to one (assigned, or opened `as`) in the same function."""
    tree = ast.parse(source)
    found = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        bound = {t.id for n in ast.walk(scope) if isinstance(n, ast.Assign) and names_config(n.value)
                 for t in n.targets if isinstance(t, ast.Name)}
        bound |= {n.optional_vars.id for n in ast.walk(scope) if isinstance(n, ast.withitem)
                  and isinstance(n.optional_vars, ast.Name) and names_config(n.context_expr)}  # with open(...) as h
        for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call) and parses_json(n.func)):
            if any(names_config(a) or any(isinstance(x, ast.Name) and x.id in bound for x in ast.walk(a))
                   for a in [*call.args, *(k.value for k in call.keywords)]):
                found.append(call.lineno)
    return sorted(set(found))


def parses_json(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("load", "loads", "read_json") and (name == "read_json" or "json" in ast.unparse(func))


def names_config(node: ast.AST) -> bool:
    return any(isinstance(x, ast.Constant) and isinstance(x.value, str) and x.value == "config.json" for x in ast.walk(node))


def test_no_module_in_remote_parses_a_config_json_but_the_one_reader() -> None:
    readers = {str(p.relative_to(REMOTE.parent)): lines for p in sorted(REMOTE.rglob("*.py"))
               if p != READER and (lines := config_json_reads(p.read_text()))}
    assert readers == {}, f"read config.json through remote.eagle3.model_config, not: {readers}"
    assert config_json_reads(READER.read_text()), "the reader itself parses it (else the rule finds nothing)"


@pytest.mark.parametrize("source", [
    'json.loads((path / "config.json").read_text())',  # the target's and the layer rule's
    'config = read_json(path / "config.json", None)',  # eval's
    'def f(d):\n    path = d / "config.json"\n    return json.loads(path.read_text())',  # SpecForge's export
    'with open(os.path.join(d, "config.json")) as h:\n    c = json.load(h)',
])
def test_the_rule_finds_each_way_a_config_json_was_read_before(source: str) -> None:
    assert config_json_reads(source)


def test_the_rule_leaves_other_json_and_writing_a_config_alone() -> None:
    assert not config_json_reads('json.loads((d / "manifest.json").read_text())\n'
                                 '(d / "config.json").write_text(json.dumps(c))')


# -- the typed result --------------------------------------------------------------------------------------


def write(directory: Path, content: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    return directory


def test_a_kimi_k25_target_is_read_from_its_text_config_with_its_quantization_inside_it(tmp_path: Path) -> None:
    config = model_config.read(write(tmp_path / "kimi", KIMI), "target.model")
    assert config.is_wrapper and config.architecture == "KimiK25ForConditionalGeneration"
    assert (config.hidden_size, config.num_layers, config.vocab_size) == (7168, 61, 163840)
    assert config.quantization == KIMI["text_config"]["quantization_config"]
    assert config.text["kv_lora_rank"] == 512 and config.tie_word_embeddings is False
    assert target.shape_of(config) == target.read_shape(tmp_path / "kimi")


def test_a_wrapper_s_top_level_quantization_is_its_language_model_s_when_text_config_has_none(tmp_path: Path) -> None:
    text = {k: v for k, v in KIMI["text_config"].items() if k != "quantization_config"}
    moved = {**KIMI, "text_config": text, "quantization_config": {"quant_method": "fp8"}}
    assert model_config.read(write(tmp_path / "k", moved), "target.model").quantization == {"quant_method": "fp8"}
    assert model_config.read(write(tmp_path / "llama", LLAMA), "target.model").quantization is None


# -- one error policy --------------------------------------------------------------------------------------


BAD: dict[str, Callable[[Path], Any]] = {
    "no directory": lambda d: None,
    "no config.json": lambda d: d.mkdir(parents=True),
    "not JSON": lambda d: write(d, '{"architectures": ["Llama'),
    "a JSON list": lambda d: write(d, [LLAMA]),
    "text_config not an object": lambda d: write(d, {**KIMI, "text_config": "kimi_k2"}),
    "no num_hidden_layers": lambda d: write(d, {k: v for k, v in LLAMA.items() if k != "num_hidden_layers"}),
    "hidden_size a string": lambda d: write(d, {**LLAMA, "hidden_size": "64"}),
    "no hidden_size in text_config": lambda d: write(d, {**KIMI, "text_config": {"num_hidden_layers": 61, "vocab_size": 9}}),
    "no architectures": lambda d: write(d, {k: v for k, v in LLAMA.items() if k != "architectures"}),
}


def refusal(read: Callable[[], Any]) -> str:
    with pytest.raises(ConfigError) as refused:
        read()
    return str(refused.value)


@pytest.mark.parametrize("shape", BAD)
def test_each_bad_config_is_one_line_naming_the_setting_the_file_and_the_fix(tmp_path: Path, shape: str) -> None:
    model = tmp_path / "target"
    BAD[shape](model)
    line = refusal(lambda: target.read_shape(model) and target.read_target(model).architecture)
    assert "\n" not in line and line.startswith(f"target.model '{model}': ")
    assert str(model) in line and "; " in line and line.split("; ")[-1]  # where, and what to do about it


@pytest.mark.parametrize("shape", ["no directory", "no config.json", "not JSON", "a JSON list", "text_config not an object"])
def test_every_reader_of_the_target_s_config_gives_the_same_line(tmp_path: Path, shape: str) -> None:
    from remote import readiness, sizing
    from remote.eagle3 import target_memory

    model = tmp_path / "target"
    BAD[shape](model)
    line = refusal(lambda: target.read_shape(model))
    assert refusal(lambda: sizing.hidden_size(str(model))) == line
    assert refusal(lambda: layer_ids.target_architecture(model)) == line
    assert readiness.target(tmp_path, str(model))[0]["detail"] == line
    assert target_memory.per_engine(str(model), "bfloat16", "hf", 0, {})["error"] == line
    assert plan_reason(tmp_path, model) == line


def test_a_field_the_caller_needs_is_the_same_line_from_the_stage_and_from_inv_plan(tmp_path: Path) -> None:
    model = tmp_path / "target"
    BAD["hidden_size a string"](model)
    line = refusal(lambda: target.read_shape(model))
    assert line == (f"target.model '{model}': {model}/config.json has no whole-number hidden_size (the model's width); "
                    "is it a causal LM's? give the model's own config.json")
    assert plan_reason(tmp_path, model) == line


def plan_reason(root: Path, model: Path) -> str:
    from remote import sizing

    return sizing.plan({"root": str(root), "model": str(model), "layers": [0, 1, 2], "dtype": "bfloat16",
                        "datasets": [], "engine": "aerie", "route": "auto"})["reason"]


def test_a_draft_s_config_is_refused_in_the_same_words_naming_its_own_setting(tmp_path: Path) -> None:
    from remote.eagle3 import init_draft
    from remote.stages.eval import draft_problem

    draft = write(tmp_path / "draft", "[]")
    line = refusal(lambda: init_draft.inspect(str(draft)))
    assert line == (f"stages.train.init_draft '{draft}': {draft}/config.json is not a JSON object (a JSON list); "
                    "point it at a draft directory on the host (SGLang's --speculative-draft-model-path)")
    assert draft_problem(draft) == "its config.json is not a JSON object"  # eval names the draft and path itself


# -- through the real tasks ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_inv_plan_and_inv_run_give_the_reader_s_line_for_a_torn_or_shapeless_target(tmp_path: Path) -> None:
    from benchmarks.harness.checkout import Bench, copy_checkout
    from remote.demo.tiny_tokenizer import build_tokenizer

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    tokenizer = tmp_path / "tokenizer"
    build_tokenizer(tokenizer)
    model = tmp_path / "target"
    bench.inventory({"A1": {"source": "x", "kind": "native", "rows": 10}}, {"extract": {"route": "offline"}},
                    target={"model": str(model), "tokenizer": str(tokenizer)})
    bench.inv("deploy")
    for shape in ("not JSON", "a JSON list", "no num_hidden_layers"):
        BAD[shape](model)
        line = refusal(lambda: target.read_target(model).num_layers)

        planned = bench.inv("plan", "--json", check=False)
        assert planned.returncode == 1, planned.stdout + planned.stderr
        result = json.loads(planned.stdout)
        assert f"target: {line}" in result["refusals"] or f"layers: {line}" in result["refusals"]

        refused = bench.inv("run", check=False)
        [error] = [x for x in refused.stderr.splitlines() if x.strip()]
        assert refused.returncode == 2 and line in error and "Traceback" not in refused.stdout + refused.stderr
        assert not (bench.root / "jobs" / "pipeline").exists()  # nothing started
