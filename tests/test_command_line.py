"""The command line as Invoke users expect it: a short flag means one thing in every task, `--watch` and `-n`
take an optional value, a missing or misplaced flag is one line, and one command line runs on one inventory."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from invoke import Exit
from invoke.parser import Parser

import tasks
from benchmarks.harness.checkout import REPO, Bench, copy_checkout
from local.cli import number, one_inventory
from local.inventory.stages import stage_names


def parse(*argv: str) -> list[dict]:
    """What Invoke's own parser makes of `inv ARGV` against tasks.py: each task's keyword arguments."""
    return [context.as_kwargs for context in Parser(contexts=tasks.ns.to_contexts()).parse_argv(list(argv))]


def inv(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_a_short_flag_means_one_thing_in_every_task() -> None:
    meanings: dict[str, set[str]] = defaultdict(set)
    for context in tasks.ns.to_contexts():
        for arg in context.args.values():
            for short in (n for n in arg.names if len(n) == 1):
                meanings[short].add(arg.name)
    assert {short: names for short, names in meanings.items() if len(names) > 1} == {}
    assert (meanings["d"], meanings["f"], meanings["s"]) == ({"dataset"}, {"follow"}, {"stage"})


def test_watch_and_n_take_a_value_or_none() -> None:
    assert parse("status", "--watch")[0]["watch"] is True
    assert parse("status", "-w", "5")[0]["watch"] == "5"
    assert parse("status", "--watch", "-i", "gpu")[0] == {"inventory": "gpu", "json": False, "watch": True}
    assert parse("logs", "A1", "-n")[0]["n"] is True and parse("logs", "A1", "-n", "7")[0]["n"] == "7"
    assert [number(True, "--watch", float, bare=tasks.WATCH), number("0.5", "--watch", float, bare=tasks.WATCH)] == [
        tasks.WATCH, 0.5]
    assert number(True, "-n", int, bare=tasks.LINES) == tasks.LINES


def test_deploy_s_dry_run_has_its_long_form_only_and_rerun_s_failed_no_negation() -> None:
    assert parse("deploy", "--dry-run")[0]["dry_run"] is True
    assert parse("deploy", "-d", "B3")[0]["dataset"] == "B3"
    rerun = next(c for c in tasks.ns.to_contexts() if c.name == "rerun")
    assert "--no-failed" not in rerun.inverse_flags and parse("rerun", "--failed")[0]["failed"] is True


def test_deploy_with_a_dataset_is_refused_in_one_line_before_anything_runs() -> None:
    done = inv("deploy", "-d", "B3")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "aerie: deploy sends the whole checkout, for every dataset: it takes no -d/--dataset (`inv deploy --dry-run` "
        "lists what it would send); `inv launch -d B3 --stage STAGE` starts a dataset's job"]


def test_launch_without_a_stage_names_the_stages_in_one_line() -> None:
    done = inv("launch", "-d", "B5")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"aerie: name the stage to launch: `inv launch --stage STAGE -d B5`, STAGE one of {', '.join(stage_names())}"]


def test_tasks_on_two_inventories_are_named_with_both_ways_to_write_it() -> None:
    with pytest.raises(Exit) as refused:
        one_inventory([("deploy", "local", "the default"), ("rerun --failed", "seed", "-i")])
    assert refused.value.code == 2 and refused.value.message == (
        "aerie: one command line runs on one inventory, not `deploy` on local (the default), `rerun --failed` on seed: "
        "give -i to each task (`inv deploy -i seed rerun --failed -i seed`) or set it once "
        "(`INVOKE_INVENTORY=seed inv deploy rerun --failed`)")
    one_inventory([("deploy", "local", "the default"), ("rerun", "inventories/local.yaml", "-i")])  # one file, two names
    with pytest.raises(Exit, match=r"`demo` on local \(always\): give -i to each task \(`inv deploy -i local demo`\)"):
        one_inventory([("deploy", "gpu", "-i"), ("demo", "local", "always")])


@pytest.mark.parametrize("argv", [
    ["deploy", "rerun", "-i", "seed", "--failed"],
    ["deploy", "status", "--watch", "-i", "seed", "rerun", "-d", "A1,B5"],  # `--watch rerun` would not parse
    ["validate", "-i", "x", "logs", "B5", "-n", "--stage", "a b", "launch", "-s", "prep", "--force"],
])
def test_the_ways_a_refusal_offers_parse_as_written_and_name_one_inventory(argv: list[str]) -> None:
    done = inv(*argv)
    assert (done.returncode, done.stdout, len(done.stderr.splitlines())) == (2, "", 1), done.stderr
    offered = re.findall(r"`((?:INVOKE_INVENTORY=\S+ )?inv [^`]+)`", done.stderr)
    assert offered and all(" -i " in way or way.startswith("INVOKE_INVENTORY=") for way in offered), done.stderr
    for way in offered:
        words = shlex.split(way.partition("inv ")[2])
        parsed = Parser(contexts=tasks.ns.to_contexts()).parse_argv(words)
        assert [context.name for context in parsed] == [w for w in argv if w in tasks.ns.task_names], way
        assert len({context.as_kwargs.get("inventory") for context in parsed}) == 1, way


@pytest.mark.e2e
def test_deploy_rerun_with_i_on_rerun_only_is_refused_and_with_i_on_each_reruns(tmp_path: Path) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    fixed = tmp_path / "fixed"
    bench.scripted({"bad": f"records=1 exit=3 unless={fixed}"})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    bench.wait_state("bad/prep", {"failed"})
    fixed.write_text("")
    releases = sorted((bench.root / "releases").iterdir())

    refused = bench.inv("deploy", "rerun", "-i", "test", "--failed", check=False)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.splitlines() == [
        "aerie: one command line runs on one inventory, not `deploy` on local (the default), `rerun --failed` on "
        "test: give -i to each task (`inv deploy -i test rerun --failed -i test`) or set it once "
        "(`INVOKE_INVENTORY=test inv deploy rerun --failed`)"]
    assert not (bench.checkout / ".aerie" / "local").exists(), "deploy went to the default inventory's root"
    assert bench.poll()["bad/prep"]["state"] == "failed" and sorted((bench.root / "releases").iterdir()) == releases

    done = bench.inv("deploy", "-i", "test", "rerun", "-i", "test", "--failed")
    assert "Nothing to deploy" in done.stdout and "relaunched bad/prep" in done.stdout
    assert bench.wait_state("bad/prep", {"succeeded", "failed"})["state"] == "succeeded"
    watched = bench.inv("status", "--watch")  # no number: every 2 s; piped, it ends when every job has
    assert "1 job: 1 succeeded" in watched.stdout


def readme_tasks_table() -> dict[str, list[list[str]]]:
    """The commands in the first column of README's Tasks table, by task, each as words without its brackets."""
    text = (REPO / "README.md").read_text()
    table = text[text.index("| task |", text.index("## Tasks")):]
    table = table[:table.index("\n\n")]
    commands: dict[str, list[list[str]]] = defaultdict(list)
    for row in table.splitlines()[2:]:
        for command in re.findall(r"`inv ([^`]+)`", row.split(" | ")[0]):
            words = command.replace("[", " ").replace("]", " ").split()
            commands[words[0]].append(words)
    return commands


def test_readme_s_tasks_table_parses_against_tasks_py_and_shows_every_flag() -> None:
    table = readme_tasks_table()
    contexts = {context.name: context for context in tasks.ns.to_contexts()}
    assert set(table) == set(contexts)
    for name, commands in table.items():
        shown = set()
        for words in commands:
            parsed = Parser(contexts=contexts.values()).parse_argv(words)  # a flag the task lacks: ParseError
            shown |= {arg.name for arg in parsed[0].args.values() if arg.got_value}
        # -i is in every task (said above the table); deploy's -d is there to be refused
        unshown = {arg.name for arg in contexts[name].args.values()} - shown - {"inventory"}
        assert unshown == ({"dataset"} if name == "deploy" else set()), name
