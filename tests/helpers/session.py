"""What a test session builds once: a tiny model, a stage's output, a server that tests only read.

NOTE: pytest keeps a fixture's value per place it is defined, and a fixture imported into a test
module is defined there too: a session-scoped fixture that nine modules import is built nine times
in a session. A fixture that calls `built_once` is built on its first use in a session (in each
xdist worker) and handed to every module after it.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import pytest

T = TypeVar("T")
_BUILT = pytest.StashKey[dict[str, Any]]()


def built_once(request: pytest.FixtureRequest, build: Callable[[], T], stop: Callable[[T], None] | None = None) -> T:
    """The fixture `request` names, built by `build` on its first use in this session; `stop` runs as the session ends."""
    built = request.config.stash.setdefault(_BUILT, {})
    name = request.fixturename
    if name not in built:
        value = built[name] = build()
        if stop is not None:
            request.config.add_cleanup(lambda: stop(value))
    return built[name]
