"""`inv run` and `inv demo`: the whole pipeline started under the host's runner (local/jobs/pipeline.py), and
followed to its end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from local.cli import goes_on, on_interrupt
from local.console import line
from local.exceptions import AerieError
from local.jobs import pipeline
from local.tasks import deployment, job_verbs
from local.views import live, status_data
from local.visible import visible
from remote.vocabulary import hints
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE, JobState

if TYPE_CHECKING:
    from rich.console import Console

    from local.host.verbs import RemoteHost
    from local.inventory.values import Inventory


def route_of(routes: dict[str, Any], name: str) -> str:
    """The route planned for host `name`, or its planning's error raised again: with `hosts:`, a host that is
    down or refused starts nothing and is named with the others' results (`Fleet.raise_failures`)."""
    route = routes[name]
    if isinstance(route, AerieError):
        raise AerieError(f"not started: {route}")
    return route


def any_started(results: dict[str, Any]) -> bool:
    """Whether some host's pipeline started (the rest are errors), so that there is a run to follow."""
    return any(not isinstance(result, AerieError) for result in results.values())


def run(host: RemoteHost, console: Console, datasets: list[str] | None, route: str, force: bool = False) -> dict[str, Any]:
    """Start the pipeline on the host for `route`, one remote command: under its runner, or (where the
    host's executor queues jobs itself) every job queued after the ones it needs. The host leaves out
    the jobs that are up to date (all run with `force`): {} when that is every one."""
    names = job_verbs.mine(host, datasets)
    if names == [] or not host.inventory.datasets:
        return {}
    spec = pipeline.runner_spec(host.inventory, names, route)
    answer = host.call("run", spec=spec, force=force)
    if not say_up_to_date(host, console, answer):
        return {}
    if "queued" in answer:
        job_verbs.report(console, answer["queued"], "submitted")
        return {"submitted": [r for r in answer["queued"] if r["launched"]]}
    result = answer["runner"]
    if not result["launched"]:
        raise AerieError(f"the pipeline is {visible(result['reason']).replace('already running', 'already running on ' + host.name)}: "
                         f"watch it with {hints.inv('status', watch=True)}, or {hints.inv('stop', dataset=RUNNER)} first")
    jobs = len(spec["config"]["stage"]["plan"]) - len(answer.get("up_to_date") or [])  # NOTE: counted as `inv status` counts them, the runner too
    console.print(line(f"pipeline started on {host.name} (runner {visible(str(result['where']))}): "
                        f"{jobs + 1} jobs: {jobs} and the runner; {hints.inv('status', watch=True)} follows it"))
    return result


def say_up_to_date(host: RemoteHost, console: Console, answer: dict[str, Any]) -> bool:
    """One line for the jobs left out as up to date, one per job run again and why; False when nothing runs."""
    current = answer.get("up_to_date") or []
    if current and answer.get("runner") is None and "queued" not in answer:
        console.print(line(f"the pipeline on {host.name} is up to date: its {len(current)} jobs succeeded with these "
                           f"settings, after what each reads; nothing to run (`inv run --force` runs every job again)"))
        return False
    if current:
        shown = ", ".join(current[:8]) + (f" and {len(current) - 8} more" if len(current) > 8 else "")
        console.print(line(f"up to date, not run again: {visible(shown)} (`inv run --force` runs every job again)"))
    for said in job_verbs.out_of_date_lines(answer.get("out_of_date") or {}):
        console.print(line(f"  {said}"))
    return True


def outcome(state: dict[str, Any]) -> str:
    """Why the run did not succeed and the next step, in one line shown as it is (names come from the host);
    "" when it did."""
    return visible(status_data.outcome(state) or stopped(state))


def stopped(state: dict[str, Any]) -> str:
    """What a stopped run stopped, and how it goes on ("" unless its runner ended `stopped`)."""
    runner = [j for j in state["jobs"] if (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE)]
    if not runner or runner[0]["state"] != JobState.STOPPED.value:
        return ""
    halted = [j for j in status_data.in_pipeline_order(state["jobs"])
              if j["state"] == JobState.STOPPED.value and (j["dataset"], j["stage"]) != (RUNNER, RUNNER_STAGE)]
    ran = [status_data.job_name(j) for j in halted if j.get("started_at")]
    never = [status_data.job_name(j) for j in halted if not j.get("started_at")]
    parts = ([f"{', '.join(ran)} stopped"] if ran else []) + ([f"{len(never)} not started: {', '.join(never)}"] if never else [])
    return (f"the run was stopped: {'; '.join(parts) or 'its runner'}. `inv rerun --failed` continues it "
            "(what succeeded is kept); `inv run` starts it afresh")


def demo(host: RemoteHost, console: Console) -> dict[str, Any]:
    """The whole pipeline on the embedded `local` inventory, with a tiny target built offline."""
    from local.validation import samples

    # NOTE: the target first, from the sources sent (nothing need be deployed): the validation before the
    # deploy counts tokens with its tokenizer, which is not there until it is built.
    built = host.call_sent("assets")
    console.print(line(f"{'built' if built['built'] else 'reusing'} the tiny target in {visible(built['path'])}"))
    samples.check(host.inventory, console)
    deployment.deploy(host, console)
    run(host, console, None, host.inventory.stages.extract.route)  # auto, unresolved: offline
    with on_interrupt(goes_on("local")):
        state = live.follow(lambda: host.call("status"), console, f"{host.name}:{host.root}")  # its last frame stays
    accept = accept_line(state, host.inventory)
    if accept:
        console.print(line(accept))
    return state


def accept_line(state: dict[str, Any], inventory: Inventory) -> str | None:
    """Where the draft is, under the demo's table, whose own last line gives its accept length whole
    (`status_data.accept_length`); None unless training succeeded with a measured draft."""
    train = next((j for j in state["jobs"] if (j["dataset"], j["stage"]) == (DRAFT, "train")), None)
    if train is None or train["state"] != JobState.SUCCEEDED.value or status_data.accept_length(train) is None:
        return None
    return f"the draft: {pipeline.host_output(inventory, DRAFT, 'train')}/draft"
