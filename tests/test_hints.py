"""Every next step aerie prints is a command that works: each hint is parsed with Invoke's own parser
against tasks.py's collection, as `inv` would parse it typed.

The hints are collected two ways: from the source (every `inv ...` in backticks or in parentheses in
a string of local/ or remote/, and the task of every `inv TASK` said in words, and every call of remote/vocabulary/hints.py's builder, its
non-constant arguments standing for a name), and from the views themselves (a stopped, empty or blocked job of
every stage, under a runner in every state, and the outcome of a run that failed).
"""

from __future__ import annotations

import ast
import itertools
import re
import shlex
from pathlib import Path

import pytest
from invoke import Program
from invoke.exceptions import ParseError
from invoke.parser import Parser

import tasks
from local.inventory.values import stage_names
from local.views import status_data
from remote.vocabulary import hints
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE, STAGE_ORDER, JobState

REPO = Path(__file__).resolve().parents[1]
#: What a value computed at run time (a dataset's name, a stage) stands for in a hint read from the source.
NAME = "A1"
TYPED = "<typed>"
HINT = re.compile(r"`(inv [^`]*)`")
#: A command in parentheses without backticks: `run it first (inv launch --stage extract)`.
BARE = re.compile(r"\((inv [a-z][^)`]*)\)")
#: A task named in words (`stopped by inv stop`): at least the task is one tasks.py has.
MENTION = re.compile(r"(?<![`(\w])(inv [a-z][\w-]*)")
BUILDERS = {"inv", "chain", "words"}
BUILDER = REPO / "remote" / "vocabulary" / "hints.py"


def refusal(command: str) -> str | None:
    """Why `inv` refuses `command` (Invoke's parser, then `launch --stage`'s names), or None."""
    program = Program(namespace=tasks.ns)
    argv = shlex.split(command)
    try:
        core = Parser(initial=program.initial_context, ignore_unknown=True).parse_argv(argv[1:])
        parsed = Parser(initial=program.initial_context, contexts=tasks.ns.to_contexts()).parse_argv(core.unparsed)
    except ParseError as exc:
        return str(exc)
    if not parsed:
        return "no task"
    for context in parsed:
        stage = context.args.get("stage")
        if context.name == "launch" and stage is not None and stage.value not in (*stage_names(), "STAGE", NAME):
            return f"launch takes no stage {stage.value!r}"
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _text(node: ast.AST) -> str | None:
    """A string literal's text, each `{...}` of an f-string standing for a name; one glued to a word
    (`--watch{i}`: an optional ` -i NAME`) stands for nothing, and one right after `inv ` for the tasks
    the user typed (`TYPED`), which only the code that repeats them can check."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
        else:
            text += TYPED if text.endswith("inv ") else "" if text[-1:].strip() else NAME
    return text


def _built(node: ast.AST) -> str | bool | None:
    """A builder call's value, with each argument that is not a literal standing for a name."""
    if isinstance(node, ast.Call) and _builder(node):
        args = [_built(arg) for arg in node.args if not isinstance(arg, ast.Starred)]
        flags = {kw.arg: _built(kw.value) for kw in node.keywords if kw.arg}
        return getattr(hints, _builder(node))(*args, **flags)  # type: ignore[arg-type]
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bool)) or (
            isinstance(node, ast.Constant) and node.value is None):
        return node.value
    return _text(node) or NAME


def _builder(node: ast.Call) -> str:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name if name in BUILDERS else ""


def hints_in_source() -> dict[str, str]:
    """Every hint the source can print, by where it is: `path:line`."""
    found: dict[str, str] = {}
    for path in [*sorted((REPO / "local").glob("**/*.py")), *sorted((REPO / "remote").glob("**/*.py"))]:
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Call) and _builder(node) in ("inv", "chain") and path != BUILDER:
                found[f"{where}:{node.lineno}:{node.col_offset}"] = str(_built(node)).strip("`")
            text = _text(node)
            words = HINT.sub("", text or "")
            for index, command in enumerate(HINT.findall(text or "") + BARE.findall(text or "") + MENTION.findall(words)):
                if TYPED not in command:
                    found[f"{where}:{node.lineno}:{node.col_offset}#{index}"] = command
    return found


def job(dataset: str, stage: str, state: str) -> dict:
    return {"dataset": dataset, "stage": stage, "state": state, "records": 0, "skipped": 0, "skip_reasons": {},
            "metrics": {}, "message": "", "exit_code": 1}


def hints_the_views_print() -> dict[str, str]:
    """The next step of every stage's job in every state, under a runner in every state (or none), and the
    outcome of a run that failed: as the status table, `--follow` and its ending print them."""
    found = {}
    runners = [None, *(state.value for state in JobState)]
    jobs = [*((NAME, stage) for stage in STAGE_ORDER if stage != RUNNER_STAGE),
            *((DRAFT, stage) for stage in ("chunked", "train", "eval")), (RUNNER, RUNNER_STAGE)]
    for (dataset, stage), state, runner in itertools.product(jobs, JobState, runners):
        step = status_data.next_step(job(dataset, stage, state.value), runner)
        for command in HINT.findall(step):
            found[f"{dataset}/{stage} {state.value} (runner {runner})"] = command
    failed = {"jobs": [job(NAME, "prep", "failed"), job(NAME, "extract", "blocked")]}
    found.update({f"outcome #{i}": c for i, c in enumerate(HINT.findall(status_data.outcome(failed)))})
    return found


def test_the_source_holds_hints_and_the_collector_finds_them_all() -> None:
    found = hints_in_source()
    # Hints typed out and built alike are found, on both sides.
    assert any(where.startswith("local/views/status_data.py") for where in found)
    assert any(where.startswith("remote/") for where in found)
    assert "inv rerun --failed" in found.values()
    assert len(found) >= 20


def test_invokes_parser_refuses_what_inv_would_refuse() -> None:
    assert refusal("inv rerun --failed") is None
    assert refusal("inv deploy rerun --failed") is None
    assert refusal("inv logs DATASET --stage STAGE") is None
    assert "No idea what 'tokenize' is" in str(refusal("inv tokenize"))
    assert "no-such-flag" in str(refusal("inv deploy --no-such-flag"))
    assert refusal("inv launch --stage tokenize --dataset A3") == "launch takes no stage 'tokenize'"
    assert "did not receive required positional arguments" in str(refusal("inv logs"))


@pytest.mark.parametrize("collect", [hints_in_source, hints_the_views_print])
def test_every_hint_aerie_prints_is_a_command_inv_accepts(collect) -> None:  # noqa: ANN001
    refused = {where: f"`{command}`: {refusal(command)}" for where, command in collect().items() if refusal(command)}
    assert not refused, "\n".join(f"{where}: {why}" for where, why in refused.items())


def test_a_stopped_job_of_a_stage_only_a_runner_starts_is_never_sent_to_launch() -> None:
    stopped = job("A3", "tokenize", "stopped")
    assert status_data.next_step(stopped, "failed") == (
        "`inv rerun --failed` resumes its pipeline, which starts it again")
    assert status_data.next_step(stopped, "running").endswith("again, once its runner has ended")
    assert status_data.next_step(stopped, "stopped") == "`inv rerun --failed` continues the stopped run"
    assert status_data.next_step(stopped) == "`inv run` starts the pipeline again"  # no runner shown: a new run
    assert status_data.next_step(job("A3", "extract", "stopped")) == (
        "`inv launch --stage extract --dataset A3` starts it again")


def test_the_builder_types_long_flags_and_leaves_unset_ones_out() -> None:
    assert hints.inv("launch", stage="prep", dataset="A1", force=True) == "`inv launch --stage prep --dataset A1 --force`"
    assert hints.inv("status", watch=True, json=False, inventory=None) == "`inv status --watch`"
    assert hints.chain("deploy", hints.words("rerun", failed=True)) == "`inv deploy rerun --failed`"
    assert hints.words("rerun", dry_run=True) == "rerun --dry-run"


def _hint_of(table: str, dataset: str, stage: str) -> str:
    """The command in a row's last cell, its wrapped lines joined (the printed `inv status`)."""
    said: dict[tuple[str, str], list[str]] = {}
    row: tuple[str, str] | None = None
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) < 3:
            continue
        if cells[0]:
            row = (cells[0], cells[1])
        if row:
            said.setdefault(row, []).append(cells[-1])
    commands = HINT.findall(" ".join(said.get((dataset, stage), [])))
    assert commands, table
    return commands[0]


@pytest.mark.e2e
def test_a_stopped_tokenize_job_s_hint_typed_starts_it(tmp_path: Path, free_port: int) -> None:
    from benchmarks.harness.checkout import Bench, copy_checkout
    from tests.helpers.pipelines import pipeline_inventory, wait_pipeline

    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local", None)
    plans = tmp_path / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native", "B": "prompts"})
    (plans / "B.tokenize").write_text("records=60 sleep=0.5")  # long enough to be stopped while it runs
    bench.inv("deploy")
    bench.inv("run")
    bench.wait_state("B/tokenize", {"running"}, timeout=90)
    assert "stopped B/tokenize" in bench.inv("stop", "--dataset", "B", "--stage", "tokenize").stdout
    jobs = wait_pipeline(bench)
    # The runner ends the stopped run: what it had not started is recorded stopped too (issue 37).
    assert (jobs["B/tokenize"]["state"], jobs["B/extract"]["state"], jobs["pipeline/run"]["state"]) == ("stopped",) * 3

    hint = _hint_of(bench.inv("status", check=False).stdout, "B", "tokenize")
    assert hint == "inv rerun --failed"  # launch takes no tokenize stage: the runner's pipeline resumes
    (plans / "B.tokenize").write_text("records=2")
    bench.inv(*shlex.split(hint)[1:])  # typed as the table says it
    jobs = wait_pipeline(bench)
    assert {key: job["state"] for key, job in jobs.items()} == dict.fromkeys(jobs, "succeeded")
    assert jobs["B/tokenize"]["records"] == 2
