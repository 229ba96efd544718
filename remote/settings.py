"""Stage settings on the host have no defaults of their own.

Each setting is declared once, with its default and its doc, in the inventory's
schema (`local/inventory.py`). The workstation resolves every default there and
sends each stage's complete settings in the job's spec, so a key missing here is
a spec from an older workstation or one written by hand: the stage says which
key in one line instead of guessing a second default that would drift from the
first (train's ``max_length`` was 2048 in one place and 4096 in another).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def need(settings: dict[str, Any], stage: str, key: str, error: type[Exception] = ValueError) -> Any:
    """``settings[key]``, or `error` naming ``stages.<stage>.<key>`` when the spec lacks it."""
    try:
        return settings[key]
    except KeyError:
        raise error(f"stages.{stage}.{key} is missing from the job's settings: the workstation sends every "
                    "setting; launch the job again from an up-to-date checkout") from None


def missing(settings: dict[str, Any], stage: str, keys: list[str]) -> str | None:
    """The one-line complaint about the first of `keys` that `settings` lacks, or None."""
    absent = [key for key in keys if key not in settings]
    if not absent:
        return None
    return (f"stages.{stage}.{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing from the job's settings: "
            "the workstation sends every setting; launch the job again from an up-to-date checkout")


def typed(cls: type[T], settings: dict[str, Any], stage: str, error: type[Exception]) -> T:
    """The dataclass `cls` of `stage`'s settings, from exactly its fields; `error` names the keys the spec lacks."""
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    absent = missing(settings, stage, known)
    if absent:
        raise error(absent)
    return cls(**{k: settings[k] for k in known})
