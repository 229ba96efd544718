"""What a test session builds once: a tiny model, a stage's output, a server that tests only read.

NOTE: pytest keeps a fixture's value per place it is defined, and a fixture imported into a test
module is defined there too: a session-scoped fixture that nine modules import is built nine times
in a session. A fixture that calls `built_once` is built on its first use in a session and handed to
every module after it: files (`stop` None) once for every xdist worker, the first worker to need them
building them while the others wait; a service (a process, stopped by `stop`) once in each worker.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest

T = TypeVar("T")
_BUILT = pytest.StashKey[dict[str, Any]]()


def built_once(request: pytest.FixtureRequest, build: Callable[[], T], stop: Callable[[T], None] | None = None) -> T:
    """The fixture `request` names, built by `build` on its first use in this session; `stop` runs as the session ends."""
    built = request.config.stash.setdefault(_BUILT, {})
    name = request.fixturename
    if name not in built:
        if stop is None:
            built[name] = _built_for_every_worker(request, name, build)
        else:
            value = built[name] = build()
            request.config.add_cleanup(lambda: stop(value))
    return built[name]


def _built_for_every_worker(request: pytest.FixtureRequest, name: str, build: Callable[[], T]) -> T:
    """`build`'s value (paths, files under the session's temporary root, which every worker reads), built by the
    first worker that asks and read back by the others; a build that fails is tried again by the next."""
    shared = session_root(request) / "built-once"
    shared.mkdir(exist_ok=True)
    kept = shared / f"{name}.pickle"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait for the build rather than build it too
        if kept.is_file():
            return pickle.loads(kept.read_bytes())
        value = build()
        partial = kept.with_name(f"{kept.name}.{os.getpid()}")
        partial.write_bytes(pickle.dumps(value))
        partial.rename(kept)
        return value


def session_root(request: pytest.FixtureRequest) -> Path:
    """The temporary root of this session: its workers' roots lie under it (popen-gw0, ...)."""
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
