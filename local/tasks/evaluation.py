"""`inv eval`: start the host's ``draft/eval`` job (remote/stages/eval.py), follow it, show its report.

The job is supervised like any other: closing the laptop does not stop it, and
running `inv eval` again while it runs follows the same job instead of starting
another. The report is read back from the host in one remote command.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Callable

from local.jobs import specs
from local.exceptions import AerieError
from local.jobs.pipeline import GPU_STAGES
from local.tasks import job_verbs
from local.views import eval_report
from local.visible import visible
from remote.vocabulary import layout
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE, JobState

if TYPE_CHECKING:  # rich loads only when `inv eval` runs, not with every task
    from rich.console import Console

    from local.host.verbs import RemoteHost

STAGE = "eval"
KEY = layout.job_key(DRAFT, STAGE)


def gpu_holders(state: dict[str, Any]) -> list[str]:
    """Jobs that hold (or will take) the GPU now: eval must not share it."""
    # NOTE: not `waiting`: jobs of a pipeline whose runner has ended stay `waiting` for ever.
    busy = (JobState.RUNNING.value, JobState.STALLED.value)
    return [layout.job_key(j["dataset"], j["stage"]) for j in state["jobs"]
            if j["state"] in busy and (j["stage"] in GPU_STAGES or (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE))]


def run(host: RemoteHost, console: Console, as_json: bool = False, interval: float = 2.0,
        force: bool = False) -> dict[str, Any]:
    """Start (or rejoin) the evaluation, wait for it, print and return its report. A report that is up to
    date (the same settings and drafts, none made since: `remote.control_plane.freshness`) is shown as it
    is, unless `force`; one out of date is measured again, the last report kept until the new one is written."""
    # NOTE: no markup: the host's messages may hold brackets that rich would read as tags.
    say = (lambda text: None) if as_json else (lambda text: console.print(visible(text), markup=False))
    holders = gpu_holders(host.call("status"))
    if holders:
        raise AerieError(f"the GPU is in use by {', '.join(holders)}: wait for it to end or `inv stop` it first")
    result = host.call("launch", specs=[specs.eval_spec(host.inventory)], force=force)[0]
    say_started(host, result, say)
    job = follow(lambda: host.call("status"), say, interval)
    if job["state"] != JobState.SUCCEEDED.value:
        raise AerieError(f"{KEY} {job['state']}: {job.get('message') or '(no message)'}; "
                         f"see `inv logs {DRAFT} --stage {STAGE}`")
    report = host.call("eval_report")
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        eval_report.show(report, console)
    return report


def say_started(host: RemoteHost, result: dict[str, Any], say: Callable[[str], None]) -> None:
    if result.get("out_of_date"):
        for line in job_verbs.out_of_date_lines({KEY: result["out_of_date"]}):
            say(f"{line}: measuring again (the last report stays until this one is written)")
    if result["launched"]:
        say(f"started {KEY} on {host.name} (pid {result['pid']}); it outlives this terminal: "
            f"`inv eval` again follows it, `inv logs {DRAFT} --stage {STAGE}` shows its log")
    elif result.get("up_to_date"):
        say(f"{KEY} is up to date: it measured these drafts with these settings after they were made; "
            f"its report follows (`inv eval --force` measures again)")
    else:
        say(f"{KEY} is {result['reason']}: following it")


def follow(fetch: Callable[[], dict[str, Any]], say: Callable[[str], None], interval: float) -> dict[str, Any]:
    """Poll the job until it ends, saying each new message once."""
    last = None
    while True:
        job = next((j for j in fetch()["jobs"] if layout.job_key(j["dataset"], j["stage"]) == KEY), None)
        if job is None:
            raise AerieError(f"{KEY} vanished from the host's jobs")
        if job.get("message") and job["message"] != last:
            last = job["message"]
            say(f"  {KEY}: {last}")
        if JobState(job["state"]).is_terminal():
            return job
        time.sleep(interval)
