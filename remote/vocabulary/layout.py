"""Where things live under the host's aerie root: the one module that knows the layout.

::

    <root>/jobs/<dataset>/<stage>/   a job's files (remote.control_plane.store reads and checks them)
    <root>/jobs/pipeline/server.json the inference server `inv run`'s runner manages (and server.log)
    <root>/jobs/pipeline/extract-session.json  the target loaded once for its extract jobs
    <root>/data/<dataset>/           where a dataset's stages write, one directory per stage
    <root>/data/<dataset>/<stage>/   a stage's output (AERIE_OUTPUT), read by the stages after it
    <root>/cache/target-sizes/       what each target's safetensors headers add up to (remote.eagle3.target_memory)

Every other module asks here, so that a change of layout is one change. The
exception is `remote.control_plane.release`, which the workstation sends to the
host as source text and runs on its own (no imports from `remote`): its own
spelling of ``jobs`` and ``state.json`` is checked against this module's by
tests/test_remote_layout.py.

Standard library only and cheap to import: every `inv status` loads it. A root keeps its
type: the workstation names the host's paths with a `PurePosixPath`.
"""

from __future__ import annotations

from pathlib import Path

from remote.vocabulary.states import RUNNER, RUNNER_STAGE

JOBS, DATA, CACHE = "jobs", "data", "cache"
#: A job's files (store.py says what each holds).
STATE, SPEC, PROGRESS, LOG, LOCK, STOP = "state.json", "spec.json", "progress.json", "log", "launch.lock", "stop.json"
#: A Slurm job's batch script, beside its other files.
SCRIPT = "job.sh"
#: An inference server's record and log: in the runner's dataset directory (the pipeline's one server),
#: or in an infer job's own directory (the server it starts inside its Slurm allocation).
SERVER_RECORD, SERVER_LOG = "server.json", "server.log"
#: What a release holds about itself, in its own root (written by release.py, which is sent as source
#: and so spells it itself: tests/test_layout.py holds the two spellings equal).
RELEASE_MANIFEST = ".aerie-release.json"


def job_key(dataset: str, stage: str) -> str:
    """``dataset/stage``: how plans, `after` lists and the status name a job."""
    return f"{dataset}/{stage}"


#: The key of `inv run`'s runner job.
RUNNER_KEY = job_key(RUNNER, RUNNER_STAGE)


def key_of(directory: Path) -> str:
    """The key of the job whose files are in `directory`."""
    return job_key(directory.parent.name, directory.name)


def jobs_dir(root: Path) -> Path:
    return root / JOBS


def job_dir(root: Path, dataset: str, stage: str) -> Path:
    """A job's directory, its names unchecked (`JobStore.directory` checks them)."""
    return jobs_dir(root) / dataset / stage


def key_dir(root: Path, key: str) -> Path:
    """The directory of the job named ``dataset/stage``."""
    return jobs_dir(root) / key


def root_of(directory: Path) -> Path:
    """The aerie root a job's directory lies under."""
    return directory.parents[2]


def runner_dir(root: Path) -> Path:
    """The directory of `inv run`'s runner job."""
    return job_dir(root, RUNNER, RUNNER_STAGE)


def server_record(root: Path) -> Path:
    """The record of the inference server `inv run`'s runner manages; its log is beside it (`SERVER_LOG`)."""
    return jobs_dir(root) / RUNNER / SERVER_RECORD


def extract_session(root: Path) -> Path:
    """Where the extract phase's session of `inv run`'s runner (`remote.orchestration.extract_session`) says
    where it listens, while it runs."""
    return jobs_dir(root) / RUNNER / "extract-session.json"


def target_sizes(root: Path) -> Path:
    """Where a plan keeps what a target's headers add up to, one file per model directory."""
    return root / CACHE / "target-sizes"


def data_root(root: Path) -> Path:
    """Where every dataset's data directory lies."""
    return root / DATA


def data_dir(root: Path, dataset: str) -> Path:
    """Where a dataset's stages write (AERIE_DATA)."""
    return data_root(root) / dataset


def output_dir(root: Path, dataset: str, stage: str) -> Path:
    """Where one stage of a dataset writes (AERIE_OUTPUT)."""
    return stage_output(data_dir(root, dataset), stage)


def stage_output(data: Path, stage: str) -> Path:
    """A stage's output inside a dataset's data directory (or a chunk's, on the chunked route)."""
    return data / stage
