"""Stage settings as the workstation sends them: every default from the inventory's schema, then the caller's own."""

from __future__ import annotations

from typing import Any

from local.inventory.fields import dump
from local.inventory.stages import settings_class, stage_names


def complete(stage: str, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """`settings` over the schema's defaults for `stage` (tokenize is prep), as `local.jobs.specs.spec` sends them;
    a job that is not an inventory stage (the chunked route's driver) gets `settings` as they are."""
    if stage != "tokenize" and stage not in stage_names():
        return dict(settings or {})
    defaults = settings_class("prep" if stage == "tokenize" else stage)()
    return {**dump(defaults, exclude={"command", "stall_after"}), **(settings or {})}
