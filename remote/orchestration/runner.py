"""The pipeline runner: `inv run` on the host, a job like any other (``pipeline/run``).

It starts each job of the plan once the jobs it needs have succeeded *in this run* (a fresh `inv
run`: what an earlier run left counts for nothing; a resumed one, `inv rerun --failed`: what had
succeeded stays done), and keeps the GPU exclusive, in phases: every infer job under one start of
the inference server (stopped once no infer job is left, so a prompts dataset whose prep ends late
still joins it), then every extract job under one load of the target (the extract session,
`remote.orchestration.extract_session`, stopped once no extract job is left), then the rest (train).
Jobs it cannot start yet are recorded as `waiting`, with what they wait for (their needs, then the
GPU phase); a job whose need ended without succeeding (or is itself blocked) is `blocked`, for good
in this run, naming those needs (`blocked_by`).

The runner ends when nothing can run any more, failed unless every job succeeded. A job of the run
stopped by `inv stop` (or the runner itself) stops the run: every job it had not started is recorded
`stopped`, and the runner ends `stopped` once the jobs running have ended; `inv rerun --failed`
resumes it. It outlives the SSH session like every job, and a second runner (after `inv rerun
--failed`) adopts the jobs and the server it finds, and starts the failed, blocked and stopped ones again.

The plan, built by the workstation (local/jobs/pipeline.py), is a list of nodes::

    {"key": "A1/extract", "needs": ["A1/prep"], "gpu": true, "server": false, "spec": {...}}
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from remote.control_plane import disk, inference_server, jobs, notify
from remote.vocabulary import layout
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.vocabulary.states import RUNNER, JobState
from remote.control_plane.store import BrokenJob, JobStore, read_object
from remote.orchestration import extract_session
from remote.stages import StageContext

TICK_SECONDS = 0.5
ACTIVE = (JobState.RUNNING, JobState.STALLED)
#: The GPU's phases, in order: a GPU job waits while a job of an earlier phase is left (any other: last).
PHASES = {"infer": 0, "extract": 1}


def phase(node: dict[str, Any]) -> int:
    return PHASES.get(node["spec"]["stage"], len(PHASES))


def record(root: Path, node: dict[str, Any], fields: dict[str, Any]) -> None:
    """The state of a job the runner has not started, unless it is already so."""
    directory = layout.key_dir(root, node["key"])
    directory.mkdir(parents=True, exist_ok=True)
    state = {"dataset": node["spec"]["dataset"], "stage": node["spec"]["stage"], "executor": "process",
             "stall_after": 10 ** 9, **fields}
    try:
        recorded = read_object(directory / layout.STATE)
    except BrokenJob:
        recorded = None  # a broken record: this one replaces it
    if recorded != state:
        write_json_atomic(directory / layout.STATE, state)


def queue(root: Path, plan: list[dict[str, Any]], runner: dict[str, Any]) -> None:
    """Every job of the run recorded as `waiting` on its needs (`runner`: the runner's state, whose pid
    they carry), so that no view shows the last run's states as this one's; a job running already is left.
    Written by the command that starts the runner, before the runner runs: the jobs' states have one
    writer at a time."""
    now = time.time()
    for node in plan:
        if jobs.describe(layout.key_dir(root, node["key"]), now)["state"] in (s.value for s in ACTIVE):
            continue
        record(root, node, {"state": JobState.WAITING.value, "waiting_for": node["needs"], "message": "queued",
                            **{k: runner.get(k) for k in ("pid", "pid_start", "boot_id")}})


class Runner:
    def __init__(self, ctx: StageContext, progress: Progress) -> None:
        self.root = ctx.root
        self.plan: list[dict[str, Any]] = ctx.stage_config["plan"]
        self.server_settings: dict[str, Any] = ctx.stage_config.get("server") or {}
        self.progress = progress
        self.me = read_json(layout.runner_dir(self.root) / layout.STATE, {})
        self.fresh = ctx.stage_config.get("fresh", True)
        # What this run has started (or blocked); a need is met by its success in this run alone.
        # Resumed (`inv rerun`): what had succeeded stays done, and counts as met.
        self.started: set[str] = set()
        self.roots: dict[str, list[str]] = {}  # a blocked job's failed needs, however far upstream
        if not self.fresh:
            self.started = {n["key"] for n in self.plan if self.state_of(n["key"]) == JobState.SUCCEEDED}
        self.stopped_by: str = ""  # what stopped the run: a job of it, or the runner's own stop
        self.ended: JobState | None = None  # how the run ended, with `summary` saying why
        self.summary = ""
        record_path = layout.server_record(self.root)
        self.server = inference_server.ManagedServer(self.server_settings, record_path.with_name(layout.SERVER_LOG), record_path)
        self.session = extract_session.Handle(self.root)

    def state_of(self, key: str) -> JobState | None:
        directory = layout.key_dir(self.root, key)
        if not (directory / layout.STATE).exists():
            return None
        return JobState(jobs.describe(directory, time.time())["state"])

    def run(self) -> int:
        try:
            self.loop()
        except SystemExit:  # SIGTERM (`_on_term`): `inv stop` of the runner, or of every job
            asked = (layout.runner_dir(self.root) / layout.STOP).exists()
            self.stopped_by = self.stopped_by or f"the pipeline runner was {'stopped' if asked else 'killed by a signal'}"
            self.stop_unstarted()
            raise
        finally:
            self.stop_server()
            self.stop_session()
        return self.finish()

    def loop(self) -> None:
        while True:
            states = {n["key"]: self.state_of(n["key"]) for n in self.plan}
            pending = [n for n in self.plan if n["key"] not in self.started]
            active = [n for n in self.plan if n["key"] in self.started and states[n["key"]] in ACTIVE]
            if not self.stopped_by:
                self.notice_stop(states)
            if self.stopped_by:
                pending = []  # nothing more starts: the jobs running end on their own
            if not pending and not active:
                break
            self.schedule(pending, active, states)
            self.end_phases(active)
            self.progress.beat()
            time.sleep(TICK_SECONDS)

    def notice_stop(self, states: dict[str, JobState | None]) -> None:
        """A job this run started was stopped (`inv stop`): the run stops with it."""
        stopped = [k for k in self.started if states.get(k) == JobState.STOPPED]
        if stopped:
            self.stopped_by = f"{', '.join(sorted(stopped))} stopped by inv stop"
            self.stop_unstarted()

    def stop_unstarted(self) -> None:
        """Every job the run had not started, recorded `stopped` (no runner is left to start it)."""
        for node in self.plan:
            if node["key"] not in self.started and self.state_of(node["key"]) not in ACTIVE:
                record(self.root, node, {"state": JobState.STOPPED.value, "ended_at": time.time(),
                                         "message": f"not started: {self.stopped_by}; `inv rerun --failed` resumes the run"})
                self.started.add(node["key"])

    def finish(self) -> int:
        """The run's end state and summary (`ended`, `summary`), said in the log and the runner's note."""
        said = self.outcome()
        if self.stopped_by:
            self.ended, self.summary = JobState.STOPPED, f"stopped ({self.stopped_by}): {said}"
            # NOTE: the runner's own stop request, so its supervisor records `stopped`, not `failed`.
            JobStore(self.root).request_stop(layout.runner_dir(self.root))
        elif said:
            self.ended, self.summary = JobState.FAILED, f"incomplete: {said}"
        else:
            self.ended, self.summary = JobState.SUCCEEDED, f"all {len(self.plan)} jobs succeeded"
        self.progress.note(self.summary)
        print(f"pipeline {'done' if self.ended == JobState.SUCCEEDED else self.summary}", flush=True)
        return 0 if self.ended == JobState.SUCCEEDED else 1

    def outcome(self) -> str:
        """What kept the run from succeeding, by state ("" when every job did)."""
        by_state: dict[str, list[str]] = {}
        for node in self.plan:
            state = self.state_of(node["key"])
            if state != JobState.SUCCEEDED:
                by_state.setdefault(state.value if state else "not started", []).append(node["key"])
        return "; ".join(f"{len(keys)} {state}: {', '.join(keys)}" for state, keys in by_state.items())

    def schedule(self, pending: list[dict[str, Any]], active: list[dict[str, Any]], states: dict[str, JobState | None]) -> None:
        settled = set(self.started)  # jobs started this tick have no state of this run yet
        for node in pending:
            # Met: succeeded in this run (a need started this tick may still show its last run's `succeeded`).
            unmet = [k for k in node["needs"] if not (k in settled and states.get(k) == JobState.SUCCEEDED)]
            # A need this run started that is neither running nor succeeded has ended without
            # succeeding, or is blocked itself: it never will succeed in this run.
            never = [k for k in unmet if k in settled and states.get(k) not in (*ACTIVE, JobState.WAITING)]
            gpu = self.gpu_wait(node, active) if node["gpu"] and not unmet else ([], "")
            if never:
                self.block(node, never, states)
                self.started.add(node["key"])  # never starts in this run
            elif unmet or gpu[0]:
                self.wait(node, unmet or gpu[0], "" if unmet else gpu[1])
            else:
                if node["gpu"]:
                    self.prepare_gpu(node)
                self.start(node)
                active.append(node)

    def gpu_wait(self, node: dict[str, Any], active: list[dict[str, Any]]) -> tuple[list[str], str]:
        """What a GPU job whose needs are met waits for: the jobs of an earlier phase left, else the GPU's holder."""
        running = {n["key"] for n in active}
        earlier = [n["key"] for n in self.plan if n["gpu"] and phase(n) < phase(node)
                   and (n["key"] not in self.started or n["key"] in running)]
        if earlier:
            return earlier, f"the GPU: its {node['spec']['stage']} phase comes after these"
        return [n["key"] for n in active if n["gpu"]], "the GPU is in use"

    def wait(self, node: dict[str, Any], waiting_for: list[str], message: str) -> None:
        record(self.root, node, {
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
        record(self.root, node, {"state": JobState.BLOCKED.value, "blocked_by": never, "ended_at": time.time(),
                                 "message": f"blocked by {said}"})

    def start(self, node: dict[str, Any]) -> None:
        result = jobs.launch(self.root, node["spec"])
        print(f"{node['key']}: {'started' if result['launched'] else result['reason']}", flush=True)
        self.started.add(node["key"])
        if result["launched"]:
            self.progress.written()

    # -- the GPU's phases: the inference server, the extract session ------------

    def prepare_gpu(self, node: dict[str, Any]) -> None:
        """The server holds the GPU for infer jobs, the extract session for extract jobs; each gives it up
        for anything else."""
        if node.get("server"):
            self.stop_session()
            self.ensure_server()
            return
        self.stop_server()
        if extract_session.serves(node):
            self.ensure_session()
        else:
            self.stop_session()

    def end_phases(self, active: list[dict[str, Any]]) -> None:
        """Stop the server once no infer job of the run is left, and the session once no extract job is."""
        running = {n["key"] for n in active}
        left = {n["spec"]["stage"] for n in self.plan if n["key"] not in self.started or n["key"] in running}
        if "infer" not in left:
            self.stop_server()
        if "extract" not in left:
            self.stop_session()

    def ensure_server(self) -> None:
        if not self.server.is_managed:
            return  # a server managed outside aerie
        if self.server.started is None:
            self.progress.note("infer phase: starting the inference server")
        started = self.server.ensure(sys.executable)
        if started is not None:
            print(f"server: started pid {started}", flush=True)
            self.progress.note(f"infer phase: inference server healthy (pid {started})")

    def stop_server(self) -> None:
        stopped = self.server.stop()
        if stopped is not None:
            print(f"server: stopped pid {stopped}", flush=True)
            self.progress.note("inference server stopped: the infer phase is over")

    def ensure_session(self) -> None:
        started = self.session.start()
        if started is not None:
            print(f"extract session: started pid {started}", flush=True)
            self.progress.note(f"extract phase: the target is loaded once for every extract job (pid {started})")

    def stop_session(self) -> None:
        stopped = self.session.stop()
        if stopped is not None:
            print(f"extract session: stopped pid {stopped}", flush=True)
            self.progress.note("extract session stopped: the extract phase is over")


def _on_term(signum: int, frame: object) -> None:
    # The server and the extract session run in sessions of their own: a runner ended by `inv stop` (or
    # any SIGTERM) must stop them on its way out (`Runner.run`'s finally), or they keep the GPUs, and
    # record the jobs it had not started. Once: a second signal must not cut that short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main() -> int:
    ctx = StageContext.from_env()
    signal.signal(signal.SIGTERM, _on_term)
    try:
        with Progress.from_env() as progress, notify.watching(ctx.root, ctx.stage_config):
            return Runner(ctx, progress).run()  # how it ended: `Runner.ended`, and why: `Runner.summary`
    except (OSError, inference_server.ServerError) as exc:
        # NOTE: its own bookkeeping (progress, the jobs' records, the server's) could not be written, a full
        # disk most often, or the infer phase's server would not start, a setting of stages.infer most often:
        # the run ends in one line, and no job is left waiting on a runner gone.
        line = disk.failed_write(RUNNER, exc, ctx.root) if isinstance(exc, OSError) else str(exc)
        end_unstarted(ctx.root, ctx.stage_config.get("plan") or [], line)
        print(line, file=sys.stderr, flush=True)
        return 1
    finally:  # ended, failed or stopped (`_on_term`): word of it, read from the jobs' states
        notify.run_ended(ctx.root, ctx.stage_config)


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
