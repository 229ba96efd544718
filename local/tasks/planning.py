"""`inv plan`: tokens, the hidden states' size, the host's disk and the route that fits (`remote/sizing.py`).

The host reads prep's manifests, the target's config.json and its free disk;
this side adds `inv validate`'s sample statistics for the datasets prep has not
run for yet (only when some lack a manifest: it runs prep over the samples).
`inv run` asks for the same plan and refuses a route that cannot fit.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from local.console import line
from local.jobs import pipeline, specs
from local.validation import samples
from local.exceptions import AerieError
from local.host.verbs import RemoteHost
from local.views import plan_tables
from local.visible import visible_all
from local.inventory.values import Inventory
from remote.vocabulary.plan_texts import engine_refusal, refusal

if TYPE_CHECKING:
    from rich.console import Console


def request(inventory: Inventory, root: str, estimates: dict[str, dict[str, Any]] | None = None,
            names: list[str] | None = None) -> dict[str, Any]:
    train, prep = inventory.stages.train, inventory.stages.prep
    extract = specs.sent_settings(inventory, "extract")  # as extract's job gets them: one way to the host
    return {
        "root": root, "readiness": readiness(inventory, root, names),
        "model": specs.dumped(inventory.target, root)["model"],
        "layers": extract["layers"], "dtype": extract["dtype"], "disk_budget": extract["disk_budget"],
        "route": extract["route"], "engine": train.engine, "extract_engine": extract["engine"], "max_length": prep.max_length,
        "epochs": train.epochs, "train_nproc": train.nproc, "resident_train": train.command is None, "passes": extract["passes"] or train.epochs,
        "resident": inventory.stages.extract.command is None,
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
    tokenizer, the layer ids against it (the request's own ``layers``, extract's as its spec carries them), an
    inference server for prompts datasets. A stage with a `command` of its own runs the user's code: its checks
    are left out."""
    stages, target = inventory.stages, specs.dumped(inventory.target, root)
    chosen = inventory.select(names) if inventory.datasets else []
    prompts = [name for name in chosen if inventory.datasets[name].kind == "prompts"]
    checks = [name for name, wanted in (("tokenizer", chosen and stages.prep.command is None),
                                        ("target", chosen and stages.extract.command is None),
                                        ("server", prompts and stages.infer.command is None)) if wanted]
    return {"checks": checks, "tokenizer": target["tokenizer"] or target["model"], "model": target["model"],
            "prompts": prompts, "server_url": stages.infer.server_url,
            "server_managed": stages.infer.server_command is not None}


def estimates(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """`inv validate`'s figures per dataset (rows, kept, mean_tokens over its sample); {} when it cannot run.
    A dataset `inv deploy` validated with the same inputs is read from the validation cache, not tokenised again."""
    try:
        entries = samples.through_cache(inventory)[0]
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
    result["loads"] = pipeline.loads(host.inventory, result)
    if as_json:
        print(json.dumps(result, indent=2))
        return result
    plan_tables.show(visible_all(result), console, f"plan for {host.name}:{host.root}")
    return result


def require(host: RemoteHost, names: list[str] | None = None) -> dict[str, Any]:
    """Before `inv run`: the plan, or an `AerieError` naming the numbers when the configured route cannot fit,
    the configured extract engine cannot hold the target, or what `remote/readiness.py` found wrong (a layer id,
    the target, the inference server)."""
    result = ask(host, names)
    refuse_unready(host, result)
    why = refusal(result) or engine_refusal(result)
    if why:
        raise AerieError(f"{host.name}: {why}")
    return result


def refuse_unready(host: RemoteHost, result: dict[str, Any]) -> None:
    """What `remote/readiness.py` found wrong in the plan `result` (a layer id, the target, the inference
    server), refused in one line."""
    if result.get("refusals"):
        raise AerieError(f"{host.name}: nothing was started: " + "; ".join(result["refusals"]))


def require_ready(host: RemoteHost, names: list[str]) -> None:
    """Before a rerun relaunches the last `inv run`'s pipeline with the inventory as it is now: the checks
    `inv run` makes of the target, its layers and the inference server (not the route's fit: the rerun
    keeps the last run's route). No sample estimates: what is wrong does not wait on token counts."""
    refuse_unready(host, host.call_sent("plan", **request(host.inventory, host.root, names=names)))


def resolve(host: RemoteHost, names: list[str] | None = None, console: Console | None = None) -> str:
    """`require`, then the route this run takes: the configured one, or for auto the one that fits; with
    `console`, first a line of the room on the host's root against what the plan expects the states to take."""
    result = require(host, names)
    if console is not None:
        console.print(line(room(host, result)))
    stages = host.inventory.stages
    if stages.extract.route != "auto" or not result["route"]:
        return stages.extract.route
    # NOTE: the inventory checked SpecForge's settings for the route it names; auto's is known only now.
    refusal = stages.train.specforge_refusal(stages.extract, result["route"])
    if refusal:
        raise AerieError(f"{host.name}: route {result['route']} (auto): {refusal}")
    return result["route"]


def room(host: RemoteHost, result: dict[str, Any]) -> str:
    """The room the host's root has, against the states `inv plan` expects extract to write."""
    free = f"{result['free_bytes'] / 2**30:,.1f} GiB free on {host.name}:{host.root}"
    if not result.get("stored_bytes"):
        return f"{free}; the states' size is not known yet (needs prep's token counts and the target's config)"
    return (f"{free}; extract is expected to write about {result['stored_bytes'] / 2**30:,.1f} GiB of states "
            f"(route {result.get('route') or 'none that fits'}; `inv plan` has the figures)")
