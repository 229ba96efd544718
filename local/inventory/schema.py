"""Inventories: YAML files that say where the host is and what runs there.

Validated on load into the values of `local.inventory.values`; a mistake is reported as
``file: key: what was expected``, never as a traceback.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml
from pydantic import TypeAdapter, ValidationError

from local.exceptions import AerieError
from local.inventory.secret_values import SECRET_KEYS, masked
from local.inventory.values import Inventory
from local.paths import INVENTORIES, REPO, resolve_path  # noqa: F401 (REPO: also this module's API)


@cache
def _adapter() -> TypeAdapter[Inventory]:
    # NOTE: built on first use, not at import: a command that never validates a file never pays for it.
    return TypeAdapter(Inventory)


def validate(raw: Any) -> Inventory:
    """`raw` (a file's mapping) as an inventory; pydantic's ValidationError for a mistake."""
    return _adapter().validate_python(raw)


def load(name_or_path: str) -> Inventory:
    path = resolve_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        known = ", ".join(sorted(p.stem for p in INVENTORIES.glob("*.yaml")))
        raise AerieError(f"no inventory {name_or_path!r} ({path}): use one of {known} or a path to a YAML file")
    except yaml.YAMLError as exc:
        raise AerieError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}")
    if not isinstance(raw, dict):
        raise AerieError(f"{path}: expected a mapping of keys (backend, host, datasets, ...)")
    try:
        inventory = validate(raw)
    except ValidationError as exc:
        raise AerieError(f"{path}: " + "; ".join(_describe(e) for e in exc.errors()))
    inventory.path = path
    if inventory.host is not None and not inventory.host.address:
        # Relative paths of this machine are the checkout's: the root (git-ignored), the venv.
        inventory.host.root = str((REPO / inventory.host.root).resolve())
        if "/" in inventory.host.python and not Path(inventory.host.python).is_absolute():
            inventory.host.python = str(REPO / inventory.host.python)
    return inventory


def _describe(error: Any) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "unexpected_keyword_argument":
        return _unknown_key(error["loc"])
    if error["type"] == "missing":
        return f"{key}: missing (required)"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "dataclass_type":  # the words users have read for a mapping that is not one
        message = f"Input should be a valid dictionary or instance of {error['ctx']['class_name']}"
    return f"{key}: {message} (got {_shown(error['loc'], error['input'])!r})" if error["loc"] else message


def _shown(location: tuple[Any, ...], given: Any) -> Any:
    """What a refusal quotes of the input: never a value that may be a secret (an environment's, a webhook)."""
    if SECRET_KEYS & {str(part) for part in location}:
        return masked(given, "env")
    return masked(given)


def _unknown_key(location: tuple[Any, ...]) -> str:
    known = ", ".join(f.name for f in fields(_class_at(location[:-1])) if f.init)
    return f"{'.'.join(str(part) for part in location)}: unknown key (expected one of: {known})"


def _class_at(location: tuple[Any, ...]) -> type:
    """The value class that validates the mapping at `location`, to list the keys it knows."""
    cls: type = Inventory
    parts = iter(location)
    for part in parts:
        annotation = get_type_hints(cls).get(str(part))
        if annotation is None:
            break
        inner = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and is_dataclass(a)]
        if get_origin(annotation) is dict:  # e.g. datasets.<name>: the next part is a name
            cls = get_args(annotation)[1]
            next(parts, None)
        elif inner:
            cls = inner[0]
    return cls
