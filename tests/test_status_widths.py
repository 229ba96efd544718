"""The status table at 80, 120 and 200 columns, with a long skip reason and a long error, compared exactly
(rich's way: a console on a StringIO of a given width): counts in columns of fixed width, words never cut
at the end of a line, each error whole under the table where its cell cannot hold it on one line, and the
draft's accept length whole on a line of its own."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from local.views import status_table

NOW = 1_000_000.0
RELEASE = "20261129-101010-aaaa1111"
SKIP_REASON = "no conversations field (keys: dialog, dialog_id)"
ERROR = ("exit 1: the inference server at http://127.0.0.1:30000/v1 answered 500 Internal Server Error to 12 of 12 "
         "requests: the server is out of memory")


def job(dataset: str, stage: str, state: str, **fields: object) -> dict:
    return {"dataset": dataset, "stage": stage, "state": state, "records": 0, "skipped": 0, "skip_reasons": {},
            "metrics": {}, "exit_code": None, "release": RELEASE, "started_at": NOW - 100, "ended_at": None,
            "message": "", "waiting_for": None, **fields}


def status() -> dict:
    return {"now": NOW, "current_release": RELEASE, "jobs": [
        job("A1", "prep", "succeeded", records=2500, skipped=2809, ended_at=NOW - 20,
            skip_reasons={"no assistant turn": 2800, "unknown role 'narrator'": 9},
            message="kept 2,500 of 5,309 rows, 1,234,567 tokens"),
        job("B3", "prep", "empty", skipped=4, skip_reasons={SKIP_REASON: 4}, ended_at=NOW - 50,
            message="kept 0 of 4 rows"),
        job("B5", "infer", "failed", exit_code=1, ended_at=NOW - 40, message=ERROR),
        job("A3", "tokenize", "stopped", records=12, ended_at=NOW - 40, message="stopped by inv stop"),
        job("draft", "train", "running", records=300, message="epoch 2/3 saved",
            metrics={"loss": 0.1234, "accept_length": 3.4567, "eval_positions": 1234, "eval_acc_0": 0.9,
                     "eval_acc_1": 0.8, "eval_acc_2": 0.7}),
        job("pipeline", "run", "running", message="4 of 9 jobs done"),
    ]}


def render(width: int, fit: bool = False) -> str:
    console = Console(file=io.StringIO(), width=width, height=24, force_terminal=fit, color_system=None)
    console.print(status_table.render(status(), title="local:/tmp/root", fit=fit))
    # NOTE: each line without the blanks rich pads it with, which an editor would strip from the expected text
    return "\n".join(line.rstrip() for line in console.file.getvalue().split("\n"))  # type: ignore[attr-defined]


AT_80 = """\
local:/tmp/root
┏━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━┳━━━━━━━━━━━━━━━━━━━┓
┃ dataset  ┃ stage    ┃ state     ┃ records ┃   rate ┃ eta ┃ last line / error ┃
┡━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━╇━━━━━━━━━━━━━━━━━━━┩
│ A1       │ prep     │ succeeded │   2,500 │ 31.2/s │   - │ kept 2,500 of     │
│          │          │           │         │        │     │ 5,309 rows,       │
│          │          │           │         │        │     │ 1,234,567 tokens; │
│          │          │           │         │        │     │ most skipped: no  │
│          │          │           │         │        │     │ assistant turn    │
│ B3       │ prep     │ empty     │       0 │      - │   - │ kept 0 of 4 rows… │
│ B5       │ infer    │ failed    │       0 │      - │   - │ exit 1: the infe… │
│ A3       │ tokenize │ stopped   │      12 │  0.2/s │   - │ stopped by inv    │
│          │          │           │         │        │     │ stop; `inv rerun  │
│          │          │           │         │        │     │ --failed` resumes │
│          │          │           │         │        │     │ its pipeline,     │
│          │          │           │         │        │     │ which starts it   │
│          │          │           │         │        │     │ again, once its   │
│          │          │           │         │        │     │ runner has ended  │
│ draft    │ train    │ running   │     300 │  3.0/s │   - │ loss=0.1234 epoch │
│          │          │           │         │        │     │ 2/3 saved         │
│ pipeline │ run      │ running   │       0 │      - │   - │ 4 of 9 jobs done  │
└──────────┴──────────┴───────────┴─────────┴────────┴─────┴───────────────────┘
B3/prep empty: kept 0 of 4 rows; skipped: no conversations field (keys: dialog,
dialog_id); `inv logs B3 --stage prep` says why; fix it, then `inv rerun
--failed`
B5/infer failed: exit 1: the inference server at http://127.0.0.1:30000/v1
answered 500 Internal Server Error to 12 of 12 requests: the server is out of
memory
draft/train: held-out accept length 3.457 of at most 4 (1.0: the draft is
useless), over 1,234 positions of records it never trained on
6 jobs: 2 running, 1 succeeded, 1 empty, 1 failed, 1 stopped
"""

AT_120 = """\
local:/tmp/root
┏━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ dataset  ┃ stage    ┃ state     ┃ records ┃ skipped ┃   rate ┃ elapsed ┃ eta ┃ last line / error                     ┃
┡━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ A1       │ prep     │ succeeded │   2,500 │   2,809 │ 31.2/s │    1:20 │   - │ kept 2,500 of 5,309 rows, 1,234,567   │
│          │          │           │         │         │        │         │     │ tokens; most skipped: no assistant    │
│          │          │           │         │         │        │         │     │ turn                                  │
│ B3       │ prep     │ empty     │       0 │       4 │      - │    0:50 │   - │ kept 0 of 4 rows; skipped: no conver… │
│ B5       │ infer    │ failed    │       0 │       0 │      - │    1:00 │   - │ exit 1: the inference server at http… │
│ A3       │ tokenize │ stopped   │      12 │       0 │  0.2/s │    1:00 │   - │ stopped by inv stop; `inv rerun       │
│          │          │           │         │         │        │         │     │ --failed` resumes its pipeline, which │
│          │          │           │         │         │        │         │     │ starts it again, once its runner has  │
│          │          │           │         │         │        │         │     │ ended                                 │
│ draft    │ train    │ running   │     300 │       0 │  3.0/s │    1:40 │   - │ loss=0.1234 epoch 2/3 saved           │
│ pipeline │ run      │ running   │       0 │       0 │      - │    1:40 │   - │ 4 of 9 jobs done                      │
└──────────┴──────────┴───────────┴─────────┴─────────┴────────┴─────────┴─────┴───────────────────────────────────────┘
B3/prep empty: kept 0 of 4 rows; skipped: no conversations field (keys: dialog, dialog_id); `inv logs B3 --stage prep`
says why; fix it, then `inv rerun --failed`
B5/infer failed: exit 1: the inference server at http://127.0.0.1:30000/v1 answered 500 Internal Server Error to 12 of
12 requests: the server is out of memory
draft/train: held-out accept length 3.457 of at most 4 (1.0: the draft is useless), over 1,234 positions of records it
never trained on
6 jobs: 2 running, 1 succeeded, 1 empty, 1 failed, 1 stopped
"""

AT_200 = """\
local:/tmp/root
┏━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ dataset  ┃ stage    ┃ state     ┃ records ┃ skipped ┃   rate ┃ elapsed ┃ eta ┃ last line / error                                                                                                     ┃
┡━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ A1       │ prep     │ succeeded │   2,500 │   2,809 │ 31.2/s │    1:20 │   - │ kept 2,500 of 5,309 rows, 1,234,567 tokens; most skipped: no assistant turn                                           │
│ B3       │ prep     │ empty     │       0 │       4 │      - │    0:50 │   - │ kept 0 of 4 rows; skipped: no conversations field (keys: dialog, dialog_id); `inv logs B3 --stage prep` says why; fi… │
│ B5       │ infer    │ failed    │       0 │       0 │      - │    1:00 │   - │ exit 1: the inference server at http://127.0.0.1:30000/v1 answered 500 Internal Server Error to 12 of 12 requests: t… │
│ A3       │ tokenize │ stopped   │      12 │       0 │  0.2/s │    1:00 │   - │ stopped by inv stop; `inv rerun --failed` resumes its pipeline, which starts it again, once its runner has ended      │
│ draft    │ train    │ running   │     300 │       0 │  3.0/s │    1:40 │   - │ loss=0.1234 epoch 2/3 saved                                                                                           │
│ pipeline │ run      │ running   │       0 │       0 │      - │    1:40 │   - │ 4 of 9 jobs done                                                                                                      │
└──────────┴──────────┴───────────┴─────────┴─────────┴────────┴─────────┴─────┴───────────────────────────────────────────────────────────────────────────────────────────────────────────────────────┘
B3/prep empty: kept 0 of 4 rows; skipped: no conversations field (keys: dialog, dialog_id); `inv logs B3 --stage prep` says why; fix it, then `inv rerun --failed`
B5/infer failed: exit 1: the inference server at http://127.0.0.1:30000/v1 answered 500 Internal Server Error to 12 of 12 requests: the server is out of memory
draft/train: held-out accept length 3.457 of at most 4 (1.0: the draft is useless), over 1,234 positions of records it never trained on
6 jobs: 2 running, 1 succeeded, 1 empty, 1 failed, 1 stopped
"""

WATCHED_AT_80 = """\
local:/tmp/root
dataset    stage      state       records     rate   eta   last line / error
────────────────────────────────────────────────────────────────────────────────
B3         prep       empty             0        -     -   kept 0 of 4 rows; sk…
B5         infer      failed            0        -     -   exit 1: the inferenc…
A3         tokenize   stopped          12    0.2/s     -   stopped by inv stop;…
draft      train      running         300    3.0/s     -   loss=0.1234 epoch 2/…
pipeline   run        running           0        -     -   4 of 9 jobs done
A1         prep       succeeded     2,500   31.2/s     -   kept 2,500 of 5,309 …
B3/prep empty: kept 0 of 4 rows; skipped: no conversations field (keys: dialog,
dialog_id); `inv logs B3 --stage prep` says why; fix it, then `inv rerun
--failed`
B5/infer failed: exit 1: the inference server at http://127.0.0.1:30000/v1
answered 500 Internal Server Error to 12 of 12 requests: the server is out of
memory
draft/train: held-out accept length 3.457 of at most 4 (1.0: the draft is
useless), over 1,234 positions of records it never trained on
6 jobs: 2 running, 1 succeeded, 1 empty, 1 failed, 1 stopped
"""


@pytest.mark.parametrize(("width", "expected"), [(80, AT_80), (120, AT_120), (200, AT_200)])
def test_the_printed_table_at_80_120_and_200_columns(width: int, expected: str) -> None:
    assert render(width) == expected


def test_the_watched_table_at_80_columns_is_one_line_a_row_with_the_errors_whole_under_it() -> None:
    assert render(80, fit=True) == WATCHED_AT_80


def _words(text: str) -> set[str]:
    return {word.rstrip(";,") for word in re.split(r"[\s│┃]+", text)}


@pytest.mark.parametrize("width", range(80, 201, 6))
def test_at_any_width_from_80_the_error_the_skip_reason_and_the_hint_are_whole_words(width: int) -> None:
    shown = _words(render(width))
    said = " ".join([ERROR, SKIP_REASON, "`inv rerun --failed`", "`inv logs B3 --stage prep`", "accept length 3.457"])
    assert _words(said) <= shown


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_counts_columns_keep_their_width_whatever_the_skip_reason(width: int) -> None:
    header = next(line for line in render(width).splitlines() if "records" in line)
    assert "┃ records ┃" in header and ("┃ skipped ┃" in header or width < status_table.WIDE)

