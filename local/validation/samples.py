"""`inv validate`: the prep code over each dataset's local sample, on this machine, before any deploy.

Runs ``python -m remote.prep.validate`` from the checkout (the same command line and
JSON as on the host) and fails on every dataset that would give zero records: the
bug that lost three of ten datasets.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING, Any

from local.jobs import specs
from local.exceptions import AerieError
from local.validation.cache import ValidationCache, keys
from local.views import validation_table
from local.visible import visible_all
from local.paths import INVENTORIES, REPO
from local.transport.protocol import LocalTransport
from remote.vocabulary.hints import TEACH_A_FAMILY
from remote.vocabulary.wire import decode

if TYPE_CHECKING:
    from rich.console import Console

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
    root = inventory.host.root if inventory.host is not None else None  # the one host's (local: this machine's)
    return {
        "target": specs.dumped(inventory.target, root),
        "stage": specs.stage_settings(inventory.stages.prep, None),
        "datasets": {name: {**specs.dataset_entry(inventory, name), "sample": sample_of(inventory, name),
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


def through_cache(inventory: Inventory, cached: bool = True, cache: ValidationCache | None = None
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every dataset's entry, in the inventory's order; the fresh ones; the reused ones by name.

    `cached`: a dataset that passed with the same inputs before (see local/validation/cache.py)
    is not validated again. Every pass is stored either way.
    """
    cache = cache or ValidationCache()
    key = keys(request(inventory))
    reused = {name: cache.get(key[name], name) for name in inventory.datasets} if cached else {}
    reused = {name: entry for name, entry in reused.items() if entry is not None}
    fresh = validate(inventory, [n for n in inventory.datasets if n not in reused]) if len(reused) < len(key) else []
    for entry in fresh:
        cache.put(key.get(entry["dataset"]), entry)
    by_name = {e["dataset"]: e for e in fresh}
    return [reused.get(name) or by_name[name] for name in inventory.datasets], fresh, reused


def check(inventory: Inventory, console: Console, as_json: bool = False, cached: bool = False,
          cache: ValidationCache | None = None) -> list[dict[str, Any]]:
    """Validate and show; an `AerieError` names every dataset that would give zero records.

    `cached`: a dataset that passed with the same inputs before is not validated again, and is only named.
    """
    entries, fresh, reused = through_cache(inventory, cached, cache)
    if as_json:
        print(json.dumps(entries, indent=2))  # JSON escapes every control character itself
    else:
        validation_table.show(console, fresh, list(reused))
    bad: dict[str, list[str]] = {}  # by reason: a thousand datasets that fail alike are one clause
    for e in visible_all([e for e in entries if e["error"] or not e["kept"]]):
        bad.setdefault(e["error"] or ", ".join(list(e["skip_reasons"])[:2]) or "no rows", []).append(e["dataset"])
    if bad:
        raise AerieError("datasets that would give zero records: " + "; ".join(
            f"{validation_table.names_text(names)} ({reason})" for reason, names in bad.items()) + f". {TEACH_A_FAMILY}")
    return entries
