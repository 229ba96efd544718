"""The stage contract: how the supervisor runs a stage, whatever the stage does.

A stage is a shell command (by default ``{python} -m remote.stages.<name>``;
the inventory's ``stages.<name>.command`` overrides it). The supervisor runs it
from the job's release directory, with that directory on ``PYTHONPATH``, its
output appended to the job's log, and these environment variables:

==================  ==========================================================
AERIE_ROOT          the host's aerie root (releases, jobs and data live there)
AERIE_RELEASE       the release id this job runs
AERIE_DATASET       the dataset name, e.g. ``A1``
AERIE_STAGE         the stage name, e.g. ``prep``
AERIE_SOURCE        the dataset's source: a hub id or a path on the host
                    (a relative path is taken from the release directory)
AERIE_KIND          ``native`` or ``prompts``
AERIE_OUTPUT        ``<root>/data/<dataset>/<stage>/``: where the stage writes
                    (created by the supervisor; the stage writes through
                    temporary names and renames into place)
AERIE_DATA          ``<root>/data/<dataset>/``: where upstream stages wrote
AERIE_PROGRESS      the progress file; use `remote.control_plane.progress.Progress`
AERIE_CONFIG        JSON: ``{"dataset": {...}, "stage": {...}, "inventory": {...}}``,
                    the dataset's inventory entry, the stage's settings (every
                    one, defaults resolved: extract's ``layers`` among them) and
                    what every stage shares of the inventory (the target:
                    ``model``, ``tokenizer``, ``trust_remote_code``)
==================  ==========================================================

The exit code and the progress counters decide the job's state: non-zero is
`failed`, zero with no records written is `empty`, zero with records is
`succeeded`. A stage reads its context with `StageContext.from_env()`. The variables
are written by `remote.control_plane.stage_contract` (their names, the default commands),
for the supervisor and for the chunked route's per-chunk stages alike.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from remote.control_plane import collector, disk, logfile
from remote.vocabulary import layout
from remote.control_plane.progress import Progress
from remote.control_plane.stage_contract import (
    CONFIG_ENV, DATA_ENV, DATASET_ENV, KIND_ENV, OUTPUT_ENV, RELEASE_ENV, ROOT_ENV, SOURCE_ENV, STAGE_ENV,
)


@dataclass(frozen=True)
class StageContext:
    """What the supervisor tells a stage, read back from the environment."""

    root: Path
    release: str
    dataset: str
    stage: str
    source: str
    kind: str
    output: Path
    data: Path
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "StageContext":
        env = os.environ if env is None else env
        return cls(
            root=Path(env[ROOT_ENV]),
            release=env.get(RELEASE_ENV, ""),
            dataset=env[DATASET_ENV],
            stage=env[STAGE_ENV],
            source=env.get(SOURCE_ENV, ""),
            kind=env.get(KIND_ENV, "native"),
            output=Path(env[OUTPUT_ENV]),
            data=Path(env[DATA_ENV]),
            config=json.loads(env.get(CONFIG_ENV) or "{}"),
        )

    @property
    def dataset_config(self) -> dict[str, Any]:
        return self.config.get("dataset", {})

    @property
    def stage_config(self) -> dict[str, Any]:
        return self.config.get("stage", {})

    @property
    def shared_config(self) -> dict[str, Any]:
        return self.config.get("inventory", {})

    def upstream(self, stage: str) -> Path:
        """The output directory of an earlier stage of the same dataset."""
        return layout.stage_output(self.data, stage)

    def inputs(self, stage: str) -> list[Path]:
        """The directories to read: the pipeline's choice (``config["inputs"]``, e.g. every
        dataset's extract output for the draft), else this dataset's `stage` output."""
        given = self.config.get("inputs")
        return [Path(p) for p in given] if given else [self.upstream(stage)]


def main(name: str, run: Callable[[StageContext, Progress], object], refusals: tuple[type[Exception], ...]) -> None:
    """A stage's entry point: its context and progress, and a refusal (a `refusals` error: a
    mistake the user can fix) or a full disk (the path and the room left) as one line on stderr
    and exit 1, never a traceback."""
    collector.tune()
    logfile.whole_lines()
    ctx = StageContext.from_env()
    try:
        with Progress.from_env() as progress:
            try:
                run(ctx, progress)
            except refusals as exc:
                _say(progress, str(exc))
                raise SystemExit(f"{name}: {exc}") from None
    except OSError as exc:
        if not disk.is_no_room(exc):
            raise
        raise SystemExit(disk.failed_write(name, exc, ctx.output)) from None


def _say(progress: Progress, line: str) -> None:
    try:
        progress.note(line)
    except OSError:
        pass  # a full disk: the line still ends the stage

