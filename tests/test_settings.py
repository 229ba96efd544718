"""Every stage setting is declared once, in the inventory's schema; the host has no second default."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from local.inventory.stages import Stage, Stages, settings_class, stage_names
from remote.eagle3 import StageInputError
from remote.eagle3.extract_settings import ExtractSettings
from remote.eagle3.train_settings import TrainSettings
from remote.eval.eval_settings import EvalSettings
from remote.infer.infer_settings import InferSettings, SettingsError
from remote.prep.errors import PrepError
from remote.prep.prep_settings import PrepSettings
from benchmarks.harness.checkout import REPO
from benchmarks.harness.stage_settings import complete

HOST_SETTINGS = {"prep": PrepSettings, "infer": InferSettings, "extract": ExtractSettings, "train": TrainSettings,
                 "eval": EvalSettings}
SCHEMA_KEYS = sorted({f.name for stage in stage_names() for f in dataclasses.fields(settings_class(stage))})
#: The schema's keys a stage's settings class leaves out, and why: any other key of the schema is in the class.
NOT_IN_THE_CLASS = {
    "prep": set(),
    # the managed inference server's: `local.jobs.pipeline.server_settings` sends them to `remote.server`, not to the stage
    "infer": {"server_command", "server_start_timeout", "server_env"},
    # draft_config: read with train's by `remote.eagle3.draft_config`; route: `inv plan`'s, on the workstation;
    # disk_budget and passes: the chunked driver's (`remote.orchestration.chunked`), unset unless given
    "extract": {"draft_config", "route", "disk_budget", "passes"},
    # unset unless given: read where they are used (`remote.eagle3.draft_config`, `remote.eagle3.specforge`)
    "train": {"draft_config", "specforge_dir", "specforge_train_data", "specforge_mooncake"},
    "eval": set(),
}
#: Modules that read a stage's raw settings besides remote/stages/<stage>.py, and the stage whose they are.
STAGE_CODE = {"remote/eagle3/specforge.py": "train", "remote/orchestration/resident.py": "train",
              "remote/orchestration/chunked.py": None}  # None: the receiver's name says (self.train, self.extract)


def keys(cls: type) -> set[str]:
    """The keys an inventory gives a class of the schema (its fields)."""
    return {f.name for f in dataclasses.fields(cls)}

def test_every_stage_of_the_schema_has_a_typed_settings_class_on_the_host() -> None:
    assert sorted(HOST_SETTINGS) == sorted(stage_names())
    for stage, cls in HOST_SETTINGS.items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, f"{stage}: {cls.__name__} is not frozen"


@pytest.mark.parametrize("stage", HOST_SETTINGS)
def test_a_stage_s_settings_class_has_every_key_of_its_schema_but_those_named_as_read_elsewhere(stage: str) -> None:
    """A key added to `local.inventory.stages` must be added to the host's class too, or named here with the reason."""
    schema = keys(settings_class(stage)) - keys(Stage)
    fields = {f.name for f in dataclasses.fields(HOST_SETTINGS[stage])}
    assert fields == schema - NOT_IN_THE_CLASS[stage]
    assert NOT_IN_THE_CLASS[stage] <= schema, f"{stage}: NOT_IN_THE_CLASS names keys the schema lacks"


@pytest.mark.parametrize("stage", HOST_SETTINGS)
def test_each_stage_reads_its_settings_through_its_typed_class(stage: str) -> None:
    """remote/stages/<stage>.py builds its class from the stage's config, and the class is built by `typed()`."""
    cls = HOST_SETTINGS[stage]
    source = (REPO / "remote" / "stages" / f"{stage}.py").read_text()
    assert f"{cls.__name__}.from_config(ctx.stage_config)" in source
    module = ast.parse((REPO / (cls.__module__.replace(".", "/") + ".py")).read_text())
    assert any(isinstance(node, ast.Call) and getattr(node.func, "id", None) == "typed" for node in ast.walk(module))


def raw_config_reads(path: Path, stage_of_module: str | None) -> list[str]:
    """Where `path` reads a key of a stage's settings class off the stage's raw config -- ``<ctx>.stage_config``,
    a dict parameter named `settings` or `stage`, or a name, ``self.<name>`` or part (``.get("train")``) bound
    from one -- as ``raw["key"]``, ``raw.get("key")`` or ``need(raw, stage, "key")``."""
    tree = ast.parse(path.read_text())
    attributes: set[str] = set()  # self.<name>, bound in one method and read in another

    def is_raw(node: ast.AST | None, names: set[str]) -> bool:
        if isinstance(node, ast.BoolOp):
            return any(is_raw(value, names) for value in node.values)
        if isinstance(node, ast.Dict):  # {**raw, "epochs": 2}: the raw config with more keys
            return any(key is None and is_raw(value, names) for key, value in zip(node.keys, node.values))
        if isinstance(node, ast.Subscript) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                               and node.func.attr == "get"):
            return is_raw(node.value if isinstance(node, ast.Subscript) else node.func.value, names)
        text = ast.unparse(node) if node is not None else ""
        return (isinstance(node, ast.Attribute) and node.attr == "stage_config") or text in names or text in attributes

    def reads(function: ast.AST) -> list[tuple[ast.AST, ast.AST, ast.AST]]:
        names = {a.arg for a in ast.walk(function) if isinstance(a, ast.arg) and a.arg in ("settings", "stage")
                 and a.annotation is not None and ast.unparse(a.annotation).startswith("dict")}
        for _ in range(3):  # bindings of bindings
            for node in ast.walk(function):
                if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                    continue
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) \
                        and isinstance(node.value, ast.Tuple) else [(target, node.value)]
                    for name, value in pairs:  # `self.ctx, self.settings = ctx, settings` too
                        if is_raw(value, names):
                            (attributes if ast.unparse(name).startswith("self.") else names).add(ast.unparse(name))
        found = []
        for node in ast.walk(function):
            if isinstance(node, ast.Subscript) and is_raw(node.value, names):
                found.append((node, node.value, node.slice))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and is_raw(node.func.value, names):
                found.append((node, node.func.value, node.args[0]))
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "need" and len(node.args) >= 3 \
                    and is_raw(node.args[0], names):
                found.append((node, node.args[0], node.args[2]))
        return found

    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function in functions:  # first every method's self.<name> bindings, then the reads
        reads(function)
    found = []
    for node, receiver, key in [read for function in functions for read in reads(function)]:
        stage = stage_of_module or next((s for s in ("extract", "train") if ast.unparse(receiver).endswith(s)), None)
        if isinstance(key, ast.Constant) and stage and key.value in {f.name for f in dataclasses.fields(HOST_SETTINGS[stage])}:
            found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.lineno}: "
                         f"{ast.unparse(node)}")
    return sorted(set(found), key=lambda line: int(line.split(":")[1]))


def test_no_stage_reads_a_key_of_its_settings_class_off_the_raw_config() -> None:
    """One mechanism: a key the class has is read from the class (typed and converted once), never from the dict."""
    modules = {REPO / "remote" / "stages" / f"{stage}.py": stage for stage in HOST_SETTINGS}
    modules.update({REPO / path: stage for path, stage in STAGE_CODE.items()})
    assert [line for path, stage in modules.items() for line in raw_config_reads(path, stage)] == []


def test_the_raw_read_rule_finds_each_way_a_stage_read_its_settings_before(tmp_path: Path) -> None:
    """The rule above can fail: the reads of remote/ before `typed()` are found; what is not the stage's is not."""
    module = tmp_path / "probe.py"
    module.write_text(
        "class Run:\n"
        "    def __init__(self, ctx, settings: dict[str, int], stage: str):\n"
        "        a = ctx.stage_config['epochs']\n"
        "        config = ctx.stage_config\n"
        "        b = need(config, 'train', 'batch_size', StageInputError)\n"
        "        c = config.get('max_length')\n"
        "        d = settings['ttt_steps']\n"
        "        e = config.get('layers')  # extract's, sent along: not a train setting\n"
        "        self.ctx, self.train = ctx, settings.get('train') or {}\n"
        "        more = {**settings, 'epochs': 2}\n"
        "        j = more['learning_rate']\n"
        "        f = stage['epochs']  # a str parameter\n"
        "        g = {'stage': settings}['epochs']  # a new dict\n"
        "    def later(self, extracted):\n"
        "        h = self.train.get('eval_records')\n"
        "        i = extracted['layers']\n")
    assert [line.split(": ", 1)[1] for line in raw_config_reads(module, "train")] == [
        "ctx.stage_config['epochs']", "need(config, 'train', 'batch_size', StageInputError)",
        "config.get('max_length')", "settings['ttt_steps']", "more['learning_rate']",
        "self.train.get('eval_records')"]


@pytest.mark.parametrize("stage", HOST_SETTINGS)
def test_the_hosts_typed_settings_have_required_fields_only_and_all_are_in_the_schema(stage: str) -> None:
    fields = dataclasses.fields(HOST_SETTINGS[stage])
    with_default = [f.name for f in fields if f.default is not dataclasses.MISSING
                    or f.default_factory is not dataclasses.MISSING]
    assert with_default == [], f"{stage}: a second default for {with_default}: declare it in local/inventory/stages.py only"
    schema = keys(settings_class(stage))
    assert [f.name for f in fields if f.name not in schema] == []


def test_no_host_code_reads_a_stage_setting_with_a_default_of_its_own() -> None:
    """`settings.get("max_length", 2048)` beside the schema's 2048 (and SpecForge's 4096) is how they drifted."""
    pattern = re.compile(r"""\.get\(\s*["'](%s)["']\s*,""" % "|".join(SCHEMA_KEYS))
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted((REPO / "remote").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_the_workstations_settings_are_complete_for_the_host() -> None:
    assert PrepSettings.from_config(complete("prep")).max_length == Stages().prep.max_length
    assert InferSettings.from_config(complete("infer")).concurrency == Stages().infer.concurrency
    assert ExtractSettings.from_config(complete("extract")).layers == Stages().extract.layers
    assert TrainSettings.from_config(complete("train")).max_length == Stages().train.max_length
    resolved = {"drafts": {"draft": "/r/data/draft/train/draft"}, "model": "/r/target"}  # as `inv eval` resolves them
    assert EvalSettings.from_config(complete("eval", resolved)).num_prompts == Stages().eval.num_prompts


def test_values_are_given_their_types_once_in_the_class() -> None:
    train = TrainSettings.from_config(complete("train", {"learning_rate": 1, "eval_records": "3", "epochs": "2"}))
    assert (train.learning_rate, train.eval_records, train.epochs) == (1.0, 3, 2)
    assert isinstance(train.learning_rate, float)
    assert TrainSettings.from_config(complete("train")).eval_records is None
    extract = ExtractSettings.from_config(complete("extract", {"batch_size": "4"}))
    assert extract.batch_size == 4
    evaluation = EvalSettings.from_config(complete("eval", {"drafts": {"d": "/d"}, "model": "/m", "port": "30200"}))
    assert evaluation.port == 30200 and [s.num_draft_tokens for s in evaluation.grid] == [4, 6, 8]


def test_a_missing_setting_is_named_in_one_line() -> None:
    settings = complete("prep")
    del settings["shard_size"]
    with pytest.raises(PrepError, match=r"^stages\.prep\.shard_size is missing from the job's settings"):
        PrepSettings.from_config(settings)
    with pytest.raises(SettingsError, match=r"^stages\.infer\.concurrency, retries are missing"):
        InferSettings.from_config({k: v for k, v in complete("infer").items() if k not in ("concurrency", "retries")})
    with pytest.raises(StageInputError, match=r"^stages\.train\.max_length is missing from the job's settings"):
        TrainSettings.from_config({k: v for k, v in complete("train").items() if k != "max_length"})
    with pytest.raises(StageInputError, match=r"^stages\.extract\.dtype is missing from the job's settings"):
        ExtractSettings.from_config({k: v for k, v in complete("extract").items() if k != "dtype"})
    with pytest.raises(StageInputError, match=r"^stages\.eval\.port, grid are missing from the job's settings"):
        EvalSettings.from_config({k: v for k, v in complete("eval", {"drafts": {"d": "/d"}}).items() if k not in ("port", "grid")})
    with pytest.raises(StageInputError, match=r"^stages\.eval\.drafts is unset"):
        EvalSettings.from_config(complete("eval"))


def test_the_job_spec_carries_every_setting_of_its_stage(tmp_path: Path) -> None:
    from local.jobs import specs
    from local.inventory.schema import load

    inventory = load("local")
    for stage in stage_names():
        name = next(iter(inventory.datasets))
        sent = specs.spec(inventory, name, stage)["config"]["stage"]
        declared = keys(settings_class(stage)) - {"command", "stall_after"}
        assert declared <= set(sent), f"{stage}: the spec lacks {declared - set(sent)}"


def test_typed_gives_each_value_its_declared_type_and_refuses_what_it_cannot_be_in_one_line() -> None:
    train = TrainSettings.from_config(complete("train", {"max_length": "4096", "eval_records": None, "nproc": 8.0}))
    assert (train.max_length, train.eval_records, train.nproc) == (4096, None, 8) and isinstance(train.nproc, int)
    for key, value, expected in (("epochs", "ten", "an integer"), ("epochs", 2.5, "an integer"),
                                 ("learning_rate", "fast", "a number"), ("specforge_server_urls", "http://h", "a list"),
                                 ("specforge_deployment", [1], "a dict")):
        with pytest.raises(StageInputError, match=rf"^stages\.train\.{key} .*: expected {expected}$"):
            TrainSettings.from_config(complete("train", {key: value}))
    # Not numbers to convert: a bool stays a bool for the class to refuse; `auto | int` is the class's to check.
    with pytest.raises(SettingsError, match=r"^stages\.infer\.retries: expected an integer >= 0 \(got True\)"):
        InferSettings.from_config(complete("infer", {"retries": True}))
    assert InferSettings.from_config(complete("infer", {"concurrency": "auto"})).concurrency == "auto"
    with pytest.raises(PrepError, match=r"^stages\.prep\.max_length must be a positive integer \(got True\)"):
        PrepSettings.from_config(complete("prep", {"max_length": True}))
