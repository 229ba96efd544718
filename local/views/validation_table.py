"""`inv validate`'s table, and the lines under it: every value `visible` (a skip reason names a row's keys,
which the data chose)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from local.console import line
from local.visible import visible, visible_all

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def render(entries: list[dict[str, Any]]) -> Table:
    """The table; every value a `Text` made `visible` (a skip reason names a row's keys, which the data chose)."""
    from rich.table import Table
    from rich.text import Text

    entries = visible_all(entries)

    table = Table(title="prep over local samples", title_justify="left")
    for header, justify in (("dataset", "left"), ("kind", "left"), ("formats", "left"), ("rows", "right"),
                            ("kept", "right"), ("skipped (top reasons)", "left"), ("records", "right"),
                            ("turns (expanded)", "right"), ("learned tokens (reasoning)", "right"), ("mean tokens", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for entry in entries:
        reasons = ", ".join(f"{reason} ×{count}" for reason, count in list(entry["skip_reasons"].items())[:3])
        kept = Text(str(entry["kept"]), "bold red" if not entry["kept"] else "green")
        table.add_row(Text(entry["dataset"]), Text(entry["kind"]), Text(", ".join(entry["formats"]) or "-"),
                      Text(str(entry["rows"])), kept,
                      Text(entry["error"], "red") if entry["error"] else Text(f"{entry['skipped']} {reasons}".strip()),
                      *map(Text, _learned(entry)), Text(f"{entry['mean_tokens']:.0f}" if entry.get("mean_tokens") else "-"))
    return table


def _learned(entry: dict[str, Any]) -> tuple[str, str, str]:
    """Records, assistant turns (those that took a record of their own) and learned tokens (of reasoning)."""
    if not entry.get("records"):
        return "-", "-", "-"
    if entry.get("kind") == "prompts":  # no answers yet: the target writes them (infer), tokenize counts them
        asked = entry.get("turns_to_ask") or 0
        return str(entry["records"]), f"{asked} ({asked / entry['records']:.1f}/row)", "by infer"
    turns = f"{entry.get('assistant_turns', 0)} ({entry.get('turns_expanded', 0)})"
    learned = f"{entry.get('learned_tokens', 0)} ({entry.get('reasoning_tokens', 0)})" if entry.get("learned_tokens") else "-"
    return str(entry["records"]), turns, learned


def show(console: Console, fresh: list[dict[str, Any]], reused: list[str]) -> None:
    """The table, the cached datasets' names, the notes and each dataset's details: every value `visible`.

    Only what was validated now needs rich: the cached datasets' line is plain text, which the console writes
    without importing it (a deploy that validates nothing and sends nothing never does)."""
    if fresh:
        console.print(render(fresh))
    if reused:
        console.print(line(f"validated (cached): {names_text(reused)} (`--revalidate` checks again)"))
    if not fresh:
        return
    from rich.text import Text

    for note in sorted({e["note"] for e in fresh if e.get("note")}):  # a cached entry's note was shown before
        console.print(Text.assemble(("note:", "yellow"), " ", visible(note)))
    for detail in filter(None, map(details, fresh)):  # a dropped field's name is a row's key: the data's
        console.print(Text(visible(detail)))


#: How each kind of `tool_declarations` reads (`remote.prep.template.tool_declaration`).
DECLARED = {"typescript": "TypeScript-style", "json": "as JSON", "other": "otherwise"}


def details(entry: dict[str, Any]) -> str | None:
    """What the table has no room for: how the rows' tools were declared, and the fields of turns prep
    dropped ("thoughts dropped in 312 turns"); None when there is neither."""
    said = []
    if entry.get("tool_declarations"):
        said.append("tools declared " + ", ".join(
            f"{DECLARED.get(kind, kind)} in {n} row{'s' * (n != 1)}" for kind, n in entry["tool_declarations"].items()))
    if entry.get("kind") == "prompts" and entry.get("records"):
        asked = entry.get("turns_to_ask") or 0
        said.append(f"infer will ask {asked} turns of {entry['records']} rows ({asked / entry['records']:.1f} per row)")
    if entry.get("turns_left_out"):
        said.append(f"{entry['turns_left_out']} turns of agents that write their actions in the text not asked "
                    "(infer asks their first)")
    if entry.get("dropped_fields"):
        said.append(", ".join(f"{name} dropped in {n} turn{'s' * (n != 1)}" for name, n in entry["dropped_fields"].items()))
    return f"{entry['dataset']}: {'; '.join(said)}" if said else None


def names_text(names: list[str], shown: int = 8) -> str:
    return ", ".join(names) if len(names) <= shown else f"{', '.join(names[:shown])} and {len(names) - shown} more"
