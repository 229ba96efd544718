"""What a test needs from the machine: in CI its absence is a failure, elsewhere a skip."""

from __future__ import annotations

import os
from typing import Callable

import pytest


def need(require: Callable[[], None], error: type[Exception], what: str) -> None:
    """Run `require`; when it raises `error`, fail the test in CI (CI=true) and skip it elsewhere."""
    try:
        require()
    except error as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs {what}: {missing}", pytrace=False)
        pytest.skip(str(missing))
