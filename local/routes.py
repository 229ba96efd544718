"""The pipeline's shape for the route `inv plan` chose (`stages.extract.route`, resolved by `inv run`).

- ``offline``: every dataset's ``extract``, then one ``draft/train`` (the plan as built);
- ``chunked``: one ``draft/chunked`` job (`remote/chunked.py`) in place of the extracts
  and the train, needing every dataset's prep (tokenize for a prompts dataset);
- ``online``: no extract; ``draft/train`` (SpecForge with the target alongside) needs the prep outputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from local import job_specs

if TYPE_CHECKING:
    from local.inventory import Inventory

DRAFT = "draft"
#: The route `inv plan` resolved for `auto` this invocation, by host root (`local.planning.resolve`).
#: NOTE: kept here rather than written into the inventory, whose cached records are read-only.
RESOLVED: dict[str, str] = {}


def apply(inventory: Inventory, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    route = RESOLVED.get(inventory.host.root, inventory.stages.extract.route)
    if route in ("auto", "offline"):
        return nodes
    extracts = [n for n in nodes if n["spec"]["stage"] == "extract"]
    train = next(n for n in nodes if n["spec"]["stage"] == "train")
    kept = [n for n in nodes if n not in extracts and n is not train]
    needs = [need for n in extracts for need in n["needs"]]  # each dataset's prep or tokenize
    preps = {n["spec"]["dataset"]: n["spec"]["config"]["inputs"][0] for n in extracts}
    if route == "online":
        config = train["spec"]["config"]
        config["prep_inputs"] = preps
        config.pop("inputs", None)
        config["stage"]["layers"] = inventory.stages.extract.layers  # what SGLang captures for the draft
        return kept + [{**train, "needs": needs}]
    spec = job_specs.placed(inventory, job_specs.spec(inventory, next(iter(inventory.datasets)), "extract")) | {
        "dataset": DRAFT, "stage": "chunked", "command": None, "source": "", "kind": "native"}
    extract, training = inventory.stages.extract, inventory.stages.train
    spec["stall_after"] = max(extract.stall_after, training.stall_after)
    spec["config"] = {
        "dataset": {}, "inventory": spec["config"]["inventory"], "prep_inputs": preps,
        "stage": {"disk_budget": extract.disk_budget,
                  "extract": job_specs.on_host(extract.model_dump(exclude={"stall_after"}), inventory.host.root),
                  "train": job_specs.on_host(training.model_dump(exclude={"stall_after"}), inventory.host.root)},
    }
    return kept + [{"key": f"{DRAFT}/chunked", "needs": needs, "gpu": True, "server": False, "spec": spec}]
