"""A field's own checks: what the schema's validation runs on it besides its type and limits.

Each raises ValueError with the user's message; pydantic reports it at the field's key.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A dataset name becomes a directory on the host and a word in its commands: a safe identifier only.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DATASET_NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit, at most 64"
#: The key of one draft that `stages.eval.drafts` replaced; an inventory that gives it is told so.
REPLACED_BY_DRAFTS = "draft"


class Check:
    """A field's own check, run by the schema's validation `mode` ("before", "after" or "wrap") its type's:
    ``Annotated[int, Check(size_in_bytes, "before")]``. It raises ValueError with the user's message."""

    def __init__(self, function: Callable[..., Any], mode: str = "after") -> None:
        self.function, self.mode = function, mode

    def __get_pydantic_core_schema__(self, source: Any, handler: Callable[[Any], Any]) -> Any:
        from pydantic_core import core_schema  # NOTE: only while a file is validated (local.inventory.schema)

        validators = {"before": core_schema.no_info_before_validator_function,
                      "after": core_schema.no_info_after_validator_function,
                      "wrap": core_schema.no_info_wrap_validator_function}
        return validators[self.mode](self.function, handler(source))


def size_in_bytes(value: Any) -> Any:
    """`256M`, `2G`, `512K`, `1T` (powers of 1024) as bytes; a number as it is."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", value, re.IGNORECASE)
        if not match:
            raise ValueError("expected bytes or a size such as 256M or 2G")
        return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))
    return value


def auto_or_count(value: Any) -> Any:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("expected auto or a whole number of requests >= 1")


def draft_names(drafts: dict[str, str] | None) -> dict[str, str] | None:
    # A name becomes a key of the report and part of a log's file name, as a dataset's does.
    if drafts == {}:
        raise ValueError("name at least one draft, or leave `drafts` unset to compare train's own")
    for name, path in (drafts or {}).items():
        if not DATASET_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a draft name: use {DATASET_NAME_RULE} characters")
        if not path.strip():
            raise ValueError(f"{name}: the draft's path is empty")
    return drafts


def one_way_to_name_a_draft(data: Any) -> Any:
    """Before `stages.eval` is read key by key: its old key is named as such, not as one more unknown key."""
    if isinstance(data, dict) and REPLACED_BY_DRAFTS in data:
        raise ValueError("`draft` is now `drafts`, by name: write `drafts: {draft: PATH}` instead "
                         "(and name more drafts there to compare them)")
    return data


def inside_the_checkout(paths: list[str]) -> list[str]:
    for path in paths:
        parts = Path(path).parts
        if not parts or Path(path).is_absolute() or ".." in parts or parts[0] in (".git", ".venv", ".aerie"):
            raise ValueError(f"{path!r} is not a path inside the checkout: give it relative to the checkout, "
                             "without '..', not the whole checkout nor .git, .venv or .aerie (e.g. scripts)")
    return paths
