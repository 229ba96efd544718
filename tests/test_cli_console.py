"""The console every task prints through: plain lines without importing rich, anything else through rich."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from local.console import LazyConsole, line
from benchmarks.harness.checkout import REPO


def test_a_plain_line_is_printed_without_importing_rich() -> None:
    code = ("import sys; from local.console import console; c = console(); "
            "c.print('Nothing to deploy: 127.0.0.1:/r runs release 1, identical'); print('rich' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout == "Nothing to deploy: 127.0.0.1:/r runs release 1, identical\nFalse\n"


def test_markup_and_emoji_codes_go_through_rich() -> None:
    out = io.StringIO()
    console = LazyConsole(file=out, width=80, highlight=False, soft_wrap=True)
    console.print("[red]fail[/] then :warning: and plain")
    assert out.getvalue() == "fail then ⚠ and plain\n"


def test_a_live_view_runs_on_the_lazy_console() -> None:
    from rich.live import Live
    from rich.text import Text

    out = io.StringIO()
    console = LazyConsole(file=out, width=80)
    with Live(console=console, auto_refresh=False) as live:  # type: ignore[arg-type]
        live.update(Text("frame two"), refresh=True)
    assert "frame two" in out.getvalue()


def test_a_command_exits_with_its_code_and_without_collecting_the_garbage_of_its_imports() -> None:
    # The interpreter's collections at exit took ~80 ms of every `inv` command (benchmarks/bench_control.py).
    code = ("import os, sys, tasks\n"
            "class Cycle:\n"
            "    def __del__(self): os.write(1, b'collected')\n"
            "a, b = Cycle(), Cycle(); a.other, b.other = b, a; del a, b\n"
            "print('done', flush=True); sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "done\n", "")


def test_a_styled_line_is_plain_text_without_rich_where_its_styles_would_not_show() -> None:
    code = ("import sys; from local.console import console, line; c = console(); "
            "c.print(line(('  change', 'yellow'), ' remote/a.py [x] :y:')); print('rich' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")})
    assert done.stdout == "  change remote/a.py [x] :y:\nFalse\n"


def test_a_styled_line_shows_its_styles_through_rich_on_a_terminal() -> None:
    out = io.StringIO()
    console = LazyConsole(file=out, width=80, force_terminal=True, color_system="standard")
    console.print(line(("  change", "yellow"), " remote/a.py [x]"))
    assert out.getvalue() == "\x1b[33m  change\x1b[0m remote/a.py [x]\n"
