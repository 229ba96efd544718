"""Glue between Invoke and aerie: a `task` decorator that turns user mistakes into one line."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Callable

import invoke
from invoke import Context, Exit

from local.exceptions import AerieError
from local.visible import visible

if TYPE_CHECKING:
    from rich.console import Console


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


def console() -> Console:
    # NOTE: piped to a file or CI log, rich would assume 80 columns and fold every table.
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return LazyConsole(highlight=False, soft_wrap=True, width=wide)  # type: ignore[return-value]


#: What rich would change in a line of text: [markup] and :emoji: codes.
RICH_SYNTAX = re.compile(r"\[|:\S+?:")


class LazyConsole:
    """rich's `Console`, imported on first need: a line of plain text is written as it is.

    Importing rich is about a tenth of an `inv deploy` that only has to say that nothing
    changed; such a line needs no markup, styles or wrapping (the console soft-wraps).
    """

    def __init__(self, **options: Any) -> None:
        self._options, self._rich = options, None

    @property
    def rich(self) -> Console:
        if self._rich is None:
            from rich.console import Console

            self._rich = Console(**self._options)
        return self._rich

    def print(self, *objects: Any, **options: Any) -> None:
        if self._rich is None and not options and all(isinstance(o, str) and not RICH_SYNTAX.search(o) for o in objects):
            sys.stdout.write(" ".join(objects) + "\n")
            sys.stdout.flush()
            return
        self.rich.print(*objects, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)

    # NOTE: dunder methods bypass __getattr__; rich's Live enters its console (`with console:`).
    def __enter__(self) -> Console:
        return self.rich.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.rich.__exit__(*exc)
