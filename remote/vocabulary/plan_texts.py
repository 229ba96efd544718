"""`inv plan`'s refusals in words, from the plan's result (`remote.sizing.plan`): shared with the
workstation, which says them again before `inv run` starts anything."""

from __future__ import annotations

from remote.vocabulary.sizes import binary

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any


def refusal(result: dict[str, Any]) -> str | None:
    """Why the configured route cannot run (naming the numbers and the route that would), or None."""
    wanted, fits, engine = result["configured_route"], result["route"], result["engine"]
    if fits is None:
        return None  # nothing known yet to refuse on
    order = {"offline": 0, "chunked": 1, "online": 2}
    chosen = fits if wanted == "auto" else wanted
    numbers = (f"the states take {binary(result['stored_bytes'])} ({result['tokens']:,} tokens × {result['bytes_per_token']:,} B) "
               f"and the budget is {binary(result['usable_bytes'])} (free {binary(result['free_bytes'])}, "
               f"disk_budget {binary(result['disk_budget']) if result['disk_budget'] else 'unset'})")
    if chosen == "online" and engine != "specforge":
        return f"nothing fits on disk: {numbers}; the online route needs stages.train.engine specforge"
    if order[chosen] < order[fits]:
        would = fits + (f" ({result['chunks']} chunks)" if fits == "chunked" else "")
        return f"route {chosen} does not fit: {numbers}; the route that fits is {would} (stages.extract.route)"
    return None


def engine_refusal(result: dict[str, Any]) -> str | None:
    """Why the configured extract engine cannot hold the target on this host (one line), or None."""
    engines = result.get("extract_engines") or {}
    configured = (engines.get("engines") or {}).get(engines.get("configured"))
    route = result["configured_route"] if result.get("configured_route") != "auto" else result.get("route")
    if not configured or route == "online":  # the online route extracts nothing
        return None
    # NOTE: without nvidia-smi the sglang engine is not sized: its CPU stand-in (the tests') runs there
    return configured["refusal"] if engines["configured"] == "hf" or engines.get("gpus") else None
