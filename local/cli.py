"""Glue between Invoke and aerie: a `task` decorator that turns user mistakes into one line."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import invoke
from invoke import Context, Exit
from rich.console import Console

from local.errors import AerieError


def task(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], invoke.Task]:
    """`invoke.task`, but an `AerieError` ends the run as `aerie: message` with exit code 2."""

    def decorate(body: Callable[..., Any]) -> invoke.Task:
        @functools.wraps(body)
        def run(c: Context, *a: Any, **kw: Any) -> Any:
            try:
                return body(c, *a, **kw)
            except AerieError as exc:
                raise Exit(f"aerie: {exc}", code=2) from None

        return invoke.task(**kwargs)(run)

    if len(args) == 1 and callable(args[0]) and not kwargs:  # bare @task
        return decorate(args[0])
    return decorate


def inventory_name(c: Context, given: str | None) -> str:
    """`-i NAME|PATH`, else Invoke's config key `inventory` (so INVOKE_INVENTORY=gpu works)."""
    return given or c.config.get("inventory") or "local"


def console() -> Console:
    # NOTE: piped to a file or CI log, rich would assume 80 columns and fold every table.
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return Console(highlight=False, soft_wrap=True, width=wide)
