"""Job specs: what the host needs to run one stage of one dataset, built from the inventory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from local.inventory.fields import dump

if TYPE_CHECKING:
    from local.inventory.values import Inventory


def spec(inventory: Inventory, dataset: str, stage: str, inputs: list[str] | None = None,
         source: str | None = None) -> dict[str, Any]:
    """Stage `stage` of `dataset`, on the executor that runs it, whole: nothing is patched in later.

    `inputs`: the folders it reads, for a stage that reads another's output (extract);
    `source`: a file it reads in place of the dataset's own, as native chats (tokenize: the target's answers).
    """
    settings = inventory.stage(settings_of(stage))
    entry = dump(inventory.datasets[dataset])
    if source is not None:
        entry |= {"source": source, "kind": "native"}
    config = {"dataset": entry, **stage_config(inventory, stage)}
    if inputs is not None:
        config["inputs"] = inputs
    return {
        "dataset": dataset,
        "stage": stage,
        "command": settings.command,  # None: the host's default for the stage
        "source": entry["source"],
        "kind": entry["kind"],
        "stall_after": settings.stall_after,
        "log_limit": settings.log_limit,  # bytes: the supervisor caps the job's log there
        "config": config,
        **placement(inventory, stage),
    }


def settings_of(stage: str) -> str:
    """The stage whose settings a stage runs with: tokenize is prep over the target's answers."""
    return "prep" if stage == "tokenize" else stage


def stage_config(inventory: Inventory, stage: str) -> dict[str, Any]:
    """The stage's settings and the target, `{root}` made the host's: the part of `config` every job has."""
    settings = inventory.stage(settings_of(stage))
    root = inventory.host.root
    return {"stage": on_host(dump(settings, exclude={"command", "stall_after"}), root),
            "inventory": {"target": on_host(dump(inventory.target), root)}}


def placement(inventory: Inventory, stage: str) -> dict[str, Any]:
    """The executor that runs the job (named once, by the inventory) and, for one that queues jobs on a
    cluster, the resources of its stage (ignored where there is no such queue)."""
    return {"executor": inventory.executor, "slurm": inventory.slurm.for_stage(settings_of(stage))}


def specs(inventory: Inventory, stage: str, datasets: list[str] | None) -> list[dict[str, Any]]:
    return [spec(inventory, name, stage) for name in inventory.select(datasets)]


def all_specs(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """Every (dataset, stage) spec, keyed as the host names job directories, for `rerun`."""
    return {
        f"{name}/{stage}": spec(inventory, name, stage)
        for name in inventory.datasets
        for stage in inventory.stage_names()  # every stage the schema declares, in its order
    }


def inventory_key(dataset: str, stage: str, path: list[str]) -> str:
    """The inventory's name of the setting at `path` in the spec of `dataset`'s `stage` (as `spec` and
    graph's draft jobs build it), for a rerun to say what changed: ``stages.extract.layers``."""
    head, rest = (path[0], path[1:]) if path else ("", [])
    if head == "config" and rest[:1] == ["stage"]:
        inner = rest[1:]
        if stage == "chunked":  # both stages' settings under their names; the budget is extract's
            return ".".join(["stages", *(inner if inner[:1] in (["extract"], ["train"]) else ["extract", *inner])])
        return ".".join(["stages", settings_of(stage), *inner])
    if head == "config" and rest[:2] == ["inventory", "target"]:
        return ".".join(["target", *rest[2:]])
    if head == "config" and rest[:1] == ["dataset"]:
        return ".".join(["datasets", dataset, *rest[1:]])
    if head in ("command", "stall_after", "log_limit"):
        return f"stages.{settings_of(stage)}.{head}"
    if head in ("source", "kind"):
        return f"datasets.{dataset}.{head}"
    return ".".join(path)


def on_host(settings: Any, root: str) -> Any:
    """`{root}` in a setting means the host's root (e.g. assets built there by `inv demo`), at any depth."""
    if isinstance(settings, dict):
        return {k: on_host(v, root) for k, v in settings.items()}
    if isinstance(settings, list):
        return [on_host(v, root) for v in settings]
    return settings.replace("{root}", root) if isinstance(settings, str) else settings
