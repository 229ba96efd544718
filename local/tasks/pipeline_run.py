"""`inv run` and `inv demo`: the whole pipeline started under the host's runner (local/jobs/pipeline.py), and
followed to its end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from local.console import line
from local.exceptions import AerieError
from local.jobs import pipeline
from local.tasks import deployment, job_verbs
from local.views import live, status_data
from local.visible import visible
from remote.control_plane.states import DRAFT, JobState

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


def run(host: RemoteHost, console: Console, datasets: list[str] | None, route: str) -> dict[str, Any]:
    """Start the pipeline on the host for `route`, one remote command: under its runner, or (where the
    host's executor queues jobs itself) every job queued after the ones it needs."""
    names = job_verbs.mine(host, datasets)
    if names == [] or not host.inventory.datasets:
        return {}
    spec = pipeline.runner_spec(host.inventory, names, route)
    answer = host.call("run", spec=spec)
    if "queued" in answer:
        job_verbs.report(console, answer["queued"], "submitted")
        return {"submitted": [r for r in answer["queued"] if r["launched"]]}
    result = answer["runner"]
    if not result["launched"]:
        raise AerieError(f"the pipeline is {visible(result['reason']).replace('already running', 'already running on ' + host.name)}: "
                         "watch it with `inv status --watch`, or `inv stop -d pipeline` first")
    jobs = len(spec["config"]["stage"]["plan"])  # NOTE: counted as `inv status` counts them, the runner too
    console.print(line(f"pipeline started on {host.name} (runner {visible(str(result['where']))}): "
                        f"{jobs + 1} jobs: {jobs} and the runner; `inv status --watch` follows it"))
    return result


def outcome(state: dict[str, Any]) -> str:
    """Why the run did not succeed and the next step, in one line shown as it is (names come from the host)."""
    return visible(status_data.outcome(state))


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
    state = live.follow(lambda: host.call("status"), console, f"{host.name}:{host.root}")  # its last frame stays
    accept = accept_line(state, host.inventory)
    if accept:
        console.print(line(accept))
    return state


def accept_line(state: dict[str, Any], inventory: Inventory) -> str | None:
    """The draft's held-out accept length, whole, for the line under the demo's table (whose last column is cut)."""
    train = next((j for j in state["jobs"] if (j["dataset"], j["stage"]) == (DRAFT, "train")), None)
    metrics = (train or {}).get("metrics") or {}
    if train is None or train["state"] != JobState.SUCCEEDED.value or metrics.get("accept_length") is None:
        return None
    steps = inventory.stages.train.eval_steps
    return (f"draft: held-out accept length {metrics['accept_length']:.3f} of at most {steps + 1} "
            f"(1.0: the draft is useless), over {metrics.get('eval_positions', 0):,} positions of records it never "
            f"trained on; the draft is {pipeline.host_output(inventory, DRAFT, 'train')}/draft")
