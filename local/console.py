"""The console every task prints to: rich's, imported on first need, and lines of text that never need it."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


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


def line(*parts: str | tuple[str, str]) -> Any:
    """A line of text and (text, style) parts whose text is printed as it is, never read as markup;
    plain text that rich would not change stays a `str`, which the console writes without importing
    rich (LazyConsole: a deploy that sends nothing never imports it)."""
    if all(isinstance(p, str) and not RICH_SYNTAX.search(p) for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    from rich.text import Text

    return Text.assemble(*parts)
