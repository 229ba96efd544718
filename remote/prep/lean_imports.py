"""What a prep process leaves out of its imports: torch, which transformers imports, and pandas, which pyarrow does.

Where torch is installed, transformers imports it with its configuration classes (through
`modeling_rope_utils`), and that import costs a prep or validate process more CPU than loading
Kimi-K2.5's tokenizer itself, though a tokenizer never calls torch. pyarrow imports pandas the first
time it builds an array, to ask whether the values are pandas objects; prep's never are. Each library
decides once whether the other is there, so each is hidden only while it decides, then shown again:
a tokenizer's own code that imports torch still gets it, and so does code that asks pyarrow for pandas.
Only for a process's entry point: in a process that also loads models (a test runner, a stage that
trains), transformers would then refuse every model.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"  # its "PyTorch was not found" is about models, not tokenizers


def import_transformers() -> bool:
    """Import transformers with torch hidden; False when it is too late (either is imported already)."""
    if "transformers" in sys.modules or "torch" in sys.modules:
        return False
    advice = os.environ.get(NO_ADVICE)
    os.environ[NO_ADVICE] = "1"
    sys.modules["torch"] = None  # type: ignore[assignment]  # importlib's find_spec then answers None
    try:
        import transformers  # noqa: F401
    finally:
        del sys.modules["torch"]
        if advice is None:
            del os.environ[NO_ADVICE]
        else:
            os.environ[NO_ADVICE] = advice
    return True


def import_pyarrow() -> bool:
    """Import pyarrow and let it look for pandas once, with pandas refused; False when pandas is imported already."""
    if "pandas" in sys.modules:
        return False
    import pyarrow as pa

    sys.meta_path.insert(0, _REFUSE_PANDAS)
    try:
        pa.array([0])  # its first array asks whether pandas is installed, and keeps the answer
    finally:
        sys.meta_path.remove(_REFUSE_PANDAS)
    return True


class _Refuse(importlib.abc.MetaPathFinder):
    """Refuses to import one package. pyarrow's compiled code would take a None in sys.modules for the module."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == self.name:
            raise ModuleNotFoundError(f"{fullname} is refused while pyarrow looks for it", name=fullname)
        return None


_REFUSE_PANDAS = _Refuse("pandas")
