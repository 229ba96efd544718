"""The suite's own layout, read from the ast: what several test modules share lives in one place."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def defined_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}


def test_no_test_module_imports_another_test_module() -> None:
    importers = {}
    for path in sorted(TESTS.rglob("*.py")):
        others = {name for name in imported_modules(path) if name.split(".")[-1].startswith("test_")
                  and name.startswith("tests.")}
        if others:
            importers[path.relative_to(TESTS).as_posix()] = sorted(others)
    assert not importers, f"move what they share into tests/helpers/: {importers}"


def test_the_bench_fixture_is_defined_once_in_conftest() -> None:
    defining = sorted(path.relative_to(TESTS).as_posix() for path in TESTS.rglob("*.py") if "bench" in defined_functions(path))
    assert defining == ["conftest.py"], defining
