"""The small tables of `inv check` and `inv bench`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterator

from local.visible import visible

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

CHECK_STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def checks(results: list[dict[str, Any]], title: str) -> Table:
    """`inv check`'s table: each check, its status and its detail, the host's words shown as they are."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for header in ("check", "", "detail"):
        table.add_column(header)
    for result in results:
        table.add_row(Text(visible(result["name"])), Text(result["status"], CHECK_STYLES[result["status"]]),
                      Text(visible(result["detail"])))
    return table


def print_figures(figures: dict[str, Any], console: Console, as_json: bool) -> None:
    """Benchmark figures: JSON, or one flat table of suite, figure, value."""
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    from rich.table import Table

    table = Table(title="aerie benchmarks", title_justify="left")
    for header, justify in (("suite", "left"), ("figure", "left"), ("value", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for suite, values in figures.items():
        for name, value in _flatten(values):
            table.add_row(suite, name, f"{value:,.3f}" if isinstance(value, float) else str(value))
    console.print(table)


def _flatten(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
