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
        if self._rich is None and not options and all(self._is_plain(o) for o in objects):
            out = self._options.get("file") or sys.stdout
            out.write(" ".join(o.plain if isinstance(o, StyledLine) else o for o in objects) + "\n")
            out.flush()
            return
        self.rich.print(*objects, **options)

    def _is_plain(self, item: Any) -> bool:
        """Text rich would write unchanged: no markup, and styles only where they would not show."""
        if isinstance(item, StyledLine):
            return not self._shows_styles()
        return isinstance(item, str) and not RICH_SYNTAX.search(item)

    def _shows_styles(self) -> bool:
        """Whether rich would write styles: to a terminal, or where the environment forces them as rich reads it."""
        forced = self._options.get("force_terminal")
        if forced is not None:
            return bool(forced)
        if os.environ.get("TTY_COMPATIBLE") in ("0", "1"):
            return os.environ["TTY_COMPATIBLE"] == "1"
        if os.environ.get("FORCE_COLOR") is not None:
            return os.environ["FORCE_COLOR"] != ""
        isatty = getattr(self._options.get("file") or sys.stdout, "isatty", None)
        try:
            return bool(isatty and isatty())
        except ValueError:  # a closed stream is no terminal
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)

    # NOTE: dunder methods bypass __getattr__; rich's Live enters its console (`with console:`).
    def __enter__(self) -> Console:
        return self.rich.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.rich.__exit__(*exc)


class StyledLine:
    """Text and (text, style) parts, never read as markup: rich's `Text` where its styles show (a terminal),
    else written as plain text by the console without importing rich."""

    def __init__(self, parts: tuple[str | tuple[str, str], ...]) -> None:
        self.parts = parts

    @property
    def plain(self) -> str:
        return "".join(part if isinstance(part, str) else part[0] for part in self.parts)

    def __rich__(self) -> Any:
        from rich.text import Text

        return Text.assemble(*self.parts)


def line(*parts: str | tuple[str, str]) -> Any:
    """A line of text and (text, style) parts whose text is printed as it is, never read as markup;
    plain text that rich would not change stays a `str`, which the console writes without importing
    rich (LazyConsole: a deploy that sends nothing never imports it), and styled parts import it only
    where the styles show."""
    if all(isinstance(p, str) and not RICH_SYNTAX.search(p) for p in parts):
        return "".join(parts)  # type: ignore[arg-type]
    return StyledLine(parts)
