"""Where the checkout and its inventories are, the rule for an environment variable's name, and
how a cache file is written, without importing the inventory's schema (pydantic): what
`inv deploy` needs at start-up."""

from __future__ import annotations

import os
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


def write_replacing(path: Path, text: str | bytes) -> None:
    """`text` (or bytes) into a name unique to this writer beside `path`, then renamed over it: a reader (or a
    concurrent `inv`) sees the old file or the new one, whole. OSError (read-only, disk full) is raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.{os.urandom(8).hex()}.tmp")
    try:
        if isinstance(text, bytes):
            temporary.write_bytes(text)
        else:
            temporary.write_text(text)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
