"""Nothing from the host or the data reaches the terminal raw: a log line, an error or a row's keys
that hold escape sequences are shown (`␛[2J`), never obeyed, while aerie's own colours stay."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Exit
from rich.console import Console

from local.tasks import job_verbs
from local.views import status_table
from local.views import validation_table
from local.cli import task
from local.exceptions import AerieError
from local.visible import VisibleStream, visible, visible_all
from benchmarks.harness.checkout import Bench, copy_checkout

#: Clear the screen, set the window title (BEL-terminated), a hyperlink (OSC 8, ST-terminated), a C1 CSI.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07 \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x9b31m red"
HOSTILE_KEYS = "no conversations field (keys: \x1b]0;owned\x07, \x1b[31mred)"
#: What a terminal may receive: rich's own SGR styles, nothing else that starts with ESC, and no C0/C1 but \n.
SGR = re.compile(r"\x1b\[[0-9;]*m")
NOW = 1_000_000.0


def assert_harmless(out: str) -> None:
    rest = SGR.sub("", out)
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", rest), repr(rest)


def job(**fields) -> dict:  # noqa: ANN003
    base = {"dataset": "A1", "stage": "prep", "state": "failed", "records": 0, "skipped": 3,
            "skip_reasons": {HOSTILE_KEYS: 3}, "metrics": {}, "exit_code": 1, "release": "20261129-101010-aaaa1111",
            "started_at": NOW - 100, "ended_at": NOW - 1, "message": f"exit 1: {HOSTILE}", "waiting_for": None}
    return {**base, **fields}


def terminal(width: int, height: int = 24) -> Console:
    return Console(file=io.StringIO(), width=width, height=height, force_terminal=True, color_system="truecolor")


# -- the one function -----------------------------------------------------------------


def test_every_control_character_is_shown_and_printable_text_is_kept() -> None:
    assert visible("\x1b[2J\x07\x00\x7f") == "␛[2J␇␀␡"
    assert visible("a\tb\nc\rd") == "a␉b␊c␍d"  # a one-line cell stays one line
    assert visible("a\tb\nc", lines=True) == "a\tb\nc"  # a log keeps its lines
    assert visible("\x9b31m\x85") == "\\x9b31m\\x85"  # C1: CSI and NEL
    assert visible("\ud800") == "\\ud800"  # a lone surrogate (JSON allows it) could not even be written
    assert visible("東京 é ␛ [bold]") == "東京 é ␛ [bold]"
    assert visible_all({"k\x1b": ["v\x07", 3, None]}) == {"k␛": ["v␇", 3, None]}


def test_a_log_shown_in_chunks_keeps_characters_cut_between_them() -> None:
    out = io.BytesIO()
    stream = VisibleStream(out)  # type: ignore[arg-type]
    data = "é\x1b[2J line\n\tnext 東\n".encode()
    for index in range(len(data)):
        stream.write(data[index:index + 1])
    stream.write(b"\xe6")  # cut short at the very end
    stream.close()
    assert out.getvalue().decode() == "é␛[2J line\n\tnext 東\n\ufffd"


# -- the status table, printed and watched ------------------------------------------


@pytest.mark.parametrize("width", [200, 80])
@pytest.mark.parametrize("fit", [False, True])
def test_the_status_table_shows_a_hostile_last_line_and_skip_reason_and_keeps_its_colours(width: int, fit: bool) -> None:
    status = {"now": NOW, "current_release": None, "jobs": [
        job(), job(dataset="B5", state="running", ended_at=None, exit_code=None, message=HOSTILE)]}
    console = terminal(width)
    console.print(status_table.render(status, title="gpu:/root", fit=fit))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert_harmless(out)
    assert "␛[2J␛]0;pwned␇" in out and SGR.search(out)  # shown, and aerie's styles are still there
    if width == 200 and not fit:
        assert "no conversations field (keys: ␛]0;owned␇, ␛[31mred)" in out


def test_an_unreachable_hosts_message_and_a_gpus_holder_are_shown_too() -> None:
    status = {"now": NOW, "current_release": {"g1": None}, "jobs": [job(host="g1")],
              "unreachable": [{"host": "g2\x1b]0;x\x07", "message": f"ssh: {HOSTILE}"}],
              "gpus": [{"index": 0, "utilization": 1, "memory_used": 1, "memory_total": 2, "host": "g1",
                        "held_by": [f"A1/prep{HOSTILE}"]}]}
    console = terminal(120)
    console.print(status_table.render(status))
    assert_harmless(console.file.getvalue())  # type: ignore[attr-defined]


# -- inv validate, messages and errors -----------------------------------------------------


def entry(**fields) -> dict:  # noqa: ANN003
    base = {"dataset": "A1", "kind": "native", "formats": {}, "rows": 3, "kept": 0, "skipped": 3,
            "skip_reasons": {HOSTILE_KEYS: 3}, "records": 0, "error": None, "note": f"tokens not counted: {HOSTILE}"}
    return {**base, **fields}


@pytest.mark.parametrize("width", [200, 80])
def test_the_validation_report_shows_a_rows_hostile_keys(width: int) -> None:
    console = terminal(width)
    validation_table.show(console, [entry(), entry(dataset="B5", error=f"cannot read: {HOSTILE} [bold]x[/bold]")], ["C1"])
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert_harmless(out)
    if width == 200:
        assert "3 no conversations field (keys: ␛]0;owned␇, ␛[31mred) ×3" in out and "[bold]x[/bold]" in out


def test_a_failed_tasks_message_is_shown_not_obeyed() -> None:
    @task
    def failing(c) -> None:  # noqa: ANN001
        raise AerieError(f"datasets that would give zero records: A1 ({HOSTILE_KEYS})")

    with pytest.raises(Exit) as raised:
        failing.body(None)
    assert_harmless(str(raised.value.message))
    assert "keys: ␛]0;owned␇" in raised.value.message


def test_the_hosts_reasons_in_launch_and_stop_reports_are_shown_as_text() -> None:
    console = terminal(200)
    job_verbs.report(console, [{"dataset": "A1", "stage": "prep", "launched": False, "reason": f"[red]{HOSTILE}"},
                             {"dataset": "B5", "stage": "prep", "launched": True, "where": f"pid 1{HOSTILE}"}], "launched")
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert_harmless(out)
    assert "skipped A1/prep: [red]␛[2J" in out and "\x1b[33m" in out  # the host's text as text, aerie's yellow kept


def test_an_eval_reports_warnings_and_flags_are_shown_too() -> None:
    from local.views import eval_report

    config = {"num_steps": 3, "topk": 1, "num_draft_tokens": 4, "accept_length": 2.5, "tokens_per_s": 120.0,
              "speedup": 1.2, "flags": ["--x", HOSTILE]}
    report = {"prompts": 8, "max_new_tokens": 64, "baseline": {"tokens_per_s": 100.0},
              "drafts": {f"d{HOSTILE}": {"path": f"/p{HOSTILE}", "configs": [config], "best": config}},
              "ranking": [f"d{HOSTILE}"], "best": {**config, "draft": f"d{HOSTILE}"}, "serve": f"d{HOSTILE}",
              "warnings": [f"server said {HOSTILE}"]}
    console = terminal(120)
    eval_report.show(report, console)
    assert_harmless(console.file.getvalue())  # type: ignore[attr-defined]


# -- the probes of issue 22, as typed ----------------------------------------------------------

STAGE = '''\
import os, sys, time
from remote.control_plane.progress import Progress
from remote.stages import StageContext

ctx = StageContext.from_env()
with Progress.from_env(interval=0) as progress:
    progress.skipped(HOSTILE_KEYS)
    print("started", flush=True)
    print(HOSTILE, flush=True)  # the last line: `inv status` shows it for a running job and in a failed one's error
    if ctx.dataset == "run":
        time.sleep(120)
sys.exit(1)
'''


def inv(bench: Bench, *args: str, width: int = 200, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COLUMNS": str(width), "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "invoke", *args, "-i", "test"], cwd=bench.checkout, capture_output=True,
                          text=True, timeout=120, env=environment)


@pytest.mark.e2e
def test_inv_status_logs_and_validate_show_what_a_hostile_stage_and_sample_hold(tmp_path: Path) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    stage = tmp_path / "hostile_stage.py"
    stage.write_text(f"HOSTILE = {HOSTILE!r}\nHOSTILE_KEYS = {HOSTILE_KEYS!r}\n{STAGE}")
    bench.inventory({"run": {"source": "x", "kind": "native"}, "fail": {"source": "x", "kind": "native"}},
                    {"prep": {"command": f"{{python}} {stage}"}})
    bench.inv("deploy")
    bench.inv("launch", "--stage", "prep")
    try:
        bench.wait_state("fail/prep", {"failed"})
        bench.wait_state("run/prep", {"running"})
        for width in (200, 80):
            shown = inv(bench, "status", width=width)
            assert shown.returncode == 1, shown.stderr
            assert_harmless(shown.stdout)
            assert "␛[2J␛]0;pwned␇" in shown.stdout and SGR.search(shown.stdout)
        assert "skipped: no conversations field (keys: ␛]0;owned␇, ␛[31mred)" in inv(bench, "status").stdout
        logged = inv(bench, "logs", "fail")
        assert_harmless(logged.stdout)
        assert "started\n␛[2J␛]0;pwned␇" in logged.stdout
        assert HOSTILE in inv(bench, "logs", "fail", "--raw").stdout  # the bytes as they are, when asked
    finally:
        bench.inv("stop", "--all", check=False)

    sample = tmp_path / "hostile.jsonl"
    sample.write_text('{"\\u001b]0;owned\\u0007": 1, "\\u001b[31mred": 2}\n')
    bench.inventory({"A1": {"source": "x", "kind": "native", "sample": str(sample)}})
    for width in (200, 80):
        checked = inv(bench, "validate", width=width)
        assert checked.returncode == 2
        assert_harmless(checked.stdout + checked.stderr)
        assert "(keys: ␛[31mred, ␛]0;owned␇)" in checked.stderr  # the one-line error names the reason in full
        assert "(keys: ␛[31mred, ␛]0;owned␇)" in checked.stdout or width == 80  # at 80 the cell wraps
