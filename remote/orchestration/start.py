"""How `inv run` starts a plan: under the pipeline runner (a job itself), or, where the executor
queues jobs itself (Slurm), every job queued at once after the jobs it needs."""

from __future__ import annotations

from pathlib import Path

from remote.control_plane import executors, jobs
from remote.vocabulary import layout
from remote.control_plane.queue_order import submit_in_order
from remote.control_plane.store import JobStore

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any


def run(args: dict[str, Any]) -> dict[str, Any]:
    """`inv run`: the plan started (`runner`, or `queued`). Its up-to-date jobs are left out
    (`up_to_date`; all of them run with `force`), and it says why each succeeded job it runs again is
    out of date (`out_of_date`, `remote.control_plane.freshness`); with nothing out of date, no runner
    starts (`runner`: None)."""
    from remote.control_plane import freshness

    root, spec = Path(args["root"]), args["spec"]
    stage = spec["config"]["stage"]
    current: list[str] = []
    stale: dict[str, Any] = {}
    if not args.get("force"):
        stage["plan"], current, stale = freshness.prune(root, stage["plan"])
    found = {"up_to_date": current, "out_of_date": stale}
    if not stage["plan"]:
        return {"runner": None, **found}
    return {**start_pipeline(root, spec), **found}


def start_pipeline(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    stage = spec["config"]["stage"]
    plan = stage["plan"]
    if plan and all(executors.for_spec(node["spec"]).queues for node in plan):
        # NOTE: no runner: the queue keeps the order, its resources keep the GPUs exclusive, and an
        # infer job starts its own server inside its allocation.
        specs = [node["spec"] | {"after": node["needs"], "order": index, "built_from": stage.get("built_from")}
                 | ({"server": stage.get("server")} if node["server"] else {})
                 for index, node in enumerate(plan)]
        return {"queued": submit_in_order(root, specs)}
    return {"runner": launch_runner(root, spec, plan)}


def launch_runner(root: Path, spec: dict[str, Any], plan: list[dict[str, Any]]) -> dict[str, Any]:
    """Start the runner, with the jobs of `plan` it is to run recorded `waiting` on it before it runs
    and before the answer: nothing shows the last run's end states as this run's (the first frame the
    workstation draws, a `wait_state` right after the command), and no record of the queue lands over
    one the runner wrote (a job it started, and which may have ended already)."""
    from remote.orchestration import runner  # here: only a run needs it

    def queue() -> None:
        runner.queue(root, plan, JobStore(root).read(layout.runner_dir(root)).state)

    return jobs.launch(root, spec, before_it_runs=queue)
