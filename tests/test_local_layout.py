"""The workstation's modules, measured from their imports: one name per idea, no cycles, no aliases."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = ("local", "remote", "benchmarks", "tests")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _workstation_files() -> list[Path]:
    return sorted((REPO / "local").glob("**/*.py")) + [REPO / "tasks.py"]


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(the project module a file imports, the name it binds it to when it renames it), lazy imports too."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, a.asname) for a in node.names if a.name.split(".")[0] in PROJECT]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (REPO / (full.replace(".", "/") + ".py")).is_file()
                found.append((full, alias.asname) if is_module else (node.module, None))
    return found


def test_no_workstation_module_shares_its_name_with_a_host_module() -> None:
    ignored = {"__init__", "__main__"}
    local = {p.stem for p in (REPO / "local").glob("**/*.py")} - ignored
    remote = {p.stem for p in (REPO / "remote").glob("**/*.py")} - ignored
    assert sorted(local & remote) == []


def test_no_project_module_is_imported_under_another_name_on_the_workstation() -> None:
    renamed = [f"{path.relative_to(REPO)}: {module} as {alias}"
               for path in _workstation_files() for module, alias in _imports(path) if alias]
    assert renamed == []


def test_the_workstation_modules_import_each_other_without_a_cycle() -> None:
    graph = {_module(p): {m for m, _ in _imports(p) if m.startswith("local.")} for p in _workstation_files()}
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            found = cycle_from(imported, path + [module])
            if found:
                return found
        done.add(module)
        return None

    assert [c for c in (cycle_from(m, []) for m in sorted(graph)) if c] == []
