"""Glue between Invoke and aerie: a `task` decorator that turns user mistakes into one line, and the flags'
parsing (a typo is one line, never Invoke's traceback)."""

from __future__ import annotations

import atexit
import functools
import gc
from typing import Any, Callable

import invoke
from invoke import Context, Exit

from local.exceptions import AerieError
from local.visible import visible


def task(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], invoke.Task]:
    """`invoke.task`, but an `AerieError` ends the run as `aerie: message` with exit code 2."""

    def decorate(body: Callable[..., Any]) -> invoke.Task:
        @functools.wraps(body)
        def run(c: Context, *a: Any, **kw: Any) -> Any:
            try:
                return body(c, *a, **kw)
            except AerieError as exc:  # its text may quote the host or the data: shown, never obeyed
                raise Exit(f"aerie: {visible(str(exc))}", code=2) from None

        return invoke.task(**kwargs)(run)

    if len(args) == 1 and callable(args[0]) and not kwargs:  # bare @task
        return decorate(args[0])
    return decorate


def exit_without_collecting() -> None:
    """Let the process end without Python's last garbage collections.

    At exit the interpreter collects garbage several times over, each time walking every
    object the imports made (Invoke, rich, paramiko: about 27,000). That is about 80 ms,
    a sixth of an `inv status`. Frozen objects are not walked. Frozen cyclic garbage is
    then left for the OS to reclaim with the process. Nothing of aerie's waits on a
    collector: files are closed by `with`, connections by `local.transport.shared` at exit,
    and the standard streams are flushed by the interpreter itself. The exit code is
    kept, because the interpreter still exits normally.
    """
    atexit.register(gc.freeze)


def inventory_name(c: Context, given: str | None) -> str:
    """`-i NAME|PATH`, else Invoke's config key `inventory` (so INVOKE_INVENTORY=gpu works)."""
    return given or c.config.get("inventory") or "local"


def split(names: str | None) -> list[str] | None:
    """`A1,B5` (or repeated flags joined by Invoke) as a list; None for all."""
    return [n for n in names.replace(" ", ",").split(",") if n] if names else None


def number(text: str, flag: str, kind: type[int] | type[float]) -> Any:
    """A flag's number, parsed here so that a typo is one line, not Invoke's traceback."""
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if value < 0:
        raise AerieError(f"{flag} takes a {'whole ' if kind is int else ''}number of at least 0, not {text!r}")
    return value
