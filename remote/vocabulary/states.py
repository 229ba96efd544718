"""Job states, in lifecycle order.

Shared vocabulary: the host decides a job's state, the workstation colours it.
"""

from __future__ import annotations

from enum import Enum

#: The pseudo datasets of `inv run`'s own jobs, named once for both sides: its runner (`pipeline/run`)
#: and the draft trained over every dataset (`draft/train`, `draft/chunked`, `draft/eval`). Neither
#: can be a dataset's name (local/inventory/values.py refuses them).
RUNNER = "pipeline"
DRAFT = "draft"
#: The runner's stage: the runner's job is (RUNNER, RUNNER_STAGE); `remote.vocabulary.layout` keys it.
RUNNER_STAGE = "run"


class JobState(str, Enum):
    WAITING = "waiting"
    """Queued behind jobs whose outputs it needs (`inv run`)."""
    RUNNING = "running"
    """The supervisor is alive and the stage reported progress recently."""
    STALLED = "stalled"
    """Alive, but no progress or heartbeat for longer than the stage's `stall_after`."""
    SUCCEEDED = "succeeded"
    """Exited 0 having written at least one record."""
    EMPTY = "empty"
    """Exited 0 having written zero records: a failure, never a success."""
    FAILED = "failed"
    """Exited non-zero."""
    BLOCKED = "blocked"
    """Never started, and never will in this run: a job it needs ended without succeeding (`blocked_by`
    names those needs). `inv rerun --failed` relaunches what failed upstream, then it."""
    DIED = "died"
    """Ended by a signal `inv stop` did not send (the OOM killer, systemd at shutdown, an operator's
    kill), or gone without an exit code (kill -9 of its supervisor, a host reboot)."""
    STOPPED = "stopped"
    """Ended by `inv stop`, and only by it (its request is recorded before it signals)."""
    BROKEN = "broken"
    """Its files on the host cannot be read (a torn or foreign state.json, bytes that are not JSON):
    listed with the reason, never taking the other jobs down; `inv rerun --failed` starts it afresh."""

    def is_terminal(self) -> bool:
        return self not in (JobState.WAITING, JobState.RUNNING, JobState.STALLED)

    def is_bad(self) -> bool:
        """The states `inv rerun --failed` relaunches and `inv status` exits non-zero on."""
        return self in BAD


BAD = frozenset({JobState.FAILED, JobState.DIED, JobState.EMPTY, JobState.STALLED, JobState.BROKEN, JobState.BLOCKED})

#: A dataset's stages in the order a pipeline runs them (and the status table lists them); the draft's
#: jobs (`draft/chunked`, `draft/train`, `draft/eval`) and the runner's last.
STAGE_ORDER = ("prep", "infer", "tokenize", "extract", "chunked", "train", "eval", RUNNER_STAGE)


def quiet_for(state: dict, progress: dict, now: float) -> float | None:
    """Seconds without a sign of progress, when that is longer than the job's `stall_after` (stalled); else None.
    The one stall rule, for every executor."""
    quiet = now - max(progress.get("updated_at") or 0, state.get("started_at") or 0)
    return quiet if quiet > state["stall_after"] else None
