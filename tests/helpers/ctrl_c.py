"""Ctrl-C for a command a test starts as a user's foreground job."""

from __future__ import annotations

import signal


def takes_ctrl_c() -> None:
    """SIGINT back to its default, in the child before it execs: a shell's foreground job takes Ctrl-C whatever its
    parent ignored, but pytest started in the background by a script (a CI runner's, under nohup) ignores SIGINT,
    and an ignored signal stays ignored across exec, so the command would never end on Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
