"""`inv validate`: the prep code over each dataset's local sample, on this machine, before any deploy.

Runs ``python -m remote.prep.validate`` from the checkout (the same command line and
JSON as on the host) and fails on every dataset that would give zero records: the
bug that lost three of ten datasets.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from local.inventory.fields import dump
from local.jobs import specs
from local.exceptions import AerieError
from local.validation.cache import ValidationCache, keys
from local.visible import visible, visible_all
from local.paths import INVENTORIES, REPO
from local.transport.protocol import LocalTransport
from remote.control_plane.wire import decode

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from local.inventory.values import Inventory


def sample_of(inventory: Inventory, name: str) -> str:
    """`sample` (relative to the inventory's folder), else a source that is a file in the checkout."""
    entry = inventory.datasets[name]
    folder = inventory.path.parent if inventory.path else INVENTORIES
    if entry.sample:
        return str((folder / entry.sample).resolve())
    if (REPO / entry.source).is_file():
        return str(REPO / entry.source)
    return entry.source  # a hub id: the first rows from this machine's cache, offline


def request(inventory: Inventory) -> dict[str, Any]:
    target = dump(inventory.target)
    if inventory.host is not None:  # `{root}`: the one host's (on the local backend, this machine's)
        target = specs.on_host(target, inventory.host.root)
    return {
        "target": target,
        "stage": dump(inventory.stages.prep, exclude={"command", "stall_after"}),
        "datasets": {name: {**dump(inventory.datasets[name]), "sample": sample_of(inventory, name),
                            # the key the user wrote, for a message about a file that is not there
                            "sample_key": "sample" if inventory.datasets[name].sample else "source",
                            "limit": inventory.datasets[name].limit or 200}
                     for name in inventory.datasets},
    }


#: Validation reads only what this machine has: never a download from a hub.
OFFLINE = "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1"


def validate(inventory: Inventory, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Prep over the samples of `names` (default: every dataset), in a Python of its own."""
    asked = request(inventory)
    if names is not None:
        asked["datasets"] = {name: asked["datasets"][name] for name in names}
    # NOTE: the request goes on stdin: as one argument, a thousand datasets pass Linux's limit on an
    # argument (128 KiB) and the command is refused ("Argument list too long").
    command = f"cd {shlex.quote(str(REPO))} && {OFFLINE} {shlex.quote(sys.executable)} -m remote.prep.validate -"
    result = LocalTransport().run(command, stdin=json.dumps(asked).encode())
    try:
        return decode(result.stdout)
    except ValueError:
        from local.host.releases import check_sources  # NOTE: only here: a syntax error's file and line, which prep's
        check_sources()                       # traceback ends without (`SyntaxError: invalid syntax`)
        raise AerieError(f"inv validate could not run prep here: {(result.stderr.strip() or 'no output').splitlines()[-1]}")


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
        return str(entry["records"]), "by infer", "by infer"
    turns = f"{entry.get('assistant_turns', 0)} ({entry.get('turns_expanded', 0)})"
    learned = f"{entry.get('learned_tokens', 0)} ({entry.get('reasoning_tokens', 0)})" if entry.get("learned_tokens") else "-"
    return str(entry["records"]), turns, learned


def check(inventory: Inventory, console: Console, as_json: bool = False, cached: bool = False,
          cache: ValidationCache | None = None) -> list[dict[str, Any]]:
    """Validate and show; an `AerieError` names every dataset that would give zero records.

    `cached`: a dataset that passed with the same inputs before (see local/validation/cache.py)
    is not validated again, and is only named. Every pass is stored either way.
    """
    cache = cache or ValidationCache()
    key = keys(request(inventory))
    reused = {name: cache.get(key[name], name) for name in inventory.datasets} if cached else {}
    reused = {name: entry for name, entry in reused.items() if entry is not None}
    fresh = validate(inventory, [n for n in inventory.datasets if n not in reused]) if len(reused) < len(key) else []
    for entry in fresh:
        cache.put(key.get(entry["dataset"]), entry)
    by_name = {e["dataset"]: e for e in fresh}
    entries = [reused.get(name) or by_name[name] for name in inventory.datasets]
    if as_json:
        print(json.dumps(entries, indent=2))  # JSON escapes every control character itself
    else:
        show(console, fresh, list(reused))
    bad: dict[str, list[str]] = {}  # by reason: a thousand datasets that fail alike are one clause
    for e in visible_all([e for e in entries if e["error"] or not e["kept"]]):
        bad.setdefault(e["error"] or ", ".join(list(e["skip_reasons"])[:2]) or "no rows", []).append(e["dataset"])
    if bad:
        raise AerieError("datasets that would give zero records: " + "; ".join(
            f"{_names(names)} ({reason})" for reason, names in bad.items()))
    return entries


def show(console: Console, fresh: list[dict[str, Any]], reused: list[str]) -> None:
    """The table, the cached datasets' names, the notes and each dataset's details: every value `visible`."""
    from rich.text import Text

    if fresh:
        console.print(render(fresh))
    if reused:
        console.print(f"validated (cached): {_names(reused)} (`--revalidate` checks again)")
    for note in sorted({e["note"] for e in fresh if e.get("note")}):  # a cached entry's note was shown before
        console.print(Text.assemble(("note:", "yellow"), " ", visible(note)))
    for line in filter(None, map(details, fresh)):  # a dropped field's name is a row's key: the data's
        console.print(Text(visible(line)))


#: How each kind of `tool_declarations` reads (`remote.prep.template.tool_declaration`).
DECLARED = {"typescript": "TypeScript-style", "json": "as JSON", "other": "otherwise"}


def details(entry: dict[str, Any]) -> str | None:
    """What the table has no room for: how the rows' tools were declared, and the fields of turns prep
    dropped ("thoughts dropped in 312 turns"); None when there is neither."""
    said = []
    if entry.get("tool_declarations"):
        said.append("tools declared " + ", ".join(
            f"{DECLARED.get(kind, kind)} in {n} row{'s' * (n != 1)}" for kind, n in entry["tool_declarations"].items()))
    if entry.get("dropped_fields"):
        said.append(", ".join(f"{name} dropped in {n} turn{'s' * (n != 1)}" for name, n in entry["dropped_fields"].items()))
    return f"{entry['dataset']}: {'; '.join(said)}" if said else None


def _names(names: list[str], shown: int = 8) -> str:
    return ", ".join(names) if len(names) <= shown else f"{', '.join(names[:shown])} and {len(names) - shown} more"
