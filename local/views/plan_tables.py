"""`inv plan`'s tables: what each route costs, and what each extract engine needs against what the host holds."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from remote.vocabulary.plan_texts import engine_refusal, refusal
from remote.vocabulary.sizes import binary, decimal


def show(result: dict[str, Any], console: Console, title: str) -> None:
    """The plan: tokens per dataset, the states' size, the disk, the route that fits, each route's cost, the
    engines, and what `inv run` would refuse; `result` already made `visible` (the host's words)."""
    table = Table(title=title, title_justify="left")
    for header, justify in (("dataset", "left"), ("records", "right"), ("tokens", "right"), ("from", "left")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for d in result["datasets"]:
        table.add_row(escape(d["dataset"]), count_text(d["records"]), count_text(d["tokens"]), escape(d["basis"]))
    table.add_row("total", "", f"{result['tokens']:,}", "")
    console.print(table)
    if result.get("bytes_per_token"):
        console.print(f"hidden states: {result['bytes_per_token']:,} B/token ((len(layers {result['layers']}) + 1) × hidden "
                      f"{result['hidden_size']:,} × {result['dtype']}) → offline {binary(result['offline_bytes'])}")
    budget = binary(result["disk_budget"]) if result["disk_budget"] else "unset (the free space)"
    console.print(f"disk: {binary(result['free_bytes'])} free, stages.extract.disk_budget {budget}")
    if result["route"]:
        chunks = f" in about {result['chunks']} chunks" if result["route"] == "chunked" else ""
        console.print(f"route that fits: [bold]{result['route']}[/]{chunks} (configured: {result['configured_route']})")
    if result.get("loads"):
        console.print(loads_text(result["loads"]))
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


def loads_text(loads: dict[str, Any]) -> str:
    """The loads `inv run` makes: the inference server's starts, the target's (for extract, or its route's)."""
    server = (f"{loads['server_starts']} inference server start for {loads['infer_jobs']} infer job(s)"
              if loads["server_starts"] else "no inference server start")
    target = "?" if loads["target_loads"] is None else f"{loads['target_loads']:,}"
    return f"loads in `inv run`: {server}, {target} target load(s) on the {escape(loads['route'])} route"


def costs_table(result: dict[str, Any]) -> Table:
    """What each route asks of the target, and the hours at the throughput a previous run measured."""
    rates = result.get("throughput") or {}
    known = rates.get("extract_tokens_per_s") and rates.get("train_tokens_per_s")
    note = (f"at {rates['extract_tokens_per_s']:,.0f} tok/s forward, {rates['train_tokens_per_s']:,.0f} tok/s trained per GPU "
            f"on {result.get('train_gpus') or 1} GPU(s) "
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


def count_text(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"
