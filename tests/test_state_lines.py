"""`--watch` and `--follow` without a terminal: a line per change of state, a summary now and then, an end.

The fetches are a scripted sequence of status payloads; the console is rich's, writing to a string as a
pipe would (not a terminal), so the lines are compared exactly, less their time of day.
"""

from __future__ import annotations

import io
import re
from typing import Any, Callable

from rich.console import Console

from local.views import live
from local.views import state_lines
from local.views import status_data

NOW = 1_000_000.0
STAMP = re.compile(r"^\d\d:\d\d:\d\d ")


def job(key: str, state: str, **fields: Any) -> dict[str, Any]:
    dataset, stage = key.split("/")
    return {"dataset": dataset, "stage": stage, "state": state, "records": 0, "skipped": 0, "skip_reasons": {},
            "metrics": {}, "message": "", "waiting_for": None, "started_at": NOW, **fields}


def statuses(*frames: list[dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """A fetch that answers each frame in turn, then the last one for ever."""
    left = list(frames)

    def fetch() -> dict[str, Any]:
        jobs = left.pop(0) if len(left) > 1 else left[0]
        return {"now": NOW, "current_release": None, "jobs": jobs}

    return fetch


def lines(fetch: Callable[[], dict[str, Any]], until: Callable[[dict[str, Any]], bool], every: float = 1e9,
          clock: Callable[[], float] = lambda: 0.0) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    assert not console.is_terminal
    state_lines.follow(fetch, console, "gpu:/root", 0, until, summary_every=every, clock=clock)
    return [STAMP.sub("", line) for line in out.getvalue().splitlines()]


def test_each_change_of_state_is_one_line_and_the_run_ends_with_a_summary() -> None:
    fetch = statuses(
        [job("B5/prep", "running"), job("B5/infer", "waiting", waiting_for=["B5/prep"]),
         job("pipeline/run", "running")],
        [job("B5/prep", "running", records=5), job("B5/infer", "waiting", waiting_for=["B5/prep"]),
         job("pipeline/run", "running")],
        [job("B5/prep", "succeeded", records=7, skipped=1), job("B5/infer", "running"), job("pipeline/run", "running")],
        [job("B5/prep", "succeeded", records=7, skipped=1), job("B5/infer", "failed", message="exit 1: no server"),
         job("pipeline/run", "failed", message="incomplete")],
    )
    assert lines(fetch, live._pipeline_ended) == [
        "gpu:/root: 3 jobs: 1 waiting, 2 running",
        "B5/prep running",
        "pipeline/run running",
        "B5/prep succeeded: 7 records, 1 skipped",
        "B5/infer running",
        "B5/infer failed: exit 1: no server",
        "pipeline/run failed: incomplete",
        "3 jobs: 1 succeeded, 2 failed",
    ]


def test_a_summary_line_comes_every_so_often_while_nothing_changes() -> None:
    ticks = iter(range(100))
    frames = [[job("A1/prep", "running")]] * 6 + [[job("A1/prep", "succeeded", records=1)]]
    out = lines(statuses(*frames), live._all_ended, every=2, clock=lambda: float(next(ticks)))
    assert out == ["gpu:/root: 1 job: 1 running", "A1/prep running", "1 job: 1 running",
                   "1 job: 1 running", "A1/prep succeeded: 1 records", "1 job: 1 succeeded"]


def test_a_watch_without_a_terminal_ends_when_every_job_has_ended_and_prints_the_table_once() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    fetch = statuses([job("A1/prep", "running")], [job("A1/prep", "blocked", blocked_by=["A1/x"], message="blocked by A1/x (failed)")])
    state = live.refresh(fetch, console, "gpu:/root", 0)  # `inv status --watch`: no `until` of its own
    assert state["jobs"][0]["state"] == "blocked"
    text = out.getvalue()
    assert "A1/prep blocked by A1/x (failed)\n" in text and "┃ dataset" in text  # the lines, then the table


def test_the_outcome_names_the_failures_the_jobs_blocked_behind_them_and_the_next_step() -> None:
    state = {"jobs": [job("B5/extract", "blocked", blocked_by=["B5/tokenize"]), job("B5/infer", "failed"),
                      job("B5/tokenize", "blocked", blocked_by=["B5/infer"]), job("A1/prep", "succeeded"),
                      job("pipeline/run", "failed")]}
    said = status_data.outcome(state)
    assert said.startswith("the run did not succeed: B5/infer failed; 2 blocked behind it: B5/tokenize, B5/extract. ")
    assert "`inv rerun --failed`" in said
    assert status_data.outcome({"jobs": [job("A1/prep", "succeeded")]}) == ""
    # The runner failed itself (its inference server would not start): it is the cause the jobs are blocked behind.
    state = {"jobs": [job("B5/infer", "blocked", blocked_by=["pipeline/run"]), job("pipeline/run", "failed")]}
    assert status_data.outcome(state).startswith("the run did not succeed: pipeline/run failed; 1 blocked behind it: B5/infer. ")


TRAINED = {"loss": 0.12, "accept_length": 3.4567, "eval_positions": 1234, "eval_acc_0": 0.9, "eval_acc_1": 0.8,
           "eval_acc_2": 0.7}
ACCEPT = ("draft/train: held-out accept length 3.457 of at most 4 (1.0: the draft is useless), over 1,234 positions "
          "of records it never trained on")


def test_run_follow_outside_the_demo_ends_with_the_draft_s_accept_length_whole() -> None:
    frames = [[job("draft/train", "running"), job("pipeline/run", "running")],
              [job("draft/train", "succeeded", records=300, metrics=TRAINED), job("pipeline/run", "succeeded")]]
    piped = io.StringIO()  # a log file or a CI step: the lines, then the table and the lines under it
    live.follow(statuses(*frames), Console(file=piped, width=80, color_system=None), "gpu:/root", interval=0)
    assert " ".join(piped.getvalue().split()).count(ACCEPT) == 1
    terminal = io.StringIO()  # the live table's last frame, which stays on the screen
    live.follow(statuses(*frames), Console(file=terminal, width=200, height=24, force_terminal=True,
                                           color_system=None), "gpu:/root", interval=0)
    assert ACCEPT in terminal.getvalue()
