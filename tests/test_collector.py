"""A stage's process collects its long-lived objects rarely, and not at all at exit (remote/control_plane/collector.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_fixtures import REPO, stage_env

#: Registered before the entry point runs, so it runs after the entry point's own exit handler.
FROZEN = """
import atexit, gc
atexit.register(lambda: print("frozen", gc.get_freeze_count()))
{entry}
"""
#: After the entry point, as many long-lived objects as torch's and transformers' imports leave.
FULL_COLLECTIONS = """
import gc
full = []
gc.callbacks.append(lambda phase, info: phase == "stop" and info["generation"] == 2 and full.append(1))
{entry}
kept = [[number] for number in range(350_000)]
print("full", len(full))
"""

BARE = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
ENTRIES = {
    # no AERIE_* variables: prep says so in one line and returns 2
    "prep": "from remote.stages import prep\nprep.main()",
    # the entry point extract, train, infer, eval and the chunked route share
    "stages.main": "from remote import stages\nstages.main('probe', lambda ctx, progress: None, ())",
}


def printed(probe: str, entry: str, env: dict[str, str], word: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", probe.format(entry=entry)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    return int(done.stdout.split(word)[-1]), done.stdout + done.stderr


def entry_env(name: str, tmp_path: Path) -> dict[str, str]:
    return stage_env(tmp_path, "prep", {}, {}) if name == "stages.main" else BARE


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_an_entry_point_leaves_its_objects_frozen_when_the_process_exits(name: str, tmp_path: Path) -> None:
    count, out = printed(FROZEN, ENTRIES[name], entry_env(name, tmp_path), "frozen")
    assert count > 1000, out  # every object the process still tracks


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_after_an_entry_point_an_import_s_worth_of_long_lived_objects_makes_no_full_collection(
        name: str, tmp_path: Path) -> None:
    count, out = printed(FULL_COLLECTIONS, ENTRIES[name], entry_env(name, tmp_path), "full")
    assert count == 0, out


def test_without_an_entry_point_nothing_is_frozen_and_the_same_objects_make_full_collections() -> None:
    frozen, out = printed(FROZEN, "import remote.control_plane.collector", BARE, "frozen")
    assert frozen == 0, out
    full, out = printed(FULL_COLLECTIONS, "import remote.control_plane.collector", BARE, "full")
    assert full >= 3, out  # Python's defaults
