"""The host's command line: ``python -m remote VERB 'JSON'``, one tagged JSON answer.

Run from the current release by the workstation (over SSH or locally). Every
verb takes one JSON object and prints one payload (`remote.vocabulary.wire`); a refusal is
``{"error": "..."}`` with exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from remote.control_plane import eta, gpus, jobs
from remote.vocabulary import layout, secrets
from remote.vocabulary.states import DRAFT
from remote.control_plane.store import HostError
from remote.vocabulary.wire import emit

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Callable

# NOTE: each verb imports the modules only it needs inside its body: every `inv status` starts Python
# here, and what the module imports at its top is what status waits for (see remote/__init__.py).


def status(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    from remote.control_plane import freshness

    query = gpus.Query()  # nvidia-smi answers while the jobs are read
    state = freshness.annotate(root, eta.annotate(root, jobs.status(root)))  # what is newer than each job's run
    return gpus.annotate(root, state, query)  # time left and GPUs: one round trip


def launch(args: dict[str, Any]) -> Any:
    root = Path(args["root"])
    if any("after" in spec for spec in args["specs"]):
        from remote.control_plane.queue_order import submit_in_order

        return submit_in_order(root, args["specs"])
    from remote.control_plane.pool import each

    # NOTE: a finished job is run again only when asked (`inv launch --force`): a relaunch replaces its output.
    return jobs.launch_all(root, args["specs"], each=each, keep_done=not args.get("force"))


def run(args: dict[str, Any]) -> Any:
    from remote.orchestration import start

    return start.run(args)


def rerun(args: dict[str, Any]) -> Any:
    from remote.orchestration.rerun import relaunch

    return relaunch(args)


def stop(args: dict[str, Any]) -> Any:
    from remote.control_plane.pool import each

    root = Path(args["root"])
    selected = jobs.selected(root, args.get("datasets"), args.get("stages"))
    return each(lambda d: jobs.stop(root, d.parent.name, d.name), selected)


def logs(args: dict[str, Any]) -> None:
    from remote.control_plane import log_stream

    log_stream.stream(Path(args["root"]), args["dataset"], args.get("stage"), args.get("lines", 50),
                      bool(args.get("follow")))


def check(args: dict[str, Any]) -> Any:
    from remote import preflight, readiness

    return preflight.run(args) + readiness.checks(args)


def plan(args: dict[str, Any]) -> Any:
    """`inv plan`'s figures, and what `inv run` would refuse to start on (`remote.readiness`)."""
    from remote import readiness, sizing

    try:
        return {**sizing.plan(args), "refusals": readiness.refusals(args)}
    except sizing.PlanError as exc:
        raise HostError(str(exc)) from None


def assets(args: dict[str, Any]) -> Any:
    from remote.demo import assets

    return assets.build(Path(args["root"]))


def eval_report(args: dict[str, Any]) -> Any:
    """The last `inv eval` report (remote/stages/eval.py)."""
    from remote.control_plane.progress import read_json

    report = read_json(layout.output_dir(Path(args["root"]), DRAFT, "eval") / "report.json")
    if report is None:
        raise HostError("no eval report on the host: the draft/eval job has not succeeded")
    return report


VERBS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "status": status,
    "launch": launch,
    "run": run,
    "rerun": rerun,
    "stop": stop,
    "logs": logs,
    "check": check,
    "assets": assets,
    "eval_report": eval_report,
    "plan": plan,
}


def main(argv: list[str]) -> int:
    verb, given = argv[0], argv[1] if len(argv) > 1 else "{}"
    args = json.loads(sys.stdin.read() if given == "-" else given)  # "-": too long for one argument, or secrets
    secrets.hold(args)  # into this process's environment, which every job it starts inherits
    if verb not in VERBS:
        emit({"error": f"unknown verb {verb!r}: expected one of {', '.join(VERBS)}"})
        return 2
    try:
        result = VERBS[verb](args)
    except HostError as exc:  # a refusal, or Slurm's own one-line error (remote.control_plane.slurm.SlurmError)
        if verb == "logs":  # its stdout is the log itself
            print(exc, file=sys.stderr)
        else:
            emit({"error": str(exc)})
        return 2
    if result is not None:
        emit(result)
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv[1:]))
