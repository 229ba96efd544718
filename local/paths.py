"""Where the checkout and its inventories are, and the rule for an environment variable's name,
without importing the inventory's schema (pydantic): what `inv deploy` needs at start-up."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INVENTORIES = REPO / "inventories"
#: An environment variable's name, as a shell takes it in `NAME=value command`.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def resolve_path(name_or_path: str) -> Path:
    """`local` means inventories/local.yaml; anything with a slash or .yaml is a path."""
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        return Path(name_or_path).expanduser()
    return INVENTORIES / f"{name_or_path}.yaml"
