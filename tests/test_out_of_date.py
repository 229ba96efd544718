"""Settings changed means out of date (issue 37, point 4): a succeeded job whose spec, or what it reads,
changed since it ran runs again; an unchanged one is up to date and kept, unless forced. The host's rule
(remote/control_plane/freshness.py) over job records written as a supervisor writes them, and the lines
the workstation prints for it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from local.jobs import pipeline, specs
from local.inventory.schema import load
from remote.control_plane import freshness
from remote.vocabulary import layout
from remote.control_plane.progress import write_json_atomic


def inventory(tmp_path: Path, layers: list[int] = [2, 30, 58], max_length: int = 2048) -> object:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "inv.yaml"
    path.write_text(
        f"backend: local\nhost: {{root: {tmp_path / 'root'}}}\n"
        f"stages: {{extract: {{layers: {layers}}}, prep: {{max_length: {max_length}}}}}\n"
        "datasets:\n  A1: {source: a.jsonl, kind: native}\n")
    return load(str(path))


def ran(root: Path, spec: dict, started: float, ended: float, state: str = "succeeded") -> None:
    """A job's record as its supervisor leaves it: the spec it ran with, its state and times."""
    directory = layout.job_dir(root, spec["dataset"], spec["stage"])
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / layout.SPEC, spec)
    write_json_atomic(directory / layout.STATE, {"state": state, "started_at": started, "ended_at": ended,
                                                 "executor": "process", "exit_code": 0})


def plan_of(inv: object) -> list[dict]:
    return pipeline.runner_spec(inv, None, "offline")["config"]["stage"]["plan"]


def ran_pipeline(root: Path, plan: list[dict], start: float = 1000.0) -> None:
    """Every job of `plan` succeeded once, each after the one before it."""
    for index, node in enumerate(plan):
        ran(root, node["spec"], start + 10 * index, start + 10 * index + 5)


def test_a_job_that_succeeded_with_the_spec_it_is_given_is_up_to_date_and_bookkeeping_is_no_setting(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    root = Path(inv.host.root)
    spec = specs.spec(inv, "A1", "prep")
    ran(root, spec | {"after": ["x"], "order": 4}, 1000, 1005)

    assert freshness.staleness(root, spec) == {}


def test_an_edited_setting_makes_a_succeeded_job_out_of_date_naming_the_setting(tmp_path: Path) -> None:
    root = Path(inventory(tmp_path / "a").host.root)
    before = specs.spec(inventory(tmp_path / "a"), "A1", "prep")
    ran(root, before, 1000, 1005)
    after = specs.spec(inventory(tmp_path / "a", max_length=512), "A1", "prep")

    assert freshness.staleness(root, after) == {"changes": [[["config", "stage", "max_length"], 2048, 512]]}


def test_a_job_that_did_not_succeed_is_not_up_to_date_whatever_its_spec(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    root = Path(inv.host.root)
    spec = specs.spec(inv, "A1", "prep")
    assert freshness.staleness(root, spec) == {"state": "not started"}
    ran(root, spec, 1000, 1005, state="failed")
    assert freshness.staleness(root, spec) == {"state": "failed"}


def test_a_job_is_out_of_date_when_what_it_reads_succeeded_after_it_started(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    root = Path(inv.host.root)
    prep, extract = specs.spec(inv, "A1", "prep"), specs.spec(inv, "A1", "extract")  # extract reads prep's by default
    ran(root, prep, 1000, 1005)
    ran(root, extract, 1010, 1020)
    assert freshness.staleness(root, extract) == {}

    ran(root, prep, 1030, 1040)  # `inv launch --stage prep --force` after the extract

    assert freshness.staleness(root, extract) == {"rebuilt": ["A1/prep"]}


def test_a_draft_named_outside_the_root_that_changed_after_the_evaluation_makes_it_out_of_date(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    root = Path(inv.host.root)
    draft = tmp_path / "published"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    inv.stages.eval.model = "/m"
    inv.stages.eval.drafts = {"published": str(draft)}
    spec = specs.eval_spec(inv)
    ran(root, spec, time.time() + 60, time.time() + 70)  # measured after the draft was written
    assert freshness.staleness(root, spec) == {}

    later = time.time() + 120
    os.utime(draft / "config.json", (later, later))  # new weights copied over the old ones

    assert freshness.staleness(root, spec) == {"changed_files": [str(draft)]}


def test_trains_draft_retrained_after_the_evaluation_makes_it_out_of_date(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    root = Path(inv.host.root)
    inv.stages.eval.model = "/m"
    spec = specs.eval_spec(inv)
    train = [n["spec"] for n in plan_of(inv) if n["key"] == "draft/train"][0]
    ran(root, train, 1000, 1005)
    ran(root, spec, 1010, 1020)
    assert freshness.staleness(root, spec) == {}

    ran(root, train, 1030, 1040)

    assert freshness.staleness(root, spec) == {"rebuilt": ["draft/train"]}


def test_a_pipeline_leaves_out_its_up_to_date_jobs_and_runs_again_whatever_comes_after_a_changed_one(tmp_path: Path) -> None:
    before = inventory(tmp_path / "a")
    root = Path(before.host.root)
    ran_pipeline(root, plan_of(before))

    kept, current, stale = freshness.prune(root, plan_of(before))
    assert (kept, current, stale) == ([], ["A1/prep", "A1/extract", "draft/train"], {})

    kept, current, stale = freshness.prune(root, plan_of(inventory(tmp_path / "a", layers=[1, 2, 3])))
    assert current == ["A1/prep"] and [n["key"] for n in kept] == ["A1/extract", "draft/train"]
    assert [n["needs"] for n in kept] == [[], ["A1/extract"]]  # a need up to date is met already
    assert stale["A1/extract"] == {"changes": [[["config", "stage", "layers"], [2, 30, 58], [1, 2, 3]]]}
    # train's own settings are unchanged (online aside, layers are extract's): it reads what runs again.
    assert stale["draft/train"] == {"rebuilt": ["A1/extract"]}


def test_the_workstation_names_each_reason_as_the_inventory_names_it() -> None:
    from local.tasks.job_verbs import out_of_date_lines

    said = out_of_date_lines({
        "A1/extract": {"changes": [[["config", "stage", "layers"], [2], [1]]], "rebuilt": ["A1/prep"]},
        "draft/eval": {"changed_files": ["/d/published"]}})

    assert said == ["A1/extract is out of date: stages.extract.layers [2] -> [1]; it reads A1/prep, which is newer "
                    "or runs again",
                    "draft/eval is out of date: /d/published changed after it ran"]


def test_a_spec_names_what_it_reads_and_no_file_it_writes(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    inv.stages.eval.model = "/m"
    inv.stages.eval.server_env = {"HF_HOME": str(tmp_path)}  # a cache the server writes: no input
    spec = specs.eval_spec(inv)
    root = Path(inv.host.root)

    assert freshness.upstream_keys(root, spec) == ["draft/train"]
    assert freshness.outside_paths(root, spec) == []
    assert json.dumps(spec)  # the spec as sent


# -- `inv eval` end to end, against the stand-in SGLang of tests/test_eval.py ----------------------------------


def edit_eval(bench: object, **settings: object) -> None:
    """Edit `stages.eval` in the bench's inventory, as a user edits the file (no deploy: eval's spec is sent)."""
    import yaml

    path = bench.checkout / "inventories" / "test.yaml"
    document = yaml.safe_load(path.read_text())
    document["stages"]["eval"].update(settings)
    path.write_text(yaml.safe_dump(document))


def measured_steps(journal_path: Path) -> set[int]:
    """The `--speculative-num-steps` of every server the stand-in answered with a draft."""
    from tests.helpers.evals import TOKENS, journal

    return {a["num_steps"] for a in journal(journal_path) if a["max_new_tokens"] == TOKENS and a["num_steps"]}


@pytest.mark.e2e
def test_inv_eval_measures_an_edited_grid_and_says_an_unchanged_one_is_up_to_date_until_forced(
        bench: object, tmp_path: Path, free_port: int) -> None:
    from tests.helpers.evals import GRID, eval_inventory, journal

    setup = eval_inventory(bench, tmp_path, free_port, accept=0.8, grid=GRID[:1])
    bench.inv("eval", timeout=120)
    assert measured_steps(setup["journal"]) == {1}
    assert "out_of_date" not in bench.status()["draft/eval"]

    edit_eval(bench, grid=GRID[1:2])
    assert bench.status()["draft/eval"]["out_of_date"] == "settings changed"
    edited = bench.inv("eval", timeout=120)

    said = " ".join(edited.stdout.split())
    assert "draft/eval is out of date: stages.eval.grid" in said and "measuring again" in said, edited.stdout
    report = json.loads((bench.root / "data" / "draft" / "eval" / "report.json").read_text())
    assert [(c["num_steps"], c["topk"]) for c in report["drafts"]["draft"]["configs"]] == [(3, 1)]  # the new grid
    assert measured_steps(setup["journal"]) == {1, 3}

    asked = len(journal(setup["journal"]))
    again = bench.inv("eval", timeout=120)
    assert "draft/eval is up to date" in " ".join(again.stdout.split()) and "--force" in again.stdout
    assert "num_steps" in again.stdout or "accept" in again.stdout.lower()  # the report is shown all the same
    assert len(journal(setup["journal"])) == asked, "an up-to-date evaluation measured again"

    forced = bench.inv("eval", "--force", timeout=120)
    assert "started draft/eval" in forced.stdout and len(journal(setup["journal"])) > asked


@pytest.mark.e2e
def test_a_new_measurement_that_fails_leaves_the_last_report_as_it_was(
        bench: object, tmp_path: Path, free_port: int) -> None:
    from tests.helpers.evals import GRID, eval_inventory

    setup = eval_inventory(bench, tmp_path, free_port, accept=0.8, grid=GRID[:1])
    bench.inv("eval", timeout=120)
    report = bench.root / "data" / "draft" / "eval" / "report.json"
    beside = setup["draft"].parent / "eval.json"
    kept = (report.read_bytes(), beside.read_bytes())

    edit_eval(bench, drafts={"draft": str(setup["draft"]), "gone": str(tmp_path / "gone")})
    failed = bench.inv("eval", check=False, timeout=120)

    assert failed.returncode != 0 and "draft 'gone': no draft at" in failed.stdout + failed.stderr
    assert bench.poll()["draft/eval"]["state"] == "failed"
    assert (report.read_bytes(), beside.read_bytes()) == kept


# -- `inv run` end to end, every stage scripted (as tests/test_pipeline.py runs them) ----------------------------


@pytest.mark.e2e
def test_inv_run_runs_again_only_what_is_out_of_date_and_force_runs_every_job(bench: object, free_port: int) -> None:
    from tests.helpers.pipelines import pipeline_inventory, traces, wait_pipeline

    plans = bench.root.parent / "plans"
    pipeline_inventory(bench, plans, free_port, {"A": "native"})
    bench.inv("deploy")
    bench.inv("run")
    assert wait_pipeline(bench)["pipeline/run"]["state"] == "succeeded"
    first = traces(plans)

    again = bench.inv("run", "--follow")
    assert "is up to date: its 3 jobs succeeded with these settings" in " ".join(again.stdout.split())
    assert traces(plans) == first, "an up-to-date job ran again"

    edit_stage(bench, "extract", shard_size=500)
    marks = {key: job.get("out_of_date") for key, job in bench.status().items()}
    assert marks == {"A/prep": None, "A/extract": "settings changed", "draft/train": "A/extract is out of date",
                     "pipeline/run": None}
    assert "out of date (settings changed)" in bench.inv("status").stdout
    edited = " ".join(bench.inv("run").stdout.split())
    assert "up to date, not run again: A/prep" in edited and "3 jobs: 2 and the runner" in edited, edited
    assert "A/extract is out of date: stages.extract.shard_size 1000 -> 500" in edited
    assert "draft/train is out of date: it reads A/extract, which is newer or runs again" in edited
    assert wait_pipeline(bench)["pipeline/run"]["state"] == "succeeded"
    second = traces(plans)
    assert second["A.prep"] == first["A.prep"]
    assert second["A.extract"]["start"] > first["draft.train"]["end"] and second["draft.train"] != first["draft.train"]

    forced = bench.inv("run", "--force")
    assert "up to date" not in forced.stdout and "4 jobs: 3 and the runner" in " ".join(forced.stdout.split())
    assert wait_pipeline(bench)["pipeline/run"]["state"] == "succeeded"
    assert all(traces(plans)[job]["start"] > second["draft.train"]["end"] for job in ("A.prep", "A.extract", "draft.train"))


def edit_stage(bench: object, stage: str, **settings: object) -> None:
    import yaml

    path = bench.checkout / "inventories" / "test.yaml"
    document = yaml.safe_load(path.read_text())
    document["stages"].setdefault(stage, {}).update(settings)
    path.write_text(yaml.safe_dump(document))


def test_status_marks_a_job_whose_settings_changed_what_reads_a_newer_output_and_what_comes_after_them(tmp_path: Path) -> None:
    from local.tasks.out_of_date import mark
    from remote.vocabulary.spec_changes import fingerprint

    before, after = inventory(tmp_path / "a"), inventory(tmp_path / "a", layers=[1, 2, 3])
    ran = {n["key"]: fingerprint(n["spec"]) for n in plan_of(before)}
    jobs = [{"dataset": key.split("/")[0], "stage": key.split("/")[1], "state": "succeeded", "fingerprint": ran[key]}
            for key in ran] + [{"dataset": "pipeline", "stage": "run", "state": "succeeded",
                                "built_from": {"datasets": ["A1"], "route": "offline"}}]

    mark(jobs, before)
    assert [j.get("out_of_date") for j in jobs] == [None, None, None, None]

    mark(jobs, after)
    assert [j.get("out_of_date") for j in jobs] == [None, "settings changed", "A1/extract is out of date", None]

    newer = {**{k: v for k, v in jobs[0].items() if k != "out_of_date"}, "newer_inputs": ["/d/a.jsonl"]}
    failed = {**{k: v for k, v in jobs[1].items() if k != "out_of_date"}, "state": "failed", "fingerprint": "x"}
    mark([newer, failed], before)
    assert newer["out_of_date"] == "/d/a.jsonl is newer" and "out_of_date" not in failed  # only a success is dated


def test_status_builds_the_specs_of_the_jobs_that_ran_only_and_still_dates_what_comes_after_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from local.tasks.out_of_date import mark
    from remote.vocabulary.spec_changes import fingerprint

    path = tmp_path / "inv.yaml"
    path.write_text(f"backend: local\nhost: {{root: {tmp_path / 'root'}}}\ndatasets:\n"
                    + "".join(f"  P{i}: {{source: p.jsonl, kind: prompts}}\n" for i in range(5)))
    inventory = load(str(path))
    prep = {"dataset": "P0", "stage": "prep", "state": "succeeded",
            "fingerprint": fingerprint(specs.spec(inventory, "P0", "prep"))}
    infer = {"dataset": "P0", "stage": "infer", "state": "succeeded", "fingerprint": "an older spec's"}
    built, build = [], specs.spec

    def counted(inventory, name, stage, **inputs):
        built.append((name, stage))
        return build(inventory, name, stage, **inputs)

    monkeypatch.setattr(specs, "spec", counted)  # what a job launched alone runs with
    monkeypatch.setattr(pipeline, "spec", counted)  # and the same job in the pipeline

    mark([prep, infer], inventory)

    # the five datasets' 16 jobs are in the plan (prep, infer, tokenize and extract each, and the draft's train),
    # but only the two that ran have their specs built, once each: the pipeline's prep and infer are as launched
    assert sorted(built) == [("P0", "infer"), ("P0", "prep")]
    assert "out_of_date" not in prep and infer["out_of_date"] == "settings changed"
    steps = pipeline.steps(inventory, None, "offline")
    assert {(s.stage, s.build() == build(inventory, s.dataset, s.stage)) for s in steps if s.as_launched} == {
        ("prep", True), ("infer", True)}


def test_the_status_table_says_out_of_date_in_the_last_column() -> None:
    from local.views.status_columns import View, message

    job = {"dataset": "A1", "stage": "extract", "state": "succeeded", "records": 2, "metrics": {},
           "message": "wrote 2 records", "out_of_date": "settings changed"}
    assert message(job, View(now=0, current_release=None)).plain == "out of date (settings changed): wrote 2 records"


@pytest.mark.e2e
def test_inv_launch_skips_an_up_to_date_job_and_runs_one_whose_settings_changed_saying_which(bench: object) -> None:
    from benchmarks.harness.checkout import wait_for

    bench.scripted({"A": "records=2"}, stall_after=600)
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    first = bench.wait_state("A/prep", {"succeeded"}, timeout=60)
    wait_for(lambda: not is_alive(first["pid"]), 10, "the supervisor to exit")  # until it has, a relaunch is refused

    kept = " ".join(bench.inv("launch", "--stage", "prep").stdout.split())
    assert "skipped A/prep: is up to date" in kept and "--dataset A --force` runs it again" in kept

    bench.scripted({"A": "records=2"}, stall_after=900)
    edited = " ".join(bench.inv("launch", "--stage", "prep").stdout.split())

    assert "launched A/prep" in edited and "A/prep is out of date: stages.prep.stall_after 600.0 -> 900.0" in edited
    wait_for_another_run = bench.wait_state("A/prep", {"succeeded"}, timeout=60)
    assert wait_for_another_run["started_at"] > first["ended_at"]


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
