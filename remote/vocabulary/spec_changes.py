"""What differs between a job's spec as it last ran and the one a rerun brings: the settings a user
edited in the inventory since, told back so that a rerun says what it runs with, and what makes a
succeeded job out of date (`remote.control_plane.freshness`).

Standard library only (the control plane's rule). The workstation names each path as an inventory
key (`local.jobs.specs.inventory_key`); here a change is only ``[path, before, after]``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any

#: Keys the host adds to a queued spec for its own bookkeeping (its place in the queue, the pipeline
#: it belongs to, the server it starts, which repeats the infer stage's settings): not settings.
BOOKKEEPING = frozenset({"after", "order", "built_from", "server"})
#: A rerun says at most this many changes per job (a whole new target would list every key).
LIMIT = 20


def fingerprint(spec: dict[str, Any]) -> str:
    """A short hash of the spec's settings (all but `BOOKKEEPING`), the same on both sides for the same settings:
    `inv status` compares a job's with that of the spec the inventory builds now.
    NOTE: a CRC, not a cryptographic hash: it tells an edit from none (nobody forges a spec against it),
    and zlib costs `inv status` a tenth of what hashlib's OpenSSL does to import."""
    import json
    import zlib

    settings = {k: v for k, v in spec.items() if k not in BOOKKEEPING}
    return f"{zlib.crc32(json.dumps(settings, sort_keys=True, separators=(',', ':')).encode()):08x}"


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[list[Any]]:
    """``[path, before, after]`` per setting that differs, lists compared whole; None for a key one lacks."""
    found: list[list[Any]] = []
    _walk([], {k: v for k, v in before.items() if k not in BOOKKEEPING},
          {k: v for k, v in after.items() if k not in BOOKKEEPING}, found)
    return found[:LIMIT]


def _walk(path: list[str], before: Any, after: Any, found: list[list[Any]]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            _walk([*path, str(key)], before.get(key), after.get(key), found)
    elif before != after:
        found.append([path, before, after])
