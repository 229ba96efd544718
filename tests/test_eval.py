"""`inv eval` end to end: the real task, host job and supervisor, against a stand-in SGLang.

Real SGLang needs a GPU and the target's weights, so the server here is
tests/stages/sglang_standin.py: it takes SGLang's launch flags, answers
``/health``, ``/server_info`` and the native ``/generate`` with ``meta_info``,
and follows a known model of speculation, so the accept lengths, speed-ups and
the best setting that `inv eval` reports can be checked against it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.eval import reports
from benchmarks.harness.stage_settings import complete
from remote.eval.eval_settings import BASELINE, EvalSettings, Server, Setting
from remote.eval.sglang import Measurement, launch_command
from benchmarks.harness.checkout import Bench, wait_for
from tests.stages import sglang_standin
from tests.helpers.evals import DRAFT_COST, GRID, PROMPTS, TOKEN_SECONDS, TOKENS, eval_inventory, journal


def expected(accept: float, point: dict) -> tuple[float, float]:
    """(accept length, speed-up) of a setting under the stand-in's model."""
    verify = sglang_standin.verifications(TOKENS, accept, "EAGLE3", point["num_steps"], point["topk"])
    spec = sglang_standin.seconds(TOKENS, verify, point["num_draft_tokens"], TOKEN_SECONDS, DRAFT_COST)
    return TOKENS / verify, sglang_standin.seconds(TOKENS, None, 0, TOKEN_SECONDS, DRAFT_COST) / spec


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.e2e
def test_eval_reports_the_accept_length_and_speed_up_the_server_saw_and_names_the_fastest_setting(
        bench: Bench, tmp_path: Path, free_port: int) -> None:
    setup = eval_inventory(bench, tmp_path, free_port, accept=0.8)

    done = bench.inv("eval", "--json", timeout=120)

    report = json.loads(done.stdout)
    configs = report["drafts"]["draft"]["configs"]  # train's draft, under its default name
    for point, config in zip(GRID, configs):
        accept_length, speedup = expected(0.8, point)
        assert {k: config[k] for k in point} == point
        assert config["accept_length"] == round(accept_length, 3)  # Σ completion_tokens / Σ spec_verify_ct
        assert config["speedup"] == pytest.approx(speedup, rel=0.2), config
    assert [round(expected(0.8, p)[1], 2) for p in GRID] == [1.24, 1.59, 1.07]  # the model: (3, 1, 4) is fastest
    assert {k: report["best"][k] for k in ("num_steps", "topk", "num_draft_tokens")} == GRID[1]
    assert report["best"]["flags"] == ["--tp-size", "2", "--max-running-requests", "48", "--speculative-algorithm", "EAGLE3",
                                       "--speculative-draft-model-path", str(setup["draft"]),
                                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                                       "--speculative-num-draft-tokens", "4"]
    assert (report["ranking"], report["serve"], report["best"]["draft"]) == (["draft"], "draft", "draft")
    assert report["baseline"]["tokens_per_s"] == pytest.approx(1 / TOKEN_SECONDS, rel=0.2)
    assert report["warnings"] == []
    assert json.loads((setup["draft"].parent / "eval.json").read_text()) == report  # next to the draft

    asked = journal(setup["journal"])
    runs = [[a["prompt"] for a in asked if a["num_steps"] == p and a["max_new_tokens"] == TOKENS]
            for p in (None, 1, 3)]
    assert sorted(runs[0]) == sorted(PROMPTS) and sorted(runs[1]) == sorted(PROMPTS)  # the same prompts each time
    assert {a["temperature"] for a in asked} == {0} and {a["algorithm"] for a in asked} == {None, "EAGLE3"}
    job = bench.status()["draft/eval"]
    assert job["state"] == "succeeded" and job["records"] == 4  # the baseline and three settings
    assert job["metrics"]["best_speedup"] == report["best"]["speedup"]
    assert not is_listening(free_port), "a server outlived the evaluation"


@pytest.mark.e2e
def test_eval_of_two_named_drafts_reports_both_by_name_and_names_the_faster_one_to_serve(
        bench: Bench, tmp_path: Path, free_port: int) -> None:
    # "mine" first in the inventory: the ranking, not the order given, puts the faster first.
    setup = eval_inventory(bench, tmp_path, free_port, accept=0.5, grid=GRID[:2], drafts={"mine": 0.2, "published": 0.8})

    report = json.loads(bench.inv("eval", "--json", timeout=120).stdout)

    assert list(report["drafts"]) == ["mine", "published"] and report["ranking"] == ["published", "mine"]
    assert report["serve"] == "published" and report["best"]["draft"] == "published"
    for name, chance in (("mine", 0.2), ("published", 0.8)):
        entry = report["drafts"][name]
        assert entry["path"] == setup["drafts"][name]
        assert [c["accept_length"] for c in entry["configs"]] == [round(expected(chance, p)[0], 3) for p in GRID[:2]]
        fastest = max(GRID[:2], key=lambda p: expected(chance, p)[1])
        assert {k: entry["best"][k] for k in fastest} == fastest
        assert entry["best"]["flags"][entry["best"]["flags"].index("--speculative-draft-model-path") + 1] == entry["path"]
    # The model: "mine" is slower than none by a sixth at best, a margin a loaded machine's stalls keep (TOKEN_SECONDS).
    assert [round(expected(0.2, p)[1], 2) for p in GRID[:2]] == [0.84, 0.67]
    assert report["drafts"]["mine"]["best"]["speedup"] < 1 < report["drafts"]["published"]["best"]["speedup"]
    assert report["warnings"] == []  # one draft beats the baseline: nothing to warn of
    assert not (setup["draft"].parent / "eval.json").exists()  # train's draft was not among those compared

    asked = journal(setup["journal"])
    assert [a["prompt"] for a in asked if a["algorithm"] is None and a["max_new_tokens"] == TOKENS]  # one baseline
    for draft in (None, *setup["drafts"].values()):
        for point in ([None] if draft is None else GRID[:2]):
            prompts = [a["prompt"] for a in asked if a["draft"] == draft and a["max_new_tokens"] == TOKENS
                       and a["num_steps"] == (point and point["num_steps"])]
            assert sorted(prompts) == sorted(PROMPTS), (draft, point)  # the same prompts on every server
    assert {a["max_running_requests"] for a in asked} == {48}  # every server batches alike
    job = bench.status()["draft/eval"]
    # The baseline once, then 2 drafts x 2 settings: what `inv status` counted towards, and its time left.
    assert (job["state"], job["records"], job["total"], job["done"]) == ("succeeded", 5, 5, 5)
    assert not is_listening(free_port)


@pytest.mark.e2e
def test_a_draft_that_is_not_there_is_named_in_one_line_before_any_server_starts(
        bench: Bench, tmp_path: Path, free_port: int) -> None:
    setup = eval_inventory(bench, tmp_path, free_port, accept=0.5, grid=GRID[:1], drafts={"good": 0.5, "gone": 0.5})
    (Path(setup["drafts"]["gone"]) / "config.json").unlink()

    done = bench.inv("eval", check=False, timeout=60)

    assert done.returncode != 0
    [line] = [x for x in done.stderr.splitlines() if x.strip()]  # the error: one line
    assert f"draft 'gone': no draft at {setup['drafts']['gone']} (no config.json)" in line and "stages.eval.drafts.gone" in line
    assert "'good'" not in line and "Traceback" not in done.stdout + done.stderr
    assert not setup["journal"].exists() and not list((bench.root / "data" / "draft").glob("eval/server-*.log"))


@pytest.mark.e2e
def test_eval_warns_loudly_when_the_draft_is_never_accepted_and_serving_gets_slower(
        bench: Bench, tmp_path: Path, free_port: int) -> None:
    eval_inventory(bench, tmp_path, free_port, accept=0.0, grid=GRID[1:2])

    done = bench.inv("eval", timeout=120)

    assert "WARNING" in done.stdout and "about 1.0" in done.stdout and "SLOWER" in done.stdout, done.stdout
    assert "--speculative-algorithm EAGLE3" in done.stdout and "1.00" in done.stdout
    assert "serve no draft: none beats the baseline" in done.stdout, done.stdout
    assert not is_listening(free_port)


@pytest.mark.e2e
def test_inv_stop_ends_the_evaluation_and_its_server(bench: Bench, tmp_path: Path, free_port: int) -> None:
    eval_inventory(bench, tmp_path, free_port, accept=0.5, token_seconds=5.0)
    following = subprocess.Popen([sys.executable, "-m", "invoke", "eval", "-i", "test"], cwd=bench.checkout,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: setup_is_serving(bench, free_port), 30, "the baseline server to answer")

        bench.inv("stop", "-d", "draft")

        assert not is_listening(free_port), "the server outlived inv stop"
        assert bench.wait_state("draft/eval", {"stopped"}, timeout=20)["state"] == "stopped"
        output, _ = following.communicate(timeout=30)
        assert following.returncode != 0 and "stopped" in output, output
    finally:
        following.kill()


def setup_is_serving(bench: Bench, port: int) -> bool:
    return is_listening(port) and bench.poll().get("draft/eval", {}).get("state") == "running"


def test_the_launch_command_is_sglang_s_with_the_inventory_s_flags_and_the_setting_s() -> None:
    settings = EvalSettings.from_config(complete("eval", {
        "launcher": "{python} -m sglang.launch_server", "model": "/m/Kimi K2.5", "port": 30100,
        "server_args": ["--tp-size", "8", "--trust-remote-code"], "drafts": {"draft": "/r/data/draft/train/draft"}}))

    baseline = launch_command(settings, BASELINE)
    speculative = launch_command(settings, Server("draft", "/r/data/draft/train/draft", Setting(3, 1, 4)))

    assert baseline.endswith("-m sglang.launch_server --model-path '/m/Kimi K2.5' --host 127.0.0.1 --port 30100 "
                             "--tp-size 8 --trust-remote-code --max-running-requests 48")  # SGLang's speculative cap, on both
    assert speculative == baseline + (" --speculative-algorithm EAGLE3 --speculative-draft-model-path "
                                      "/r/data/draft/train/draft --speculative-num-steps 3 "
                                      "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    sglang_standin.parse(speculative.split(" ", 3)[-1].replace("'/m/Kimi K2.5'", "/m/Kimi").split())  # flags SGLang takes


def test_the_servers_are_the_baseline_once_then_every_draft_with_every_setting_in_the_inventory_s_order() -> None:
    settings = EvalSettings.from_config(complete("eval", {"model": "/m", "drafts": {"b": "/d/b", "a": "/d/a"},
                                                          "grid": GRID[:2]}))

    servers = settings.servers()

    assert servers[0] == BASELINE and servers[0].flags() == [] and servers[0].slug() == "baseline"
    assert [(s.draft, s.path, s.setting) for s in servers[1:]] == [
        (name, f"/d/{name}", Setting.of(point)) for name in ("b", "a") for point in GRID[:2]]
    assert len({s.slug() for s in servers}) == len(servers)  # one log file each
    assert servers[1].flags()[servers[1].flags().index("--speculative-draft-model-path") + 1] == "/d/b"


def test_the_report_names_the_fastest_setting_and_warns_on_slower_serving_and_unused_drafts() -> None:
    baseline = Measurement(completion_tokens=900, verify_ct=0, seconds=10.0, requests=3)
    good, unused = Server("last", "/d", Setting(3, 1, 4)), Server("last", "/d", Setting(5, 1, 6))

    report = reports.build(baseline, [(good, Measurement(900, 421, 10.9, 3)), (unused, Measurement(900, 880, 12.0, 3))],
                           [])

    assert report["baseline"]["tokens_per_s"] == 90.0
    assert [c["accept_length"] for c in report["drafts"]["last"]["configs"]] == [2.138, 1.023]
    assert report["best"]["num_steps"] == 3 and report["best"]["speedup"] == pytest.approx(0.917, abs=0.001)
    assert report["serve"] is None and report["ranking"] == ["last"]  # slower than none: serve none
    assert any("about 1.0" in w and "last, num_steps 5" in w for w in report["warnings"])
    assert any("SLOWER with the draft" in w and "82.6 tok/s against 90.0" in w for w in report["warnings"])
    no_spec = reports.build(baseline, [(good, Measurement(900, 0, 9.0, 3))], [])
    assert any("no spec_verify_ct" in w for w in no_spec["warnings"])


def test_the_report_ranks_the_drafts_by_their_best_setting_and_serves_only_one_that_beats_the_baseline() -> None:
    baseline = Measurement(completion_tokens=900, verify_ct=0, seconds=10.0, requests=3)  # 90 tok/s
    runs = {("old", Setting(3, 1, 4)): 9.5, ("old", Setting(5, 1, 6)): 8.0,  # old's best: 112.5 tok/s at (5, 1, 6)
            ("new", Setting(3, 1, 4)): 6.0, ("new", Setting(5, 1, 6)): 7.5}  # new's best: 150 tok/s at (3, 1, 4)
    results = [(Server(name, f"/d/{name}", setting), Measurement(900, 300, seconds, 3))
               for (name, setting), seconds in runs.items()]

    report = reports.build(baseline, results, ["--tp-size", "8"])

    assert report["ranking"] == ["new", "old"] and report["serve"] == "new" and report["best"]["draft"] == "new"
    assert (report["drafts"]["old"]["best"]["num_steps"], report["drafts"]["new"]["best"]["num_steps"]) == (5, 3)
    assert report["drafts"]["old"]["best"]["flags"] == ["--tp-size", "8", *Setting(5, 1, 6).flags("/d/old")]
    assert report["drafts"]["new"]["best"]["speedup"] == pytest.approx(1.667, abs=0.001)
    assert report["warnings"] == []
    slower = reports.build(Measurement(900, 0, 5.0, 3), results, [])  # 180 tok/s without a draft
    assert slower["serve"] is None and slower["ranking"] == ["new", "old"]
    [warning] = slower["warnings"]
    assert "SLOWER with every one of the 2 drafts" in warning and "the fastest, new with steps 3" in warning


def test_the_drafts_are_checked_before_any_server_with_one_line_naming_each_bad_one(tmp_path: Path) -> None:
    from remote.eagle3 import StageInputError
    from remote.stages.eval import check_drafts

    trained = tmp_path / "train" / "draft"
    for name, config in (("good", "{}"), ("torn", "{\"archi"), ("list", "[]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config)
    (tmp_path / "empty").mkdir()
    check_drafts({"good": str(tmp_path / "good")}, trained)

    with pytest.raises(StageInputError) as raised:
        check_drafts({"good": str(tmp_path / "good"), "draft": str(trained), "empty": str(tmp_path / "empty"),
                      "torn": str(tmp_path / "torn"), "list": str(tmp_path / "list")}, trained)

    message = str(raised.value)
    assert "\n" not in message and "'good'" not in message
    assert f"draft 'draft': no draft at {trained} (no such directory): train first" in message
    assert f"draft 'empty': no draft at {tmp_path / 'empty'} (no config.json): fix stages.eval.drafts.empty" in message
    assert message.count("its config.json is not a JSON object") == 2  # torn, and a list


def test_the_inventory_names_drafts_as_it_names_datasets_and_says_draft_is_now_drafts(tmp_path: Path) -> None:
    from local.exceptions import AerieError
    from local.inventory.schema import load

    def inventory(eval_settings: dict) -> Path:
        path = tmp_path / "inventory.yaml"
        path.write_text(json.dumps({"backend": "local", "host": {"root": str(tmp_path / "root")},
                                    "stages": {"eval": eval_settings}}))
        return path

    assert load(str(inventory({"drafts": {"mine": "/d/a", "k2.5-eagle3_v1": "/d/b"}}))).stages.eval.drafts == {
        "mine": "/d/a", "k2.5-eagle3_v1": "/d/b"}
    assert load(str(inventory({}))).stages.eval.drafts is None  # train's, resolved by `inv eval`
    for settings, said in (({"draft": "/d/a"}, "`draft` is now `drafts`, by name: write `drafts: {draft: PATH}`"),
                           ({"draft": "/d/a", "drafts": {"a": "/d/a"}}, "`draft` is now `drafts`"),
                           ({"drafts": {"my draft": "/d/a"}}, "'my draft' is not a draft name: use letters"),
                           ({"drafts": {"../x": "/d/a"}}, "'../x' is not a draft name"),
                           ({"drafts": {"a": ""}}, "a: the draft's path is empty"),
                           ({"drafts": {}}, "stages.eval.drafts: name at least one draft")):
        with pytest.raises(AerieError) as raised:
            load(str(inventory(settings)))
        assert said in str(raised.value) and "\n" not in str(raised.value), raised.value


def test_inv_eval_sends_train_s_draft_under_its_default_name_or_the_drafts_named() -> None:
    from local.jobs.specs import eval_spec
    from local.inventory.schema import load

    inventory = load("local")
    root = inventory.host.root
    assert eval_spec(inventory)["config"]["stage"]["drafts"] == {"draft": f"{root}/data/draft/train/draft"}
    inventory.stages.eval.drafts = {"published": "{root}/models/k2.5-eagle3", "mine": "/d/mine"}
    assert eval_spec(inventory)["config"]["stage"]["drafts"] == {"published": f"{root}/models/k2.5-eagle3", "mine": "/d/mine"}


def test_the_report_shows_every_draft_ranked_with_its_flags_and_which_to_serve() -> None:
    import io

    from rich.console import Console

    from local.views.eval_report import show

    baseline = Measurement(completion_tokens=900, verify_ct=0, seconds=10.0, requests=3)
    results = [(Server("mine", "/d/mine", Setting(3, 1, 4)), Measurement(900, 450, 12.0, 3)),
               (Server("published", "/d/pub", Setting(3, 1, 4)), Measurement(900, 300, 6.0, 3))]
    console = Console(file=io.StringIO(), width=160, force_terminal=False)

    show({**reports.build(baseline, results, []), "prompts": 3, "max_new_tokens": 300}, console)

    out = console.file.getvalue()  # type: ignore[attr-defined]
    ranked = [line.split("│")[2].strip() for line in out.splitlines() if re.match(r"│ +[12] │", line)]
    assert ranked == ["published", "mine"], out  # "mine" came first in the inventory
    assert "published │          3.00 │ 150.0 │ 1.67 (serve)" in out and "mine      │          2.00 │  75.0 │         0.83 │" in out
    assert "1. published: launch with\n  --speculative-algorithm EAGLE3 --speculative-draft-model-path /d/pub" in out
    assert "2. mine: launch with" in out
    assert "serve published: speed-up 1.67 over no draft (150.0 against 90.0 tok/s)" in out


def test_eval_refuses_to_share_the_gpu_with_a_running_pipeline_or_gpu_job() -> None:
    from local.tasks.evaluation import gpu_holders

    def job(key: str, state: str) -> dict:
        dataset, stage = key.split("/")
        return {"dataset": dataset, "stage": stage, "state": state}

    busy = {"jobs": [job("A1/prep", "running"), job("draft/train", "running"), job("pipeline/run", "stalled"),
                     job("B5/extract", "waiting"), job("B5/infer", "failed")]}

    assert gpu_holders(busy) == ["draft/train", "pipeline/run"]
    assert gpu_holders({"jobs": [job("A1/prep", "running"), job("B5/extract", "waiting")]}) == []
