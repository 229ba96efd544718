"""The status table, rendered to a string and compared exactly (rich's own testing style)."""

from __future__ import annotations

import io

from rich.console import Console

from local import status_view
from remote.states import BAD, JobState

NOW = 1_000_000.0


def job(**fields) -> dict:  # noqa: ANN003
    base = {"dataset": "A1", "stage": "prep", "state": "running", "records": 0, "skipped": 0, "skip_reasons": {},
            "metrics": {}, "exit_code": None, "release": "20261129-101010-aaaa1111", "started_at": NOW - 100,
            "ended_at": None, "message": "", "waiting_for": None}
    return {**base, **fields}


def render(status: dict, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    console.print(status_view.render(status))
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_no_jobs_says_so_in_words() -> None:
    assert render({"now": NOW, "current_release": None, "jobs": []}) == "No jobs yet.\n"


EXPECTED_TABLE = """\
┏━━━━━━━━━┳━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ dataset ┃ stage ┃ state   ┃ records ┃                   skipped ┃   rate ┃ elapsed ┃ release        ┃ last line / error        ┃
┡━━━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ A1      │ prep  │ running │   2,500 │ 2,809 (no assistant turn) │ 25.0/s │    1:40 │ aaaa1111 (old) │ step 3                   │
│ B5      │ prep  │ failed  │       0 │                         0 │      - │    1:00 │ bbbb2222       │ exit 1: KeyError: 'from' │
└─────────┴───────┴─────────┴─────────┴───────────────────────────┴────────┴─────────┴────────────────┴──────────────────────────┘
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
    assert [c.header for c in status_view.COLUMNS] == [
        "dataset", "stage", "state", "records", "skipped", "rate", "elapsed", "release", "last line / error"]


def test_every_state_has_a_colour_and_the_bad_ones_make_status_fail() -> None:
    assert set(status_view.STATE_STYLES) == set(JobState)
    assert BAD == {JobState.FAILED, JobState.DIED, JobState.EMPTY, JobState.STALLED, JobState.BROKEN}
    for state in JobState:
        assert status_view.any_bad({"jobs": [job(state=state.value)]}) == (state in BAD)


def test_states_are_declared_in_lifecycle_order_and_know_if_they_are_terminal() -> None:
    assert [s.value for s in JobState] == [
        "waiting", "running", "stalled", "succeeded", "empty", "failed", "died", "stopped", "broken"]
    assert [s.value for s in JobState if not s.is_terminal()] == ["waiting", "running", "stalled"]


def test_json_rows_carry_the_documented_keys() -> None:
    rows = status_view.as_json({"jobs": [job(extra="not shown")]})
    assert {"dataset", "stage", "state", "records", "skipped", "skip_reasons", "exit_code", "release",
            "started_at", "ended_at", "message"} <= set(rows[0])
    assert "extra" not in rows[0]


def test_waiting_jobs_say_what_they_wait_for() -> None:
    out = render({"now": NOW, "current_release": None, "jobs": [job(state="waiting", waiting_for=["A1/prep"])]})
    assert "waits for A1/prep" in out
