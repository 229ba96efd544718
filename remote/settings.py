"""Stage settings on the host have no defaults of their own.

Each setting is declared once, with its default and its doc, in the inventory's
schema (`local/inventory/stages.py`). The workstation resolves every default there and
sends each stage's complete settings in the job's spec, so a key missing here is
a spec from an older workstation or one written by hand: the stage says which
key in one line instead of guessing a second default that would drift from the
first (train's ``max_length`` was 2048 in one place and 4096 in another).

Every stage reads its settings the same way: a frozen dataclass of them
(`remote.prep.prep_settings`, `remote.infer.infer_settings`,
`remote.eagle3.extract_settings`, `remote.eagle3.train_settings`,
`remote.eval.eval_settings`) built by `typed`, which gives each value the type
its field declares; the class checks what a type cannot say (ranges, choices).
tests/test_settings.py holds every stage to it.
"""

from __future__ import annotations

import types
from dataclasses import fields
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
#: The declared types a value is converted to; any other (str, `int | str`, Any) is taken as sent.
CONVERTED = (int, float, list, dict)


def typed(cls: type[T], settings: dict[str, Any], stage: str, error: type[Exception]) -> T:
    """The dataclass `cls` of `stage`'s settings, from exactly its fields (other keys are the supervisor's or another
    class's), each of the type its field declares; `error` is one line naming every ``stages.<stage>.<key>`` the
    spec lacks, or the first that is not of its type."""
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    absent = [key for key in known if key not in settings]
    if absent:
        raise error(f"stages.{stage}.{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing from the job's "
                    "settings: the workstation sends every setting; launch the job again from an up-to-date checkout")
    hints = get_type_hints(cls)
    return cls(**{k: _as_declared(hints[k], settings[k], f"stages.{stage}.{k}", error) for k in known})


def _as_declared(kind: Any, value: Any, key: str, error: type[Exception]) -> Any:
    """`value` as `kind` (``int``, ``float``, ``list[...]``, ``dict[...]``, each maybe ``| None``): "2" is 2, 1 is 1.0."""
    if get_origin(kind) in (Union, types.UnionType):
        options = [k for k in get_args(kind) if k is not type(None)]
        if value is None and len(options) < len(get_args(kind)):
            return None
        if len(options) != 1:
            return value  # e.g. infer's concurrency, `auto` or a number: its class checks it
        kind = options[0]
    make = get_origin(kind) or kind
    if make not in CONVERTED or isinstance(value, bool):
        return value  # a bool is never taken for a number: the class refuses it
    if make in (list, dict):
        if not isinstance(value, make):
            raise error(f"{key} {value!r}: expected a {make.__name__}")
        return make(value)
    try:
        converted = make(value)
    except (TypeError, ValueError):
        converted = None
    # NOTE: never a silent truncation: 2.5 is not an int.
    if converted is None or (make is int and isinstance(value, float) and value != converted):
        raise error(f"{key} {value!r}: expected {'an integer' if make is int else 'a number'}")
    return converted
