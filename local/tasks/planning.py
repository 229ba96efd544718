"""`inv plan`: tokens, the hidden states' size, the host's disk and the route that fits (`remote/sizing.py`).

The host reads prep's manifests, the target's config.json and its free disk;
this side adds `inv validate`'s sample statistics for the datasets prep has not
run for yet (only when some lack a manifest: it runs prep over the samples).
`inv run` asks for the same plan and refuses a route that cannot fit.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from local.jobs import specs
from local.validation import samples
from local.exceptions import AerieError
from local.host.verbs import RemoteHost
from local.visible import visible_all
from local.inventory.fields import dump
from local.inventory.values import Inventory
from remote.eagle3.target_memory import decimal
from remote.sizing import engine_refusal, size_text, refusal


def request(inventory: Inventory, root: str, estimates: dict[str, dict[str, Any]] | None = None,
            names: list[str] | None = None) -> dict[str, Any]:
    extract, train, prep = inventory.stages.extract, inventory.stages.train, inventory.stages.prep
    return {
        "root": root, "readiness": readiness(inventory, root, names),
        "model": specs.on_host(dump(inventory.target), root)["model"],
        "layers": extract.layers, "dtype": extract.dtype, "disk_budget": extract.disk_budget,
        "route": extract.route, "engine": train.engine, "extract_engine": extract.engine, "max_length": prep.max_length,
        "epochs": train.epochs, "passes": extract.passes or train.epochs, "resident": extract.command is None,
        "datasets": [
            {"dataset": name, "source": d.source, "kind": d.kind, "rows": d.rows, "limit": d.limit,
             "max_length": prep.max_length, "estimate": (estimates or {}).get(name),
             # a prompts dataset's records grow by the target's answer
             "answer_tokens": inventory.stages.infer.max_tokens if d.kind == "prompts" else 0}
            for name, d in inventory.datasets.items()
        ],
    }


def readiness(inventory: Inventory, root: str, names: list[str] | None = None) -> dict[str, Any]:
    """What `remote/readiness.py` checks before a run of `names` (default: every dataset): the target and its
    tokenizer, the layer ids against it, an inference server for prompts datasets. A stage with a `command`
    of its own runs the user's code: its checks are left out."""
    stages, target = inventory.stages, specs.on_host(dump(inventory.target), root)
    chosen = inventory.select(names) if inventory.datasets else []
    prompts = [name for name in chosen if inventory.datasets[name].kind == "prompts"]
    checks = [name for name, wanted in (("tokenizer", chosen and stages.prep.command is None),
                                        ("target", chosen and stages.extract.command is None),
                                        ("server", prompts and stages.infer.command is None)) if wanted]
    return {"checks": checks, "tokenizer": target["tokenizer"] or target["model"], "model": target["model"],
            "layers": stages.extract.layers, "prompts": prompts, "server_url": stages.infer.server_url,
            "server_managed": stages.infer.server_command is not None}


def estimates(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """`inv validate`'s figures per dataset (rows, kept, mean_tokens over its sample); {} when it cannot run."""
    try:
        entries = samples.validate(inventory)
    except AerieError:
        return {}
    return {e["dataset"]: {k: e.get(k) for k in ("rows", "kept", "mean_tokens")} for e in entries if not e["error"]}


def ask(host: RemoteHost, names: list[str] | None = None) -> dict[str, Any]:
    """The host's plan for `names` (default: every dataset); with sample estimates when prep has not run for some.
    The checkout's `remote/` goes with it (`call_sent`): a plan needs no deploy."""
    result = host.call_sent("plan", **request(host.inventory, host.root, names=names))
    if result["unknown"]:
        result = host.call_sent("plan", **request(host.inventory, host.root, estimates(host.inventory), names))
    return result


def show(host: RemoteHost, console: Console, as_json: bool = False) -> dict[str, Any]:
    result = ask(host)
    if as_json:
        print(json.dumps(result, indent=2))
        return result
    result = visible_all(result)  # the host's words: shown, never obeyed (local/visible.py)
    table = Table(title=f"plan for {host.name}:{host.root}", title_justify="left")
    for header, justify in (("dataset", "left"), ("records", "right"), ("tokens", "right"), ("from", "left")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for d in result["datasets"]:
        table.add_row(escape(d["dataset"]), _count(d["records"]), _count(d["tokens"]), escape(d["basis"]))
    table.add_row("total", "", f"{result['tokens']:,}", "")
    console.print(table)
    if result.get("bytes_per_token"):
        console.print(f"hidden states: {result['bytes_per_token']:,} B/token ((len(layers {result['layers']}) + 1) × hidden "
                      f"{result['hidden_size']:,} × {result['dtype']}) → offline {size_text(result['offline_bytes'])}")
    budget = size_text(result["disk_budget"]) if result["disk_budget"] else "unset (the free space)"
    console.print(f"disk: {size_text(result['free_bytes'])} free, stages.extract.disk_budget {budget}")
    if result["route"]:
        chunks = f" in about {result['chunks']} chunks" if result["route"] == "chunked" else ""
        console.print(f"route that fits: [bold]{result['route']}[/]{chunks} (configured: {result['configured_route']})")
    if result.get("costs"):
        console.print(costs_table(result))
    if result.get("extract_engines"):
        console.print(engines_table(result["extract_engines"]))
    if result.get("reason"):
        console.print(f"[yellow]note:[/] {escape(result['reason'])}")
    for why in (refusal(result), engine_refusal(result)):
        if why:
            console.print(f"[bold red]{escape(why)}[/]")
    for problem in result.get("refusals", []):  # what `inv run` refuses to start on
        console.print(f"[bold red]cannot run: {escape(problem)}[/]")
    return result


def costs_table(result: dict[str, Any]) -> Table:
    """What each route asks of the target, and the hours at the throughput a previous run measured."""
    rates = result.get("throughput") or {}
    known = rates.get("extract_tokens_per_s") and rates.get("train_tokens_per_s")
    note = (f"at {rates['extract_tokens_per_s']:,.0f} tok/s forward, {rates['train_tokens_per_s']:,.0f} tok/s trained "
            f"(measured by {escape(rates['from'])})") if known else "time unknown: no run on this host measured the throughput yet"
    table = Table(title=f"what each route costs ({note})", title_justify="left")
    for header in ("route", "target loads", "forward passes", "tokens read by the target", "estimated time"):
        table.add_column(header, justify="left" if header == "route" else "right")
    for route, cost in result["costs"].items():
        fits = " (fits)" if route == result["route"] else ""
        hours = "unknown" if cost["hours"] is None else f"{cost['hours']:,.2f} h"
        table.add_row(route + fits, f"{cost['target_loads']:,}", f"{cost['passes']:,}", f"{cost['forward_tokens']:,}", hours)
    return table


def engines_table(engines: dict[str, Any]) -> Table | str:
    """Per extract engine: what the target needs there, what this host's GPUs (nvidia-smi) hold, whether it fits,
    and the hours at a measured or stated rate."""
    if engines.get("error"):
        return f"[yellow]extract engines not sized:[/] {escape(engines['error'])}"
    gpus = engines.get("gpus") or []
    where = f"{len(gpus)} GPUs, {decimal(sum(gpus))} (nvidia-smi)" if gpus else "no GPU (nvidia-smi not found): the host's RAM"
    table = Table(title=f"extract engines on {where}; stages.extract.engine: {escape(str(engines['configured']))}", title_justify="left")
    for header in ("engine", "the target needs", "holds", "fits", "time"):
        table.add_column(header, justify="left" if header in ("engine", "holds") else "right")
    for name, size in engines["engines"].items():
        need = f"{decimal(size['need_bytes'])} ({escape(size['in'])})"
        if name == "sglang" and gpus:
            need = f"{decimal(size['per_gpu_need_bytes'])} per GPU ({decimal(size['stored_bytes'])} as stored / {len(gpus)} + reserve)"
        holds = f"{decimal(size['per_gpu_bytes'])} per GPU" if name == "sglang" and gpus else decimal(size["capacity_bytes"])
        hours = "unknown" if size["hours"] is None else f"{size['hours']:,.1f} h at {size['tokens_per_s']:,.0f} tok/s {size['rate_basis']}"
        table.add_row(name, need, f"{holds} ({escape(size['holds'])})", "yes" if size["fits"] else "[red]no[/]", hours)
    return table


def require(host: RemoteHost, names: list[str] | None = None) -> dict[str, Any]:
    """Before `inv run`: the plan, or an `AerieError` naming the numbers when the configured route cannot fit,
    the configured extract engine cannot hold the target, or what `remote/readiness.py` found wrong (a layer id,
    the target, the inference server)."""
    result = ask(host, names)
    if result.get("refusals"):
        raise AerieError(f"{host.name}: nothing was started: " + "; ".join(result["refusals"]))
    why = refusal(result) or engine_refusal(result)
    if why:
        raise AerieError(f"{host.name}: {why}")
    return result


def resolve(host: RemoteHost, names: list[str] | None = None) -> str:
    """`require`, then the route this run takes: the configured one, or for auto the one that fits."""
    result = require(host, names)
    stages = host.inventory.stages
    if stages.extract.route != "auto" or not result["route"]:
        return stages.extract.route
    # NOTE: the inventory checked SpecForge's settings for the route it names; auto's is known only now.
    refusal = stages.train.specforge_refusal(stages.extract, result["route"])
    if refusal:
        raise AerieError(f"{host.name}: route {result['route']} (auto): {refusal}")
    return result["route"]


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
