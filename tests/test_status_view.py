"""The status table, rendered to a string and compared exactly (rich's own testing style)."""

from __future__ import annotations

import io

from rich.console import Console

from local.views import status_data
from local.views import status_columns, status_table
from remote.vocabulary.states import BAD, JobState

NOW = 1_000_000.0


def job(**fields) -> dict:  # noqa: ANN003
    base = {"dataset": "A1", "stage": "prep", "state": "running", "records": 0, "skipped": 0, "skip_reasons": {},
            "metrics": {}, "exit_code": None, "release": "20261129-101010-aaaa1111", "started_at": NOW - 100,
            "ended_at": None, "message": "", "waiting_for": None}
    return {**base, **fields}


def render(status: dict, width: int = 120, height: int = 24, fit: bool = False, title: str | None = None) -> str:
    console = Console(file=io.StringIO(), width=width, height=height, force_terminal=False, color_system=None)
    console.print(status_table.render(status, title=title, fit=fit))
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_no_jobs_says_so_in_words() -> None:
    assert render({"now": NOW, "current_release": None, "jobs": []}) == "No jobs yet.\n"


EXPECTED_TABLE = """\
┏━━━━━━━━━┳━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━┳━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ dataset ┃ stage ┃ state   ┃ records ┃ skipped ┃   rate ┃ elapsed ┃ eta ┃ release        ┃ last line / error                       ┃
┡━━━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━╇━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ A1      │ prep  │ running │   2,500 │   2,809 │ 25.0/s │    1:40 │   - │ aaaa1111 (old) │ step 3; most skipped: no assistant turn │
│ B5      │ prep  │ failed  │       0 │       0 │      - │    1:00 │   - │ bbbb2222       │ exit 1: KeyError: 'from'                │
└─────────┴───────┴─────────┴─────────┴─────────┴────────┴─────────┴─────┴────────────────┴─────────────────────────────────────────┘
2 jobs: 1 running, 1 failed
"""


def test_the_table_shows_counts_top_skip_reason_rate_elapsed_and_an_old_release() -> None:
    status = {"now": NOW, "current_release": "20261129-111111-bbbb2222", "jobs": [
        job(records=2500, skipped=2809, skip_reasons={"no assistant turn": 2800, "unknown role 'x'": 9},
            message="step 3"),
        job(dataset="B5", state="failed", exit_code=1, ended_at=NOW - 40, release="20261129-111111-bbbb2222",
            message="exit 1: KeyError: 'from'"),
    ]}
    assert render(status, width=140) == EXPECTED_TABLE


def test_headers_are_the_documented_columns_in_order() -> None:
    assert [c.header for c in status_columns.COLUMNS] == [
        "dataset", "stage", "state", "records", "skipped", "rate", "elapsed", "eta", "release", "last line / error"]


def test_every_state_has_a_colour_and_the_bad_ones_make_status_fail() -> None:
    assert set(status_columns.STATE_STYLES) == set(JobState)
    assert BAD == {JobState.FAILED, JobState.DIED, JobState.EMPTY, JobState.STALLED, JobState.BROKEN, JobState.BLOCKED}
    for state in JobState:
        assert status_data.any_bad({"jobs": [job(state=state.value)]}) == (state in BAD)


def test_states_are_declared_in_lifecycle_order_and_know_if_they_are_terminal() -> None:
    assert [s.value for s in JobState] == [
        "waiting", "running", "stalled", "succeeded", "empty", "failed", "blocked", "died", "stopped", "broken"]
    assert [s.value for s in JobState if not s.is_terminal()] == ["waiting", "running", "stalled"]


def test_json_rows_carry_the_documented_keys() -> None:
    rows = status_data.as_json({"jobs": [job(extra="not shown")]})
    assert {"dataset", "stage", "state", "records", "skipped", "skip_reasons", "exit_code", "release",
            "started_at", "ended_at", "message"} <= set(rows[0])
    assert "extra" not in rows[0]


def test_waiting_jobs_say_what_they_wait_for() -> None:
    out = render({"now": NOW, "current_release": None, "jobs": [job(state="waiting", waiting_for=["A1/prep"])]})
    assert "waits for A1/prep" in out


def pipeline_status() -> dict:
    """An `inv run` of 10 prompts datasets (4 stages each), the draft and the runner: 42 jobs, mid-way."""
    jobs = []
    for i, name in enumerate(["A1", "B5", "B8", "C1", "C2", "C3", "D1", "D2", "D3", "D4"]):
        states = (["succeeded"] * 4 if i < 4 else
                  ["succeeded", "running", "waiting", "waiting"] if i == 4 else
                  ["succeeded", "failed", "waiting", "waiting"] if i == 5 else
                  ["running", "waiting", "waiting", "waiting"] if i < 8 else
                  ["succeeded", "waiting", "waiting", "waiting"])
        for stage, state in zip(["prep", "infer", "tokenize", "extract"], states):
            fields: dict = {}
            if state == "succeeded":
                fields = dict(records=2000 + i, ended_at=NOW - 10, metrics={"rows": 2000 + i, "tokens": 626000},
                              message=f"kept {2000 + i} of {2000 + i} rows, 626000 tokens")
            elif state == "running" and stage == "infer":
                fields = dict(records=500, eta_s=3700.0, message="answering prompts (0 done before)",
                              metrics={"concurrency": 24, "tokens_per_s": 1234.5, "retries": 0})
            elif state == "running":
                fields = dict(records=500, eta_s=600.0, metrics={"rows": 900}, message="reading rows.jsonl")
            elif state == "failed":
                fields = dict(exit_code=1, ended_at=NOW - 5, message=(
                    "infer C3: 120 of 83288 prompts not answered (http 500: 120) by http://127.0.0.1:30000/v1; "
                    "check the server, then `inv rerun --failed` continues where this stopped"))
            elif state == "waiting":
                fields = dict(started_at=None, waiting_for=[f"{name}/prep"])
            jobs.append(job(dataset=name, stage=stage, state=state, **fields))
    jobs.append(job(dataset="draft", stage="train", state="waiting", started_at=None, waiting_for=["A1/extract"]))
    jobs.append(job(dataset="pipeline", stage="run", records=20, eta_s=36000.0, eta_complete=False,
                    message="inference server healthy"))
    gpus = [{"index": i, "uuid": f"GPU-{i}", "utilization": 95 + i % 3, "memory_used": 70000, "memory_total": 81559,
             "held_by": ["inference server"]} for i in range(8)]
    return {"now": NOW, "current_release": "20261129-101010-aaaa1111", "jobs": jobs, "gpus": gpus}


EXPECTED_WATCH = """\
gpu:/root/eagle3-train
dataset    stage      state       records    rate       eta   last line / error 
────────────────────────────────────────────────────────────────────────────────
C3         infer      failed            0       -         -   infer C3: 120 of …
C2         infer      running         500   5.0/s     1h01m   c=24 1,234 tok/s …
D1         prep       running         500   5.0/s     10:00   rows=900 reading …
D2         prep       running         500   5.0/s     10:00   rows=900 reading …
pipeline   run        running          20   0.2/s   ≥10h00m   inference server …
D3         infer +2   waiting           0       -         -   waits for D3/prep 
D4         infer +2   waiting           0       -         -   waits for D4/prep 
draft      train      waiting           0       -         -   waits for A1/extr…
A1         4 stages   succeeded     2,000       -         -   kept 2000 of 2000…
B5         4 stages   succeeded     2,001       -         -   kept 2001 of 2001…
B8         4 stages   succeeded     2,002       -         -   kept 2002 of 2002…
C1         4 stages   succeeded     2,003       -         -   kept 2003 of 2003…
C3/infer failed: infer C3: 120 of 83288 prompts not answered (http 500: 120) by 
http://127.0.0.1:30000/v1; check the server, then `inv rerun --failed` continues
where this stopped
GPUs 0-7: util 95-97%, mem 547/637 GiB, inference server
ETA ≥10h00m · 1,234 tok/s
42 jobs: 17 waiting, 4 running, 20 succeeded, 1 failed
"""


def test_a_42_job_watch_fits_80x24_with_succeeded_stages_folded_and_the_failure_in_full() -> None:
    out = render(pipeline_status(), width=80, height=24, fit=True, title="gpu:/root/eagle3-train")
    assert out == EXPECTED_WATCH
    assert len(out.splitlines()) <= 24


def test_a_shorter_terminal_folds_finished_and_waiting_datasets_then_running_rows_but_never_failures() -> None:
    out = render(pipeline_status(), width=80, height=16, fit=True)
    assert len(out.splitlines()) <= 16
    assert "C3/infer failed: infer C3: 120 of 83288 prompts not answered" in out  # still in full
    folded = [line for line in out.splitlines() if line.startswith("4 datasets")]  # A1..C1 in one row
    assert len(folded) == 1 and "succeeded" in folded[0] and "A1, B5, B8, C1" in folded[0]
    tiny = render(pipeline_status(), width=80, height=12, fit=True)
    assert len(tiny.splitlines()) <= 12
    assert "39 more: 17 waiting, 2 ru" in tiny and "C3/infer failed" in tiny  # the jobs out of view, by state


def test_printed_once_every_job_has_its_row() -> None:
    out = render(pipeline_status(), width=80)
    assert sum(" tokenize " in line for line in out.splitlines()) == 10


def test_the_note_states_only_what_the_numbers_do_not() -> None:
    prep = job(state="succeeded", records=2, metrics={"rows": 2, "tokens": 626}, message="kept 2 of 2 rows, 626 tokens")
    infer = job(stage="infer", metrics={"concurrency": 24, "tokens_per_s": 1234.0, "retries": 0, "truncated": 3},
                message="answering prompts")
    view = status_columns.View(NOW, None)
    assert status_columns.message(prep, view).plain == "kept 2 of 2 rows, 626 tokens"
    assert status_columns.message(infer, view).plain == "c=24 1,234 tok/s truncated=3 answering prompts"


def test_the_summary_counts_states_in_lifecycle_order_with_tokens_per_second_and_the_longest_eta() -> None:
    status = {"jobs": [job(state="succeeded"), job(eta_s=70.0, metrics={"tokens_per_s": 100.0}),
                       job(eta_s=4000.0, metrics={"tokens_per_s": 50.5}), job(state="failed")]}
    assert [line.plain for line in status_table.summary(status)] == [
        "ETA 1h06m · 150 tok/s · 4 jobs: 2 running, 1 succeeded, 1 failed"]
    assert [line.plain for line in status_table.summary(status, width=60)] == [
        "ETA 1h06m · 150 tok/s", "4 jobs: 2 running, 1 succeeded, 1 failed"]


def test_gpus_are_grouped_by_holder_with_utilisation_range_and_memory() -> None:
    gpus = [{"index": i, "utilization": u, "memory_used": 40960, "memory_total": 81920, "held_by": h}
            for i, u, h in [(0, 90, ["A1/extract"]), (1, 99, ["A1/extract"]), (3, 0, [])]]
    assert [line.plain for line in status_table.gpu_lines(gpus)] == [
        "GPUs 0-1: util 90-99%, mem 80/160 GiB, A1/extract",
        "GPU 3: util 0%, mem 40/80 GiB, idle",
    ]


def test_json_has_eta_and_the_gpus_each_job_holds() -> None:
    status = {"jobs": [job(stage="infer", eta_s=12.5, total=100, done=50), job(dataset="B5", state="succeeded")],
              "gpus": [{"index": 0, "utilization": 97.0, "memory_used": 1.0, "memory_total": 2.0,
                        "held_by": ["inference server"]}]}
    rows = status_data.as_json(status)
    assert (rows[0]["eta_s"], rows[0]["total"], rows[0]["done"]) == (12.5, 100, 50)
    assert rows[0]["gpus"] == [{"index": 0, "utilization": 97.0, "memory_used": 1.0, "memory_total": 2.0}]
    assert "gpus" not in rows[1] and rows[1]["eta_s"] is None


def test_a_job_blocked_behind_a_failure_says_so_and_what_to_do() -> None:
    blocked = job(stage="extract", state="blocked", blocked_by=["A1/prep"], message="blocked by A1/prep (failed)")
    gpu = job(state="waiting", waiting_for=["B5/extract"], message="the GPU is in use")
    view = status_columns.View(NOW, None)
    assert status_columns.message(blocked, view).plain == (
        "blocked by A1/prep (failed); fix that, then `inv rerun --failed`")
    assert status_columns.message(gpu, view).plain == "waits for the GPU (B5/extract)"


def test_empty_and_stopped_rows_give_a_next_step() -> None:
    view = status_columns.View(NOW, None)
    empty = job(dataset="B5", stage="infer", state="empty", message="exit 0, 0 records")
    assert status_columns.message(empty, view).plain == (
        "exit 0, 0 records; `inv logs B5 --stage infer` says why; fix it, then `inv rerun --failed`")
    stopped = job(state="stopped", message="stopped by inv stop")
    assert status_columns.message(stopped, view).plain == (
        "stopped by inv stop; `inv launch --stage prep --dataset A1` starts it again")
    runner = job(dataset="pipeline", stage="run", state="stopped", message="stopped by inv stop")
    assert status_columns.message(runner, view).plain.endswith("; `inv run` starts the pipeline again")
    assert status_columns.message(job(state="succeeded", message="kept 2 of 2"), view).plain == "kept 2 of 2"


def test_a_datasets_stages_are_listed_in_pipeline_order_not_alphabetically() -> None:
    names = ["tokenize", "extract", "prep", "infer"]
    jobs = [job(dataset="B5", stage=name, state="succeeded") for name in names] + [
        job(dataset="A1", stage="train"), job(dataset="A1", stage="prep")]
    out = render({"now": NOW, "current_release": None, "jobs": jobs}, width=200)
    rows = [line.split()[1:4:2] for line in out.splitlines() if line.startswith("│")]
    assert rows == [["B5", "prep"], ["B5", "infer"], ["B5", "tokenize"], ["B5", "extract"],
                    ["A1", "prep"], ["A1", "train"]]


def test_values_are_shown_as_they_are_never_read_as_markup() -> None:
    status = {"now": NOW, "current_release": None, "jobs": [
        job(skipped=3, skip_reasons={"[bold]not text[/bold]": 3}, message="kept [red]2[/red] rows")]}
    shown = render(status, width=200)
    assert "kept [red]2[/red] rows; skipped: [bold]not text[/bold]" in shown


def test_the_column_widths_given_to_rich_are_the_ones_it_would_measure_at_any_terminal_width(monkeypatch) -> None:  # noqa: ANN001
    # the status table gives rich the width of each column that never wraps, so that rich does not measure every
    # cell again (a fifth of drawing 40 rows): the table must come out as rich alone would lay it out.
    status = {"now": NOW, "current_release": {"g1": "20261129-111111-bbbb2222", "東京-2": "20261129-111111-bbbb2222"},
              "jobs": [job(host="g1", records=2500, skip_reasons={"no assistant turn": 7}, skipped=7, message="step 3"),
                       job(host="東京-2", dataset="B5", state="failed", exit_code=1, ended_at=NOW - 40,
                           message="exit 1: ValueError: 行が長すぎます " * 3)],
              "unreachable": [{"host": "g3", "message": "no SSH answer within 10 s: is the host up? " * 2}]}
    given = [render(status, width) for width in (200, 120, 80, 50)] + [render(status, 80, 9, fit=True)]

    class Measuring(status_table.Table):  # rich measuring every cell itself
        def add_column(self, *args, width=None, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
            super().add_column(*args, **kwargs)

    monkeypatch.setattr(status_table, "Table", Measuring)
    assert given == [render(status, width) for width in (200, 120, 80, 50)] + [render(status, 80, 9, fit=True)]
    assert "東京-2" in given[0] and "unreachable" in given[0]


# -- a thousand bad jobs ------------------------------------------------------------------


def bad_jobs(count: int, alike: bool = True) -> dict:
    """`count` datasets that one bug left empty (their skip counts differ), or each with an error of its own."""
    own = ["".join(chr(97 + int(d)) for d in str(i)) for i in range(count)]  # keys of its own, without digits
    jobs = [job(dataset=f"D{i:04d}", state="empty", records=0, skipped=i + 1, ended_at=NOW - 1,
                skip_reasons={f"no conversations field (keys: {'id, text' if alike else own[i]})": i + 1},
                message=f"exit 0 with zero records: no conversations field (keys: {'id, text' if alike else own[i]}) ×{i + 1}")
            for i in range(count)]
    return {"now": NOW, "current_release": None, "jobs": jobs}


def test_a_thousand_datasets_that_failed_alike_are_one_row_with_a_count() -> None:
    out = render(bad_jobs(1000), width=80, height=24, fit=True)
    lines = out.splitlines()
    assert len(lines) <= 24
    assert [line.split()[:4] for line in lines if "datasets" in line.split()[:2]] == [["1000", "datasets", "prep", "empty"]]
    assert ("prep empty in 1000 datasets (D0000, D0001, D0002 and 997 more): exit 0 with zero records: no conversations "
            "field (keys: id, text) ×N") in " ".join(lines)  # the counts differ: shown as N
    assert lines[-1] == "1000 jobs: 1000 empty"


def test_failures_with_different_exit_codes_are_never_folded_into_one_row() -> None:
    jobs = [job(dataset=f"D{i}", state="failed", exit_code=code, ended_at=NOW - 1, message=f"exit {code}: line {i}")
            for i, code in enumerate((1, 1, 2))]
    out = render({"now": NOW, "current_release": None, "jobs": jobs}, width=120, height=24, fit=True)
    rows = [line.split()[:4] for line in out.splitlines() if line.startswith(("2 datasets", "D2 "))]
    assert rows == [["2", "datasets", "prep", "failed"], ["D2", "prep", "failed", "0"]]
    assert "exit 1: line N" in out and "exit 2: line 2" in out


def test_a_thousand_different_errors_fit_the_screen_with_a_row_that_counts_the_rest() -> None:
    out = render(bad_jobs(1000, alike=False), width=80, height=24, fit=True)
    lines = out.splitlines()
    assert len(lines) <= 24
    assert any(line.startswith("...") and "more: " in line and " empty" in line for line in lines)
    assert lines[-1] == "1000 jobs: 1000 empty"


def test_the_watch_draws_one_table_and_counts_its_lines_right_at_any_size(monkeypatch) -> None:  # noqa: ANN001
    drawn = []
    table = status_table.StatusView.table
    monkeypatch.setattr(status_table.StatusView, "table", lambda self, *a, **k: drawn.append(1) or table(self, *a, **k))
    for status in (pipeline_status(), bad_jobs(40, alike=False), bad_jobs(300)):
        for width in (50, 80, 120, 200):
            for height in (12, 16, 24, 40):
                drawn.clear()
                out = render(status, width=width, height=height, fit=True, title="gpu:/root")
                assert drawn == [1]  # never a candidate layout drawn to be measured
                assert len(out.splitlines()) <= height, (width, height, out)
    tiny = render(pipeline_status(), width=50, height=6, fit=True).splitlines()  # less room than the summary takes
    assert tiny[2].startswith("...") and tiny[3].startswith("GPUs")
    assert "41 more: 17 waiting, 4 running, 20 succeeded" in render(pipeline_status(), 200, 6, fit=True)
    tall = render(pipeline_status(), width=120, height=60, fit=True)
    assert "..." not in tall and "4 datasets" not in tall and "infer +2" in tall  # room enough: nothing folded or cut
