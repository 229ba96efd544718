"""`inv eval`: start the host's ``draft/eval`` job (remote/stages/eval.py), follow it, show its report.

The job is supervised like any other: closing the laptop does not stop it, and
running `inv eval` again while it runs follows the same job instead of starting
another. The report is read back from the host in one remote command.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Callable

from local.inventory.fields import dump
from local.jobs import specs
from local.exceptions import AerieError
from local.jobs.pipeline import GPU_STAGES
from local.visible import visible, visible_all
from remote.control_plane import layout
from remote.control_plane.states import DRAFT, RUNNER, RUNNER_STAGE, JobState

if TYPE_CHECKING:  # the schema and rich load only when `inv eval` runs, not with every task
    from rich.console import Console

    from local.host.verbs import RemoteHost
    from local.inventory.values import Inventory

STAGE = "eval"
KEY = layout.job_key(DRAFT, STAGE)
#: The name of train's draft when ``stages.eval.drafts`` is unset.
DEFAULT_DRAFT = "draft"
#: The report's columns of words, aligned left (the numbers' are aligned right).
WORDS = ("draft", "best setting")


def spec(inventory: Inventory) -> dict[str, Any]:
    """The job's spec, every default resolved here (the host's settings have no defaults of their own)."""
    settings = inventory.stages.eval
    root = inventory.host.root
    model = settings.model or inventory.target.model
    if not model:
        raise AerieError(f"{inventory.path}: inv eval needs the target: set target.model or stages.eval.model")
    stage = dump(settings, exclude={"command", "stall_after"})
    # The offline route's draft: the weights (`draft`) in draft/train's output on the host.
    trained = layout.output_dir(PurePosixPath(root), DRAFT, "train") / "draft"
    stage.update(model=model, drafts=settings.drafts or {DEFAULT_DRAFT: str(trained)})
    return {
        "dataset": DRAFT, "stage": STAGE, "command": settings.command, "source": "", "kind": "native",
        "stall_after": settings.stall_after, "log_limit": settings.log_limit,
        "config": {"stage": specs.on_host(stage, root),
                   "inventory": {"target": specs.on_host(dump(inventory.target), root)}},
    }


def gpu_holders(state: dict[str, Any]) -> list[str]:
    """Jobs that hold (or will take) the GPU now: eval must not share it."""
    # NOTE: not `waiting`: jobs of a pipeline whose runner has ended stay `waiting` for ever.
    busy = (JobState.RUNNING.value, JobState.STALLED.value)
    return [f"{j['dataset']}/{j['stage']}" for j in state["jobs"]
            if j["state"] in busy and (j["stage"] in GPU_STAGES or (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE))]


def run(host: RemoteHost, console: Console, as_json: bool = False, interval: float = 2.0) -> dict[str, Any]:
    """Start (or rejoin) the evaluation, wait for it, print and return its report."""
    # NOTE: no markup: the host's messages may hold brackets that rich would read as tags.
    say = (lambda text: None) if as_json else (lambda text: console.print(visible(text), markup=False))
    holders = gpu_holders(host.call("status"))
    if holders:
        raise AerieError(f"the GPU is in use by {', '.join(holders)}: wait for it to end or `inv stop` it first")
    result = host.call("launch", specs=[spec(host.inventory)])[0]
    if result["launched"]:
        say(f"started {KEY} on {host.name} (pid {result['pid']}); it outlives this terminal: "
            f"`inv eval` again follows it, `inv logs {DRAFT} --stage {STAGE}` shows its log")
    else:
        say(f"{KEY} is {result['reason']}: following it")
    job = follow(lambda: host.call("status"), say, interval)
    if job["state"] != JobState.SUCCEEDED.value:
        raise AerieError(f"{KEY} {job['state']}: {job.get('message') or '(no message)'}; "
                         f"see `inv logs {DRAFT} --stage {STAGE}`")
    report = host.call("eval_report")
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        show(report, console)
    return report


def follow(fetch: Callable[[], dict[str, Any]], say: Callable[[str], None], interval: float) -> dict[str, Any]:
    """Poll the job until it ends, saying each new message once."""
    last = None
    while True:
        job = next((j for j in fetch()["jobs"] if f"{j['dataset']}/{j['stage']}" == KEY), None)
        if job is None:
            raise AerieError(f"{KEY} vanished from the host's jobs")
        if job.get("message") and job["message"] != last:
            last = job["message"]
            say(f"  {KEY}: {last}")
        if JobState(job["state"]).is_terminal():
            return job
        time.sleep(interval)


def show(report: dict[str, Any], console: Console) -> None:
    """Every draft's settings against the baseline, the drafts ranked with each one's flags, and which to serve."""
    from rich.text import Text

    report = visible_all(report)  # the host's words: shown, never obeyed (local/visible.py)
    console.print(settings_table(report))
    console.print(ranking_table(report))
    for warning in report["warnings"]:
        console.print(Text.assemble(("WARNING: ", "bold red"), warning))
    for rank, name in enumerate(report["ranking"], 1):
        console.print(f"{rank}. {name}: launch with\n  {shlex.join(report['drafts'][name]['best']['flags'])}",
                      markup=False)
    best, serve = report.get("best"), report.get("serve")
    if serve:
        console.print(Text(f"serve {serve}: speed-up {best['speedup']:.2f} over no draft "
                           f"({best['tokens_per_s']:.1f} against {report['baseline']['tokens_per_s']:.1f} tok/s)",
                           style="bold green"))
    elif best:
        console.print(Text(f"serve no draft: none beats the baseline ({report['baseline']['tokens_per_s']:.1f} tok/s); "
                           f"the fastest, {best['draft']}, gives {best['tokens_per_s']:.1f} (speed-up "
                           f"{best['speedup'] or 0:.2f})", style="bold red"))


def ordered(report: dict[str, Any]) -> list[str]:
    """The drafts, fastest first (those with no measured setting last)."""
    return [*report["ranking"], *(name for name in report["drafts"] if name not in report["ranking"])]


def settings_table(report: dict[str, Any]) -> Any:
    from rich.table import Table
    from rich.text import Text

    # NOTE: the host's strings go in as Text, never as markup.
    table = Table(title=Text(f"{len(report['drafts'])} draft(s) on {report.get('prompts')} prompts, "
                             f"{report.get('max_new_tokens')} new tokens each"), title_justify="left")
    for header in ("draft", "num_steps", "topk", "draft tokens", "accept length", "tok/s", "speed-up"):
        table.add_column(header, justify="left" if header in WORDS else "right")
    table.add_row("(none)", "-", "-", "-", "-", f"{report['baseline']['tokens_per_s']:.1f}", "1.00 (no speculation)")
    for name in ordered(report):
        best = report["drafts"][name]["best"] or {}
        for c in report["drafts"][name]["configs"]:
            is_best = all(c[k] == best.get(k) for k in ("num_steps", "topk", "num_draft_tokens"))
            table.add_row(Text(name), str(c["num_steps"]), str(c["topk"]), str(c["num_draft_tokens"]), accept_text(c),
                          f"{c['tokens_per_s']:.1f}", speedup_text(c, " (best)" if is_best else ""))
    return table


def ranking_table(report: dict[str, Any]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="the drafts, fastest first (each at its best setting)", title_justify="left")
    for header in ("rank", "draft", "accept length", "tok/s", "speed-up", "best setting"):
        table.add_column(header, justify="left" if header in WORDS else "right")
    for rank, name in enumerate(report["ranking"], 1):
        c = report["drafts"][name]["best"]
        setting = f"steps {c['num_steps']}, topk {c['topk']}, draft tokens {c['num_draft_tokens']}"
        table.add_row(str(rank), Text(name), accept_text(c), f"{c['tokens_per_s']:.1f}",
                      speedup_text(c, " (serve)" if name == report.get("serve") else ""), setting)
    return table


def accept_text(config: dict[str, Any]) -> str:
    return "-" if config["accept_length"] is None else f"{config['accept_length']:.2f}"


def speedup_text(config: dict[str, Any], mark: str) -> Any:
    from rich.text import Text

    speedup = config["speedup"]
    style = "red" if (speedup or 0) <= 1 else "green" if mark else ""
    return Text(("-" if speedup is None else f"{speedup:.2f}") + mark, style=style)
