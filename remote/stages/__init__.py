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
                    the dataset's inventory entry, the stage's settings and the
                    inventory's shared settings (tokenizer, layers, server ...)
==================  ==========================================================

The exit code and the progress counters decide the job's state: non-zero is
`failed`, zero with no records written is `empty`, zero with records is
`succeeded`. A stage reads its context with `StageContext.from_env()`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from remote.control_plane.progress import Progress

#: The command of each known stage; ``{python}`` is the host's interpreter.
DEFAULT_COMMANDS = {
    "prep": "{python} -m remote.stages.prep",
    "infer": "{python} -m remote.stages.infer",
    "extract": "{python} -m remote.stages.extract",
    "train": "{python} -m remote.stages.train",
    # The prep code again, over the infer stage's answers (prompts datasets).
    "tokenize": "{python} -m remote.stages.prep",
    # `inv eval`: the draft measured on SGLang, with and without speculation (job draft/eval).
    "eval": "{python} -m remote.stages.eval",
    # The chunked route: extract a chunk, train on it, delete it, for every chunk (remote.orchestration.chunked).
    "chunked": "{python} -m remote.orchestration.chunked",
    # `inv run`'s pipeline runner, itself a supervised job (remote.orchestration.runner).
    "run": "{python} -m remote.orchestration.runner",
}


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
            root=Path(env["AERIE_ROOT"]),
            release=env.get("AERIE_RELEASE", ""),
            dataset=env["AERIE_DATASET"],
            stage=env["AERIE_STAGE"],
            source=env.get("AERIE_SOURCE", ""),
            kind=env.get("AERIE_KIND", "native"),
            output=Path(env["AERIE_OUTPUT"]),
            data=Path(env["AERIE_DATA"]),
            config=json.loads(env.get("AERIE_CONFIG") or "{}"),
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
        return self.data / stage

    def inputs(self, stage: str) -> list[Path]:
        """The directories to read: the pipeline's choice (``config["inputs"]``, e.g. every
        dataset's extract output for the draft), else this dataset's `stage` output."""
        given = self.config.get("inputs")
        return [Path(p) for p in given] if given else [self.upstream(stage)]


def main(name: str, run: Callable[[StageContext, Progress], object], refusals: tuple[type[Exception], ...]) -> None:
    """A stage's entry point: its context and progress, and a refusal (a `refusals` error: a
    mistake the user can fix) as one line on stderr and exit 1, never a traceback."""
    ctx = StageContext.from_env()
    with Progress.from_env() as progress:
        try:
            run(ctx, progress)
        except refusals as exc:
            progress.note(str(exc))
            raise SystemExit(f"{name}: {exc}") from None
