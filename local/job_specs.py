"""Job specs: what the host needs to run one stage of one dataset, built from the inventory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from local.inventory import Inventory


def spec(inventory: Inventory, dataset: str, stage: str) -> dict[str, Any]:
    settings = inventory.stage(stage)
    entry = inventory.datasets[dataset]
    return {
        "dataset": dataset,
        "stage": stage,
        "command": settings.command,  # None: the host's default for the stage
        "source": entry.source,
        "kind": entry.kind,
        "stall_after": settings.stall_after,
        "log_limit": settings.log_limit,  # bytes: the supervisor caps the job's log there
        "config": {
            "dataset": entry.model_dump(),
            "stage": on_host(settings.model_dump(exclude={"command", "stall_after"}), inventory.host.root),
            "inventory": {"target": on_host(inventory.target.model_dump(), inventory.host.root)},
        },
    }


def placed(inventory: Inventory, spec: dict[str, Any]) -> dict[str, Any]:
    """The job with the executor that runs it (named once, by the inventory) and, for one that queues
    jobs on a cluster, the resources of its stage (ignored where there is no such queue)."""
    stage = spec["stage"] if spec["stage"] != "tokenize" else "prep"
    return {**spec, "executor": inventory.executor, "slurm": inventory.slurm.for_stage(stage)}


def specs(inventory: Inventory, stage: str, datasets: list[str] | None) -> list[dict[str, Any]]:
    return [placed(inventory, spec(inventory, name, stage)) for name in inventory.select(datasets)]


def all_specs(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """Every (dataset, stage) spec, keyed as the host names job directories, for `rerun`."""
    return {
        f"{name}/{stage}": placed(inventory, spec(inventory, name, stage))
        for name in inventory.datasets
        for stage in inventory.stages.model_dump()  # every stage the schema declares, in its order
    }


def on_host(settings: Any, root: str) -> Any:
    """`{root}` in a setting means the host's root (e.g. assets built there by `inv demo`), at any depth."""
    if isinstance(settings, dict):
        return {k: on_host(v, root) for k, v in settings.items()}
    if isinstance(settings, list):
        return [on_host(v, root) for v in settings]
    return settings.replace("{root}", root) if isinstance(settings, str) else settings
