"""The pipeline runner: `inv run` on the host, a job like any other (``pipeline/run``).

It starts each job of the plan once the jobs it needs have succeeded, keeps the
GPU exclusive (the inference server, extraction and training never share it),
starts the inference server for the infer jobs and stops it before anything
else needs the GPU. Jobs it cannot start yet are recorded as `waiting`, with
what they wait for; a job whose need ended without succeeding (or is itself
blocked) is `blocked`, for good in this run, naming those needs (`blocked_by`).
The runner ends when nothing can run any more, failed unless every job
succeeded. It outlives the SSH session like every job, and a second runner
(after `inv rerun --failed`) adopts the jobs and the server it finds, and starts
the failed and blocked ones again.

The plan, built by the workstation (local/jobs/pipeline.py), is a list of nodes::

    {"key": "A1/extract", "needs": ["A1/prep"], "gpu": true, "server": false, "spec": {...}}
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from remote.control_plane import disk, inference_server, jobs, layout
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.stages import StageContext
from remote.control_plane.states import JobState
from remote.control_plane.store import BrokenJob, read_object

TICK_SECONDS = 0.5
ACTIVE = (JobState.RUNNING, JobState.STALLED)


class Runner:
    def __init__(self, ctx: StageContext, progress: Progress) -> None:
        self.root = ctx.root
        self.plan: list[dict[str, Any]] = ctx.stage_config["plan"]
        self.server_settings: dict[str, Any] = ctx.stage_config.get("server") or {}
        self.progress = progress
        self.me = read_json(layout.runner_dir(self.root) / layout.STATE, {})
        # Fresh (`inv run`): every job runs again. Resumed (`inv rerun`): succeeded jobs stay done.
        self.started: set[str] = set()
        self.roots: dict[str, list[str]] = {}  # a blocked job's failed needs, however far upstream
        if not ctx.stage_config.get("fresh", True):
            self.started = {n["key"] for n in self.plan if self.state_of(n["key"]) == JobState.SUCCEEDED}
        record = layout.server_record(self.root)
        self.server = inference_server.ManagedServer(self.server_settings, record.with_name(layout.SERVER_LOG), record)

    def state_of(self, key: str) -> JobState | None:
        directory = layout.key_dir(self.root, key)
        if not (directory / layout.STATE).exists():
            return None
        return JobState(jobs.describe(directory, time.time())["state"])

    def run(self) -> int:
        try:
            while True:
                states = {n["key"]: self.state_of(n["key"]) for n in self.plan}
                pending = [n for n in self.plan if n["key"] not in self.started]
                active = [n for n in self.plan if n["key"] in self.started and states[n["key"]] in ACTIVE]
                if not pending and not active:
                    break
                self.schedule(pending, active, states)
                self.progress.beat()
                time.sleep(TICK_SECONDS)
        finally:
            self.stop_server()
        outcome = self.outcome()
        self.progress.note(outcome or f"all {len(self.plan)} jobs succeeded")
        print(f"pipeline {outcome or 'done'}", flush=True)
        return 1 if outcome else 0

    def outcome(self) -> str:
        """What kept the run from succeeding, by state ("" when every job did)."""
        by_state: dict[str, list[str]] = {}
        for node in self.plan:
            state = self.state_of(node["key"])
            if state != JobState.SUCCEEDED:
                by_state.setdefault(state.value if state else "not started", []).append(node["key"])
        said = "; ".join(f"{len(keys)} {state}: {', '.join(keys)}" for state, keys in by_state.items())
        return f"incomplete: {said}" if said else ""

    def schedule(self, pending: list[dict[str, Any]], active: list[dict[str, Any]], states: dict[str, JobState | None]) -> None:
        gpu_busy = any(n["gpu"] for n in active)
        settled = set(self.started)  # jobs started this tick have no state yet
        launched: set[str] = set()
        for node in pending:
            # NOTE: a need started this tick may still show its last run's `succeeded` (a fresh
            # `inv run` over an old root): it is not met until it succeeds again.
            unmet = [k for k in node["needs"] if states.get(k) != JobState.SUCCEEDED or k in launched]
            # A need this run started that is neither running nor succeeded has ended without
            # succeeding, or is blocked itself: it never will succeed in this run.
            never = [k for k in unmet if k in settled and states.get(k) not in (*ACTIVE, JobState.WAITING)]
            if never:
                self.block(node, never, states)
                self.started.add(node["key"])  # never starts in this run
            elif unmet or (node["gpu"] and gpu_busy):
                holder = [n["key"] for n in active if n["gpu"]]
                self.wait(node, unmet or holder, "" if unmet else "the GPU is in use")
            else:
                if node["gpu"]:
                    self.prepare_gpu(node)
                    gpu_busy = True
                self.start(node)
                launched.add(node["key"])
                active.append(node)

    def wait(self, node: dict[str, Any], waiting_for: list[str], message: str) -> None:
        self.record(node, {
            "state": JobState.WAITING.value, "waiting_for": waiting_for, "message": message, "pid": self.me.get("pid"),
            "pid_start": self.me.get("pid_start"), "boot_id": self.me.get("boot_id"),
        })

    def block(self, node: dict[str, Any], never: list[str], states: dict[str, JobState | None]) -> None:
        """Record `node` as blocked behind its needs `never`, naming the failures at the root of them."""
        roots = sorted({root for need in never for root in self.roots.get(need, [need])})
        self.roots[node["key"]] = roots
        ended = ", ".join(f"{root} ({getattr(states.get(root), 'value', 'not started')})" for root in roots)
        said = ended if never == roots else f"{', '.join(never)}, behind {ended}"
        # NOTE: no pid: a blocked job has ended (nothing of it runs), and the runner's pid is not its own.
        self.record(node, {"state": JobState.BLOCKED.value, "blocked_by": never, "ended_at": time.time(),
                           "message": f"blocked by {said}"})

    def record(self, node: dict[str, Any], fields: dict[str, Any]) -> None:
        """The state of a job the runner has not started, unless it is already so."""
        directory = layout.key_dir(self.root, node["key"])
        directory.mkdir(parents=True, exist_ok=True)
        state = {"dataset": node["spec"]["dataset"], "stage": node["spec"]["stage"], "executor": "process",
                 "stall_after": 10 ** 9, **fields}
        try:
            recorded = read_object(directory / layout.STATE)
        except BrokenJob:
            recorded = None  # a broken record: this one replaces it
        if recorded != state:
            write_json_atomic(directory / layout.STATE, state)

    def start(self, node: dict[str, Any]) -> None:
        result = jobs.launch(self.root, node["spec"])
        print(f"{node['key']}: {'started' if result['launched'] else result['reason']}", flush=True)
        self.started.add(node["key"])
        if result["launched"]:
            self.progress.written()

    # -- the GPU and the inference server -------------------------------------

    def prepare_gpu(self, node: dict[str, Any]) -> None:
        """The server holds the GPU for infer jobs and must give it up for anything else."""
        if node.get("server"):
            self.ensure_server()
        else:
            self.stop_server()

    def ensure_server(self) -> None:
        if not self.server.is_managed:
            return  # a server managed outside aerie
        self.progress.note("starting the inference server")
        started = self.server.ensure(sys.executable)
        if started is not None:
            print(f"server: started pid {started}", flush=True)
        self.progress.note("inference server healthy")

    def stop_server(self) -> None:
        stopped = self.server.stop()
        if stopped is not None:
            print(f"server: stopped pid {stopped}", flush=True)

def _on_term(signum: int, frame: object) -> None:
    # The server runs in a session of its own: a runner ended by `inv stop` (or any SIGTERM) must stop
    # it on its way out (`Runner.run`'s finally), or it keeps the GPUs. Once: a second signal must not
    # cut that short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main() -> int:
    ctx = StageContext.from_env()
    signal.signal(signal.SIGTERM, _on_term)
    try:
        with Progress.from_env() as progress:
            return Runner(ctx, progress).run()
    except OSError as exc:
        # NOTE: its own bookkeeping (progress, the jobs' records, the server's) could not be written, a
        # full disk most often: the run ends in one line, and no job is left waiting on a runner gone.
        line = disk.failed_write("pipeline", exc, ctx.root)
        end_unstarted(ctx.root, ctx.stage_config.get("plan") or [], line)
        print(line, file=sys.stderr, flush=True)
        return 1


def end_unstarted(root: Path, plan: list[dict[str, Any]], line: str) -> None:
    """Every job the runner recorded `waiting` becomes `blocked` by the runner, which `inv rerun --failed`
    resumes; written in place where a full disk refuses a new file."""
    from remote.control_plane.supervisor import write_state_last

    for node in plan:
        path = layout.key_dir(root, node["key"]) / layout.STATE
        state = read_json(path, {})
        if isinstance(state, dict) and state.get("state") == JobState.WAITING.value:
            ended = {k: v for k, v in state.items() if k not in ("pid", "pid_start", "boot_id", "waiting_for")}
            ended.update(state=JobState.BLOCKED.value, blocked_by=[layout.RUNNER_KEY], ended_at=time.time(),
                         message=f"not started: {line}")
            try:
                write_state_last(path, ended)
            except OSError:
                pass  # its record still names the runner, which is gone: status says so


if __name__ == "__main__":
    sys.exit(main())
