"""aerie: run the EAGLE-3 data and training pipeline on a GPU host from this checkout.

`inv --list` shows the tasks; every task takes -i/--inventory NAME|PATH
(default: Invoke's config key `inventory`, `local` in invoke.yaml); tasks chained
on one command line run on one inventory. A short flag means one thing in every
task: -d --dataset, -s --stage, -f --follow, -i --inventory, -j --json. An
inventory with several `hosts` runs each task on all of them at once.
"""

from __future__ import annotations

from invoke import Collection, Context, Exit

from local.cli import (exit_without_collecting, goes_on, inventory_name, log_goes_on, number, on_interrupt, split,
                       task)
from local.console import console
from local.exceptions import AerieError
from local.host.fleet import fleet
from local.inventory.loader import load
from local.views.status_data import any_bad

exit_without_collecting()  # a command ends about 80 ms sooner (see there)

INVENTORY = "inventory NAME (inventories/NAME.yaml) or a path; default: config key `inventory`"
DATASET = "comma-separated dataset names; default: all of the inventory's"
WATCH = 2.0  # seconds between refreshes of `inv status --watch` given no number
LINES = 50  # lines of a log `inv logs` shows


@task(help={"inventory": INVENTORY, "json": "print a JSON list instead of the table"})
def validate(c: Context, inventory: str | None = None, json: bool = False) -> None:
    """Run prep over each dataset's local sample here; fail on any that would give zero records."""
    from local.validation import samples  # NOTE: each task imports its own body: `inv --list` none, `inv status` one

    samples.check(load(inventory_name(c, inventory)), console(), as_json=json)


@task(long_only=["dry_run", "revalidate"],
      help={"inventory": INVENTORY, "dry_run": "list what would be added, changed and removed; send nothing",
            "revalidate": "validate every dataset again, even those whose sample, prep code and settings are unchanged",
            "dataset": "refused: a deploy sends the whole checkout, for every dataset (then `inv launch -d ...`)"})
def deploy(c: Context, inventory: str | None = None, dry_run: bool = False, revalidate: bool = False,
           dataset: str | None = None) -> None:
    """Check locally, then sync remote/ to the host(s) as a new release, atomically."""
    from local.tasks import deployment
    from local.validation import samples

    if dataset is not None:  # -d is --dataset in every task; it was --dry-run here once
        raise AerieError(f"deploy sends the whole checkout, for every dataset: it takes no -d/--dataset (`inv deploy "
                         f"--dry-run` lists what it would send); `inv launch -d {dataset} --stage STAGE` starts a "
                         f"dataset's job")
    with fleet(inventory_name(c, inventory)) as hosts:
        with on_interrupt(deployment.NOTHING_SENT):
            samples.check(hosts.inventory, console(), cached=not revalidate)
        with on_interrupt(deployment.INTERRUPTED):
            hosts.raise_failures(hosts.each(lambda host, out: deployment.deploy(host, out, dry_run), console()))


@task(long_only=["force"],
      help={"stage": "the stage to run: prep, infer, extract, train or eval", "dataset": DATASET, "inventory": INVENTORY,
            "force": "run again a job that is up to date (its output is kept until the new run succeeds)"})
def launch(c: Context, stage: str | None = None, dataset: str | None = None, inventory: str | None = None,
           force: bool = False) -> None:
    """Start one detached job per dataset for a stage."""
    from local.inventory.stages import stage_names
    from local.tasks import job_verbs

    if not stage:  # not Invoke's "did not receive required positional arguments"
        raise AerieError(f"name the stage to launch: `inv launch --stage STAGE{f' -d {dataset}' if dataset else ''}`, "
                         f"STAGE one of {', '.join(stage_names())}")
    with fleet(inventory_name(c, inventory)) as hosts:
        hosts.inventory.stage(stage)  # an unknown stage or dataset is refused before anything runs
        hosts.inventory.select(split(dataset))
        hosts.raise_failures(hosts.each(
            lambda host, out: job_verbs.launch(host, out, stage, split(dataset), force), console()))


@task(optional=["watch"], help={"inventory": INVENTORY, "json": "print a JSON list instead of the table",
                                 "watch": f"refresh the table in place every N seconds (alone: {WATCH:g}) until Ctrl-C"})
def status(c: Context, inventory: str | None = None, json: bool = False, watch: str = "") -> None:
    """Every job's state, records, rate and last line, from one remote command per host."""
    from local.tasks import out_of_date, status_query

    every = number(watch, "--watch", float, bare=WATCH) if watch else 0.0
    watching = on_interrupt(goes_on(inventory, jobs=True) if every and not json else None)
    with fleet(inventory_name(c, inventory)) as hosts, watching:
        state = status_query.status(out_of_date.marked(hosts), console(), hosts.title, as_json=json, watch=every)
    if any_bad(state):
        raise Exit(code=1)


@task(long_only=["failed"],
      help={"failed": "what rerun relaunches, said in full: the jobs that failed, died, came out empty, stalled or "
                      "broke, and those blocked behind them (`inv rerun` alone does the same)",
            "dataset": DATASET, "stage": "comma-separated stages; default: all", "inventory": INVENTORY})
def rerun(c: Context, failed: bool = False, dataset: str | None = None, stage: str | None = None,
          inventory: str | None = None) -> None:
    """Relaunch the jobs that failed, died, came out empty, stalled or broke, and those blocked behind them, each
    with its spec rebuilt from the inventory as it is now, on the current release; succeeded jobs are left alone."""
    from local.tasks import job_verbs

    with fleet(inventory_name(c, inventory)) as hosts:
        names, stages = hosts.inventory.select(split(dataset)) if dataset else None, split(stage)
        for one in stages or []:
            hosts.inventory.stage(one)
        hosts.raise_failures(hosts.each(lambda host, out: job_verbs.rerun(host, out, names, stages), console()))


@task(optional=["n"],
      help={"dataset": "the dataset whose log to show", "stage": "its stage; default: the latest started",
            "n": f"how many lines of the end to show (default and alone: {LINES})",
            "follow": "keep printing until the job ends",
            "raw": "pass the log's bytes through as they are, escape sequences too (default: shown as ␛[...)",
            "inventory": INVENTORY})
def logs(c: Context, dataset: str, stage: str | None = None, n: str = str(LINES), follow: bool = False,
         raw: bool = False, inventory: str | None = None) -> None:
    """Print the end of a job's log, or follow it; control characters shown unless --raw."""
    from local.tasks import job_verbs

    lines = number(n, "-n", int, bare=LINES)
    following = on_interrupt(log_goes_on(dataset, inventory) if follow else None)
    with fleet(inventory_name(c, inventory)) as hosts, following:
        job_verbs.logs(hosts.host_of(dataset), dataset, stage, lines, follow, raw=raw)


@task(help={"dataset": "comma-separated dataset names (or --all)", "all": "stop every job",
            "stage": "comma-separated stages; default: all", "inventory": INVENTORY})
def stop(c: Context, dataset: str | None = None, all: bool = False, stage: str | None = None,
         inventory: str | None = None) -> None:
    """End running jobs (their whole process group) and record them as stopped."""
    from local.tasks import job_verbs

    if not (dataset or all):
        raise Exit("aerie: name the datasets to stop (inv stop -d A1,B5) or pass --all", code=2)
    with fleet(inventory_name(c, inventory)) as hosts:
        names, stages = split(dataset), split(stage)
        job_verbs.refuse_unknown(hosts.inventory, names)  # as launch and logs do, before anything is stopped
        hosts.raise_failures(hosts.each(lambda host, out: job_verbs.stop(host, out, names, stages), console()))


@task(long_only=["fingerprint"],
      help={"inventory": INVENTORY, "fingerprint": "trust only if the key's SHA256 fingerprint is this",
            "yes": "trust without asking (after checking the fingerprint yourself)"})
def trust(c: Context, inventory: str | None = None, fingerprint: str | None = None, yes: bool = False) -> None:
    """Show the host's key fingerprint and add it to known_hosts when you confirm."""
    from local.tasks import host_trust

    for view in load(inventory_name(c, inventory)).views().values():  # each host of the inventory
        host_trust.trust(view, console(), fingerprint, yes)


@task(long_only=["force"], help={"dataset": DATASET, "inventory": INVENTORY, "follow": "show the table (without a terminal: a line per change) until the pipeline ends; exit 1 unless it succeeded",
            "force": "run every job again, those up to date too (each output is kept until its new run succeeds)"})
def run(c: Context, dataset: str | None = None, inventory: str | None = None, follow: bool = False,
        force: bool = False) -> None:
    """Start the whole pipeline (prep, infer, tokenize, extract, train) under a runner on each host."""
    from local.tasks import job_verbs, pipeline_run, planning
    from local.views import live

    with fleet(inventory_name(c, inventory)) as hosts:
        names = hosts.inventory.select(split(dataset)) if dataset else None
        routes = hosts.each(lambda host, out: planning.resolve(host, job_verbs.mine(host, names), out), console())  # a route that fits, or stop
        # NOTE: each host's pipeline is its own: a host down or refused is named at the end, the others run.
        started = hosts.each(lambda host, out: pipeline_run.run(host, out, names, pipeline_run.route_of(routes, hosts.name_of(host)), force),
                             console())
        with on_interrupt(goes_on(inventory)):  # NOTE: the end of the run is the block's own: only Ctrl-C here
            ended = live.follow(hosts.status, console(), hosts.title) if follow and pipeline_run.any_started(started) else None
    hosts.raise_failures(started)
    if ended is not None and pipeline_run.outcome(ended):  # failures, blocked or stopped jobs, and the next step
        raise Exit(f"aerie: {pipeline_run.outcome(ended)}", code=1)


@task(help={"inventory": INVENTORY, "json": "print the figures as JSON"})
def plan(c: Context, inventory: str | None = None, json: bool = False) -> None:
    """Tokens per dataset, the hidden states' size, the host's disk and the route that fits."""
    with fleet(inventory_name(c, inventory)) as hosts:
        from local.tasks import planning

        results = hosts.each(lambda host, out: planning.show(host, out, as_json=json), console())
    hosts.raise_failures(results)
    if any(result.get("refusals") for result in results.values()):  # what `inv run` would refuse to start
        raise Exit(code=1)


@task(long_only=["install", "verify"],
      help={"inventory": INVENTORY,
            "install": "first pip install what the stages import (pyproject's `host` extra) into host.python",
            "verify": "also read every dataset's stored states and check each file's size and checksum"})
def check(c: Context, inventory: str | None = None, install: bool = False, verify: bool = False) -> None:
    """Check the host before a run: Python and packages, GPUs, disk, the target, layer ids, the inference server."""
    from local.tasks import host_checks

    with fleet(inventory_name(c, inventory)) as hosts:
        results = hosts.each(lambda host, out: host_checks.check(host, out, install, verify), console())
    hosts.raise_failures(results)
    if any(r["status"] == "fail" for checks in results.values() for r in checks):
        raise Exit(code=1)


@task(name="eval", long_only=["force"], help={"inventory": INVENTORY, "json": "print the report as JSON (baseline, drafts by name, ranking, best, serve, warnings)",
                         "force": "measure again even when the last report is up to date (its report is kept until the new one is written)"})
def evaluate(c: Context, inventory: str | None = None, json: bool = False, force: bool = False) -> None:
    """Serve the target with SGLang without and with the draft per grid setting: accept length, speed-up, best flags."""
    from local.tasks import evaluation

    with fleet(inventory_name(c, inventory)) as hosts:
        evaluation.run(hosts.single, console(), as_json=json, force=force)


@task(inventory="local")
def demo(c: Context) -> None:
    """Run the whole pipeline on the embedded `local` inventory with a tiny model built offline."""
    from local.tasks import pipeline_run

    with fleet("local") as hosts:
        state = pipeline_run.demo(hosts.single, console())
    if any_bad(state):
        raise Exit("aerie: the demo did not finish cleanly; see the table above and `inv logs`", code=1)


@task(long_only=["against"],
      help={"only": "comma-separated suites: control, loop, view, prep, infer, extract, slurm, chunked, train; default: all",
            "json": "print the figures as JSON",
            "against": "a commit (e.g. ff08539): time control's and loop's commands in its checkout too, in turn "
                       "with this one's (the ratio this/REF); default suites then control,loop"})
def bench(c: Context, only: str | None = None, json: bool = False, against: str | None = None) -> None:
    """Measure speed as ratios to baselines run alongside (see docs/benchmarks.md)."""
    import benchmarks.run
    from local.views import tables

    tables.print_figures(benchmarks.run.run(split(only), against), console(), as_json=json)


ns = Collection(validate, deploy, launch, status, rerun, logs, stop, trust, run, check, evaluate, demo, bench, plan)
ns.configure({"inventory": "local"})
