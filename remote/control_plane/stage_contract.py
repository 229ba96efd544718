"""The stage contract, written: the environment and the command a stage is run with.

`remote.stages` documents the contract and reads it back (`StageContext.from_env`);
this module is the one place that builds it, for the supervisor (a job's stage) and
for the chunked route (its per-chunk stages, when they run as commands of their own),
so that both run a stage the same way. It lives in the control plane because the
supervisor runs under ``python -S`` with the standard library only: the stages import
the variables' names from here, never the other way round.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from remote.control_plane import scratch
from remote.vocabulary import layout
from remote.control_plane.progress import PROGRESS_ENV
from remote.vocabulary.states import RUNNER_STAGE

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any

#: The contract's variables (remote/stages/__init__.py says what each holds); the progress file's
#: and the run id's are named by their readers (`remote.control_plane.progress`, `.scratch`).
ROOT_ENV = "AERIE_ROOT"
RELEASE_ENV = "AERIE_RELEASE"
DATASET_ENV = "AERIE_DATASET"
STAGE_ENV = "AERIE_STAGE"
SOURCE_ENV = "AERIE_SOURCE"
KIND_ENV = "AERIE_KIND"
OUTPUT_ENV = "AERIE_OUTPUT"
DATA_ENV = "AERIE_DATA"
CONFIG_ENV = "AERIE_CONFIG"

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
    RUNNER_STAGE: "{python} -m remote.orchestration.runner",
}


def stage_env(spec: dict[str, Any], directory: Path, release: Path, run: str = "") -> dict[str, str]:
    """Every variable of a job's stage: the job's spec, its directory (`directory`) and its release."""
    root = layout.root_of(directory)
    return {
        ROOT_ENV: str(root),
        RELEASE_ENV: release.name,
        SOURCE_ENV: spec.get("source", ""),
        KIND_ENV: spec.get("kind", "native"),
        scratch.RUN_ENV: run or scratch.run_id(),
        **stage_variables(spec["dataset"], spec["stage"], layout.data_dir(root, spec["dataset"]),
                          directory / layout.PROGRESS, spec.get("config", {})),
    }


def stage_variables(dataset: str, stage: str, data: Path, progress: Path, config: dict[str, Any]) -> dict[str, str]:
    """The variables that say which stage runs, over what, and where it writes (``<data>/<stage>``).

    The chunked route sets only these for a stage it runs per chunk: the root, release, source,
    kind and run id are its own job's, inherited."""
    return {
        DATASET_ENV: dataset,
        STAGE_ENV: stage,
        OUTPUT_ENV: str(layout.stage_output(data, stage)),
        DATA_ENV: str(data),
        PROGRESS_ENV: str(progress),
        CONFIG_ENV: json.dumps(config),
    }


def stage_command(stage: str, command: str | None = None) -> str:
    """The shell command of `stage`: `command` as configured, else the stage's default."""
    return (command or DEFAULT_COMMANDS[stage]).replace("{python}", sys.executable)
