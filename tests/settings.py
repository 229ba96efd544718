"""The typed prep settings a test builds: the schema's defaults (`benchmarks.harness.stage_settings`), then its own."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.stage_settings import complete


def prep_settings(**settings: Any) -> Any:
    from remote.prep.prep_settings import PrepSettings

    return PrepSettings.from_config(complete("prep", settings))
