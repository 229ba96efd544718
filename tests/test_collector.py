"""A stage's process freezes the cyclic collector's objects at exit (remote/control_plane/collector.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_fixtures import REPO, stage_env

#: Registered before the entry point runs, so it runs after the entry point's own exit handler.
PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count()))
{entry}
"""

BARE = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
ENTRIES = {
    # no AERIE_* variables: prep says so in one line and exits 2
    "prep": "from remote.stages import prep\nsys.exit(prep.main())",
    # the entry point extract, train, infer, eval and the chunked route share
    "stages.main": "from remote import stages\nstages.main('probe', lambda ctx, progress: None, ())",
}


def frozen_at_exit(entry: str, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(entry=entry)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    return int(done.stdout.split("frozen")[-1]), done.stdout


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_an_entry_point_leaves_its_objects_frozen_when_the_process_exits(name: str, tmp_path: Path) -> None:
    env = stage_env(tmp_path, "prep", {}, {}) if name == "stages.main" else BARE
    count, out = frozen_at_exit(ENTRIES[name], env)

    assert count > 1000, out  # every object the process still tracks


def test_without_an_entry_point_nothing_is_frozen() -> None:
    count, out = frozen_at_exit("import remote.control_plane.collector", BARE)
    assert count == 0, out
