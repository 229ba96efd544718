"""Stage settings on the host have no defaults of their own.

Each setting is declared once, with its default and its doc, in the inventory's
schema (`local/inventory.py`). The workstation resolves every default there and
sends each stage's complete settings in the job's spec, so a key missing here is
a spec from an older workstation or one written by hand: the stage says which
key in one line instead of guessing a second default that would drift from the
first (train's ``max_length`` was 2048 in one place and 4096 in another).

Every stage reads its settings the same way: a frozen dataclass of them
(`remote.prep.prep_settings`, `remote.infer.infer_settings`,
`remote.eagle3.extract_settings`, `remote.eagle3.train_settings`,
`remote.eval.eval_settings`) built by `typed`, each value given its type once
there; tests/test_settings.py holds every stage to it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def typed(cls: type[T], settings: dict[str, Any], stage: str, error: type[Exception]) -> T:
    """The dataclass `cls` of `stage`'s settings, from exactly its fields (other keys are the supervisor's or another
    class's); `error` is one line naming every ``stages.<stage>.<key>`` the spec lacks."""
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    absent = [key for key in known if key not in settings]
    if absent:
        raise error(f"stages.{stage}.{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing from the job's "
                    "settings: the workstation sends every setting; launch the job again from an up-to-date checkout")
    return cls(**{k: settings[k] for k in known})
