"""The one way the host talks back: a tagged JSON payload on stdout.

The workstation runs a `remote` command and looks for the line between the
tags, so stray output on the host (locale warnings, a chatty login script, a
library printing on import) cannot corrupt the answer.
"""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, TextIO

OPEN, CLOSE = "<aerie-payload>", "</aerie-payload>"


def emit(payload: Any, out: TextIO | None = None) -> None:
    """Print `payload` as one tagged line."""
    out = out or sys.stdout
    out.write(f"{OPEN}{json.dumps(payload, separators=(',', ':'))}{CLOSE}\n")
    out.flush()


def decode(text: str) -> Any:
    """The payload in `text` (the last one, if a command printed several)."""
    start = text.rfind(OPEN)
    end = text.find(CLOSE, start)
    if start < 0 or end < 0:
        raise ValueError("no aerie payload in the host's output")
    return json.loads(text[start + len(OPEN) : end])
