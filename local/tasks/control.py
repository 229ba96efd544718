"""What the control-plane tasks do; `tasks.py` only parses flags and calls these."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from local.jobs import pipeline
from local.jobs import specs
from local.views import status_data
from local.cli import RICH_SYNTAX
from local.exceptions import AerieError
from local.host.verbs import RemoteHost
from local.visible import VisibleStream, visible
from remote.control_plane.states import BAD, DRAFT, RUNNER, RUNNER_STAGE, JobState

if TYPE_CHECKING:  # rich is imported where a table or a live view is drawn: not for a deploy that sends nothing
    from rich.console import Console

    from local.inventory.schema import Inventory


CHECK_STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red"}
LISTED = 12  # paths a deploy lists before it summarises (a dry run lists all)


def split(names: str | None) -> list[str] | None:
    """`A1,B5` (or repeated flags joined by Invoke) as a list; None for all."""
    return [n for n in names.replace(" ", ",").split(",") if n] if names else None


def number(text: str, flag: str, kind: type[int] | type[float]) -> Any:
    """A flag's number, parsed here so that a typo is one line, not Invoke's traceback."""
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if value < 0:
        raise AerieError(f"{flag} takes a {'whole ' if kind is int else ''}number of at least 0, not {text!r}")
    return value


def mine(host: RemoteHost, datasets: list[str] | None) -> list[str] | None:
    """Of the datasets named for the whole inventory, those this host runs (None: all of its own)."""
    return None if datasets is None else [d for d in datasets if d in host.inventory.datasets]


def deploy(host: RemoteHost, console: Console, dry_run: bool = False) -> str | None:
    """Send what changed to one host (`inv deploy` has validated the inventory's data first)."""
    from local.host import releases  # here, as validation below: `inv status` and `inv launch` need neither

    plan = releases.plan(host, releases.manifest(ship=host.inventory.deploy.ship))
    releases.check_sources(paths=plan.send)
    where = f"{host.name}:{host.root}"
    if plan.is_noop:
        console.print(_line(f"Nothing to deploy: {where} runs release {visible(str(plan.base))}, identical to this checkout."))
        return plan.base
    listed = [(label, path, style) for label, paths, style in
              (("add", plan.added, "green"), ("change", plan.changed, "yellow"), ("remove", plan.removed, "red"))
              for path in paths]
    shown = listed if dry_run else listed[:LISTED]
    for label, path, style in shown:  # a removed path is the host's manifest's: shown, never read as markup
        console.print(_line((f"  {label:<6}", style), f" {visible(path)}"))
    if len(shown) < len(listed):
        console.print(f"  ... and {len(listed) - len(shown)} more (`inv deploy --dry-run` lists all)")
    summary = f"{len(plan.added)} added, {len(plan.changed)} changed, {len(plan.removed)} removed"
    if dry_run:
        console.print(_line(f"Dry run: would deploy {summary} to {where} (now {visible(str(plan.base or 'nothing'))}); "
                            f"it sends {_shipped(host.inventory.deploy.ship)}."))
        return None
    answer = releases.push(host, plan)
    release, pruned = answer["id"], answer.get("pruned", [])
    live = releases.current_release(host)  # read after the switch: a deploy from elsewhere may have followed it
    if live.get("files") != plan.files:
        raise AerieError(f"{where}: another deploy replaced release {release} before this one ended; the host runs "
                         f"{visible(str(live.get('id')))}, not this checkout: `inv deploy` again to send it")
    live_as = "it is live" if live.get("id") == release else f"the host runs {visible(str(live.get('id')))}, the same files"
    kept = (f"; removed {len(pruned)} older release{'s' * (len(pruned) != 1)} (deploy.keep: "
            f"{host.inventory.deploy.keep})") if pruned else ""
    console.print(_line(f"Deployed release {release} to {where}: {summary}; {live_as}{kept}."))
    return release


def _shipped(ship: list[str]) -> str:
    from local.host.releases import SHIPPED

    return ", ".join(f"{top}/" for top in SHIPPED) + (f" and deploy.ship: {visible(', '.join(ship))}" if ship else
                                                      " (add your own files with deploy.ship in the inventory)")


def launch(host: RemoteHost, console: Console, stage: str, datasets: list[str] | None,
           force: bool = False) -> list[dict[str, Any]]:
    """One job per dataset; a succeeded one only with `force` (its output stays until the new run succeeds)."""
    names = mine(host, datasets)
    if names == [] or not host.inventory.datasets:
        return []
    results = host.call("launch", specs=specs.specs(host.inventory, stage, names), force=force)
    report(console, [_with_force_hint(r) for r in results], "launched")
    return results


def _with_force_hint(result: dict[str, Any]) -> dict[str, Any]:
    """A job kept because it succeeded names the flag that runs it again."""
    if not result.get("succeeded"):
        return result
    return {**result, "reason": f"{result['reason']}; `inv launch --stage {result['stage']} "
                                f"--dataset {result['dataset']} --force` runs it again"}


def rerun(host: RemoteHost, console: Console, datasets: list[str] | None, stages: list[str] | None) -> list[dict[str, Any]]:
    inventory = host.inventory
    names = mine(host, datasets)
    if names == []:
        return []
    request = {"specs": specs.all_specs(inventory), "states": sorted(s.value for s in BAD), "datasets": names,
               "stages": stages}
    results = host.call("rerun", **request, rebuild=True)
    if isinstance(results, dict):  # the host asks for the last `inv run`'s pipeline, rebuilt: then it reruns
        results = host.call("rerun", **request, **rebuilt_pipeline(host, console, results["rebuild"]))
    relaunched = [r for r in results if r["launched"]]
    report(console, relaunched, "relaunched")
    report_changes(console, relaunched)
    _note_unserved(host, console, relaunched)
    if not relaunched:
        console.print(f"Nothing to rerun: no job is {', '.join(sorted(s.value for s in BAD))}.")
    return relaunched


def rebuilt_pipeline(host: RemoteHost, console: Console, last: dict[str, Any]) -> dict[str, Any]:
    """The last `inv run`'s runner rebuilt from the inventory as it is now, from its datasets and route
    (`last`, as the host recorded them), so that a rerun of its jobs runs with what was fixed."""
    inventory = host.inventory
    gone = [name for name in last["datasets"] if name not in inventory.datasets]
    if gone:  # NOTE: not refused: the rerun may be of jobs outside that pipeline
        console.print(_line((f"note: the last `inv run` on {host.name} had {', '.join(map(visible, gone))}, no longer "
                             f"in {inventory.path}: its jobs rerun with the specs of their last run; `inv run` starts "
                             f"afresh over the datasets the inventory has", "yellow")))
        return {}
    route = inventory.stages.extract.route
    if route not in ("auto", last["route"]):
        console.print(_line((f"note: stages.extract.route is now {route}; this rerun keeps the last run's route, "
                             f"{visible(last['route'])} (`inv run` takes the new one)", "yellow")))
    return {"runner": pipeline.runner_spec(inventory, last["datasets"], last["route"])}


def report_changes(console: Console, relaunched: list[dict[str, Any]]) -> None:
    """What each rerun job runs with that its last run did not: `A1/extract: stages.extract.layers [2] -> [1]`."""
    for result in relaunched:
        if result.get("reruns"):
            console.print(_line(f"  it runs again: {visible(', '.join(result['reruns']))}"))
    changes = [(key, change) for r in relaunched for key, found in (r.get("changes") or {}).items() for change in found]
    for key, (path, before, after) in changes:
        dataset, _, stage = key.partition("/")
        console.print(_line(f"  {visible(key)}: {visible(specs.inventory_key(dataset, stage, path))} "
                            f"{_setting(before)} -> {_setting(after)}"))
    if relaunched and not changes:
        console.print("No setting changed since these jobs last ran.")


def _note_unserved(host: RemoteHost, console: Console, relaunched: list[dict[str, Any]]) -> None:
    """An infer job relaunched on its own (started by `inv launch`, not by `inv run`) gets no managed
    server: only the pipeline's runner starts `stages.infer.server_command` (on Slurm, the job itself)."""
    infer = host.inventory.stages.infer
    alone = [f"{r['dataset']}/infer" for r in relaunched if r["stage"] == "infer"]
    if alone and infer.server_command and host.inventory.executor == "process":
        console.print(_line((f"note: {visible(', '.join(alone))} run on their own, not under `inv run`'s runner, which "
                             f"alone starts stages.infer.server_command: start the server, or `inv run` to have it "
                             f"started", "yellow")))


def _setting(value: Any) -> str:
    text = "(unset)" if value is None else json.dumps(value, ensure_ascii=False)
    return visible(text if len(text) <= 80 else text[:79] + "…")


def run(host: RemoteHost, console: Console, datasets: list[str] | None, route: str) -> dict[str, Any]:
    """Start the pipeline on the host for `route`, one remote command: under its runner, or (where the
    host's executor queues jobs itself) every job queued after the ones it needs."""
    names = mine(host, datasets)
    if names == [] or not host.inventory.datasets:
        return {}
    spec = pipeline.runner_spec(host.inventory, names, route)
    answer = host.call("run", spec=spec)
    if "queued" in answer:
        report(console, answer["queued"], "submitted")
        return {"submitted": [r for r in answer["queued"] if r["launched"]]}
    result = answer["runner"]
    if not result["launched"]:
        raise AerieError(f"the pipeline is {visible(result['reason']).replace('already running', 'already running on ' + host.name)}: "
                         "watch it with `inv status --watch`, or `inv stop -d pipeline` first")
    jobs = len(spec["config"]["stage"]["plan"])  # NOTE: counted as `inv status` counts them, the runner too
    console.print(_line(f"pipeline started on {host.name} (runner {visible(str(result['where']))}): "
                        f"{jobs + 1} jobs: {jobs} and the runner; `inv status --watch` follows it"))
    return result


def refresh(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float,
            until: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """The live table (`--watch`, `--follow`, the demo): fetched and redrawn every `interval` seconds
    until `until(state)` (None: never, on a terminal) or Ctrl-C; the last state, whose frame stays on
    the screen. Without a terminal, a line per change of state instead, until the run ends."""
    from rich.live import Live

    from local.views import status_table

    if not console.is_terminal:
        return lines_until_ended(fetch, console, title, interval, until or _all_ended)
    until = until or (lambda state: False)
    state = fetch()
    with Live(status_table.render(state, title=title, fit=True), console=console, auto_refresh=False) as live:
        try:
            while not until(state):
                time.sleep(interval)
                state = fetch()
                live.update(status_table.render(state, title=title, fit=True), refresh=True)
        except KeyboardInterrupt:
            pass
    if not console.is_terminal:  # NOTE: rich ends the last frame with a line break only on a terminal
        console.line()
    return state


def follow(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float = 2.0) -> dict[str, Any]:
    """Refresh the table until the pipeline has ended (its runners; on Slurm, its jobs); the final status."""
    return refresh(fetch, console, title, interval, until=_pipeline_ended)


def outcome(state: dict[str, Any]) -> str:
    """Why the run did not succeed and the next step, in one line shown as it is (names come from the host)."""
    return visible(status_data.outcome(state))


def lines_until_ended(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float,
                      until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The watch without a terminal (local/views/state_lines.py), then the whole table once, as `inv status` prints it."""
    from local.views import state_lines
    from local.views import status_table

    state = state_lines.follow(fetch, console, title, interval, until)
    console.print(status_table.render(state, title=title))
    return state


def _pipeline_ended(state: dict[str, Any]) -> bool:
    runners = [j for j in state["jobs"] if (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE)]
    return _all_ended({**state, "jobs": runners or state["jobs"]}) or bool(state.get("unreachable"))


def _all_ended(state: dict[str, Any]) -> bool:
    """Nothing left to watch: every job has ended (a blocked one too: only `inv rerun --failed` moves it)."""
    return all(JobState(job["state"]).is_terminal() for job in state["jobs"])


def check(host: RemoteHost, console: Console, install: bool = False) -> list[dict[str, Any]]:
    """The host's checks, run from this checkout's code sent along (`call_sent`): nothing needs to be deployed.
    `install`: first install pyproject's `host` extra into the host's Python."""
    from local.tasks import planning

    inventory = host.inventory
    if install:
        from local.host import packages

        wanted = packages.requirements()
        console.print(_line(f"installing into {visible(host.python)} on {host.name}: {' '.join(wanted)}"))
        out = VisibleStream(sys.stdout.buffer)  # pip's words, as the host's: shown, never obeyed
        try:
            host.pip_install(wanted, out)
        finally:
            out.close()
    results = host.call_sent("check", layers=inventory.stages.extract.layers, dtype=inventory.stages.extract.dtype,
                             datasets=list(inventory.datasets),
                             model=specs.on_host(inventory.target.model_dump(), host.root)["model"],
                             server_url=inventory.stages.infer.server_url,
                             readiness=planning.readiness(inventory, host.root),
                             extract_engine=inventory.stages.extract.engine)
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"checks on {host.name}", title_justify="left")
    for header in ("check", "", "detail"):
        table.add_column(header)
    for result in results:
        table.add_row(Text(visible(result["name"])), Text(result["status"], CHECK_STYLES[result["status"]]),
                      Text(visible(result["detail"])))
    console.print(table)
    return results


def demo(host: RemoteHost, console: Console) -> dict[str, Any]:
    """The whole pipeline on the embedded `local` inventory, with a tiny target built offline."""
    from local.validation import samples

    # NOTE: the target first, from the sources sent (nothing need be deployed): the validation before the
    # deploy counts tokens with its tokenizer, which is not there until it is built.
    built = host.call_sent("assets")
    console.print(_line(f"{'built' if built['built'] else 'reusing'} the tiny target in {visible(built['path'])}"))
    samples.check(host.inventory, console)
    deploy(host, console)
    run(host, console, None, host.inventory.stages.extract.route)  # auto, unresolved: offline
    state = follow(lambda: host.call("status"), console, f"{host.name}:{host.root}")  # its last frame stays
    line = accept_line(state, host.inventory)
    if line:
        console.print(_line(line))
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


def report(console: Console, results: list[dict[str, Any]], verb: str) -> None:
    for result in results:
        job = visible(f"{result['dataset']}/{result['stage']}")
        if result["launched"]:
            console.print(_line(f"{verb} {job} ({visible(str(result['where']))})"))
        else:
            console.print(_line((f"skipped {job}: {visible(str(result['reason']))}", "yellow")))


def _line(*parts: str | tuple[str, str]) -> Any:
    """A line of text and (text, style) parts whose text is printed as it is, never read as markup;
    plain text that rich would not change stays a `str`, which the console writes without importing
    rich (local/cli.py: a deploy that sends nothing never imports it)."""
    if all(isinstance(p, str) and not RICH_SYNTAX.search(p) for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    from rich.text import Text

    return Text.assemble(*parts)


def status(fetch: Callable[[], dict[str, Any]], console: Console, title: str, as_json: bool = False,
           watch: float = 0) -> dict[str, Any]:
    """One status (from `fetch`: one remote command per host), as a table, JSON, or refreshed in place."""
    if watch and not as_json:
        return refresh(fetch, console, title, watch)
    if as_json:
        state = fetch()
        print(json.dumps(status_data.as_json(state), indent=2))
        return state
    state, status_table = while_importing(fetch, "local.views.status_table")  # rich: for the table only
    console.print(status_table.render(state, title=title))
    return state


def while_importing(fetch: Callable[[], Any], module: str) -> tuple[Any, Any]:
    """`fetch()` (a remote command: mostly waiting) in a thread while `module` is imported here, so that
    the host answers while the laptop loads the code that shows the answer."""
    import importlib
    import threading

    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append((fetch(), None))
        except BaseException as exc:  # noqa: BLE001 — re-raised below, in the caller's thread
            answer.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    loaded = importlib.import_module(module)
    worker.join()
    value, error = answer[0]
    if error is not None:
        raise error
    return value, loaded


def logs(host: RemoteHost, dataset: str, stage: str | None, lines: int, follow: bool, raw: bool = False) -> None:
    """The log's end on stdout: its control characters shown (`␛[2J`), as `less` does, or as they are (`raw`)."""
    if dataset not in (DRAFT, RUNNER):  # the jobs of `inv run` that no dataset names
        host.inventory.select([dataset])
    out = sys.stdout.buffer if raw else VisibleStream(sys.stdout.buffer)
    try:
        host.stream("logs", out, dataset=dataset, stage=stage, lines=lines, follow=follow)  # type: ignore[arg-type]
    finally:
        if isinstance(out, VisibleStream):
            out.close()


def refuse_unknown(inventory: Inventory, names: list[str] | None) -> None:
    """A dataset the inventory does not name is refused, as launch and logs refuse it (the pipeline's
    own jobs, `pipeline` and `draft`, are names too)."""
    unknown = [n for n in names or [] if n not in (DRAFT, RUNNER)]
    if unknown:
        inventory.select(unknown)


def stop(host: RemoteHost, console: Console, datasets: list[str] | None, stages: list[str] | None) -> None:
    names = mine(host, datasets) if datasets and not set(datasets) & {DRAFT, RUNNER} else datasets
    results = host.call("stop", datasets=names, stages=stages) if names != [] else []
    stopped = [r for r in results if r["stopped"]]
    for result in results:
        job = visible(f"{result['dataset']}/{result['stage']}")
        if result["stopped"]:
            console.print(_line(f"stopped {job}"))
        elif result.get("reason"):  # a broken job: its processes cannot be known from its files
            console.print(_line((f"not stopped {job}: {visible(str(result['reason']))}", "yellow")))
    if not stopped:
        console.print("Nothing to stop: no matching job is running.")


def trust(inventory: Inventory, console: Console, expect: str | None, yes: bool) -> None:
    if inventory.host is None or not inventory.host.address:
        raise AerieError(f"{inventory.path}: trust works on one host reached over SSH (set host.address)")
    from local.transport import host_keys  # here: paramiko, which no other task imports before it connects
    from local.transport.paramiko_ssh import SshTransport

    transport = SshTransport(inventory.host)
    name, key = host_keys.scan(transport)
    console.print(f"{name} presents {key.get_name()} {key.fingerprint}")
    if host_keys.is_known(transport.known_hosts, name, key):
        console.print(f"Already trusted in {transport.known_hosts}.")
        return
    old = host_keys.changed(transport.known_hosts, name, key)
    if old is not None:
        console.print(f"[bold red]{name}'s key CHANGED[/]: {transport.known_hosts} holds {old.fingerprint}. "
                      "Trust the new one only if the host was rebuilt.")
    if expect and expect != key.fingerprint:
        raise AerieError(f"{name}: fingerprint is {key.fingerprint}, not the expected {expect}: not trusted")
    question = "Replace the old key with this one?" if old is not None else f"Trust this key for {name}?"
    if not (expect or yes or _confirm(console, f"{question} Compare it with the host's own `ssh-keygen -lf`.")):
        raise AerieError(f"{name}: not trusted; nothing was written")
    replaced = host_keys.add(transport.known_hosts, name, key)
    console.print(f"{'Replaced the changed key of' if replaced else 'Added'} {name} in {transport.known_hosts}.")


def _confirm(console: Console, question: str) -> bool:
    if not sys.stdin.isatty():
        raise AerieError("no terminal to confirm on: pass --fingerprint SHA256:... (from the host's admin) or --yes")
    return console.input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def print_figures(figures: dict[str, Any], console: Console, as_json: bool) -> None:
    """Benchmark figures: JSON, or one flat table of suite, figure, value."""
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    from rich.table import Table

    table = Table(title="aerie benchmarks", title_justify="left")
    for header, justify in (("suite", "left"), ("figure", "left"), ("value", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for suite, values in figures.items():
        for name, value in _flatten(values):
            table.add_row(suite, name, f"{value:,.3f}" if isinstance(value, float) else str(value))
    console.print(table)


def _flatten(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
