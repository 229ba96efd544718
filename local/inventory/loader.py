"""Inventories validated once, then read back without YAML or pydantic.

Importing pydantic and building the inventory's schema is about a fifth of what `inv deploy`
costs as typed. An inventory that validated is kept under .aerie/cache/inventory/, keyed by its
file's bytes and path, the checkout, and the code that makes a file an inventory; while they are
unchanged, `load` reads it back: the same `Inventory`, with the same values, that the schema gave.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from local.paths import REPO, resolve_path, write_replacing

if TYPE_CHECKING:
    from local.inventory.values import Inventory

CACHE = REPO / ".aerie" / "cache" / "inventory"
#: What decides how a file becomes an inventory: the values and their defaults, the schema, `load`'s rules.
SCHEMA_CODE = (*sorted((REPO / "local" / "inventory").glob("*.py")), REPO / "local" / "paths.py")


def load(name_or_path: str, cache: Path = CACHE) -> Inventory:
    """`local.inventory.schema.load`, validated once per version of the file and of the schema."""
    path = resolve_path(name_or_path)
    try:
        key = _key(path)
    except OSError:  # a missing file: the full load says so in one line
        key = None
    stored = None if key is None else _read(cache / f"{key}.pickle")
    if stored is not None:
        stored.path = path  # where it is read from this time: the same file, perhaps named another way
        return stored
    from local.inventory import schema  # NOTE: pydantic and YAML, only for a file not validated yet

    inventory = schema.load(name_or_path)
    if key is not None:
        _write(cache / f"{key}.pickle", key, inventory)
    return inventory


def _key(path: Path) -> str:
    digest = hashlib.sha256(f"{path.resolve()}\0{REPO}\0".encode() + path.read_bytes())
    for code in SCHEMA_CODE:
        digest.update(b"\0" + code.read_bytes())
    return digest.hexdigest()


# NOTE: pickle, which runs what the file says, is acceptable here: the cache lives in this checkout's own
# .aerie/, written by this user's aerie. Whatever could rewrite it could as well rewrite tasks.py.
def _read(file: Path) -> Inventory | None:
    import pickle  # NOTE: here, as the values' classes, not with tasks.py: `inv --list` reads no inventory

    from local.inventory.values import Inventory

    try:
        key, inventory = pickle.loads(file.read_bytes())
    except Exception:  # NOTE: missing, truncated or corrupt (any of pickle's errors): one full load, never the task
        return None
    return inventory if key == file.stem and isinstance(inventory, Inventory) else None


def _write(file: Path, key: str, inventory: Inventory) -> None:
    import pickle

    try:
        write_replacing(file, pickle.dumps((key, inventory), protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # a read-only checkout validates every time, as before
