"""transformers imported as if torch were not installed, for a process that only tokenises.

Where torch is installed, transformers imports it with its configuration classes (through
`modeling_rope_utils`), and that import costs a prep or validate process more CPU than loading
Kimi-K2.5's tokenizer itself, though a tokenizer never calls torch. transformers decides once
whether torch is there (`is_torch_available` is cached), so torch is hidden only while transformers
itself is imported, then shown again: a tokenizer's remote code that imports torch still gets it.
"""

from __future__ import annotations

import os
import sys

NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"  # its "PyTorch was not found" is about models, not tokenizers


def import_transformers() -> bool:
    """Import transformers with torch hidden; False when it is too late (either is imported already).

    Only for a process's entry point: in a process that also loads models (a test runner, a stage
    that trains), transformers would then refuse every model.
    """
    if "transformers" in sys.modules or "torch" in sys.modules:
        return False
    advice = os.environ.get(NO_ADVICE)
    sys.modules["torch"] = None  # type: ignore[assignment]  # importlib's find_spec then answers None
    os.environ[NO_ADVICE] = "1"
    try:
        import transformers  # noqa: F401
    finally:
        del sys.modules["torch"]
        if advice is None:
            del os.environ[NO_ADVICE]
        else:
            os.environ[NO_ADVICE] = advice
    return True
