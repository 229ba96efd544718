"""The project's layout, measured from its own imports (issue 23): one name per idea, no
cycles, no renamed imports, benchmarks standing on their own, layers visible from the tree; and
(issue 41) the host side's modules and functions within a screen or a few."""

from __future__ import annotations

import ast
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
PROJECT = ("local", "remote", "benchmarks", "tests")
LONGEST_FUNCTION = 60
REMOTE_ROOT_AT_MOST = 10
#: The host side's limits (issue 41): a module, and a function, read without losing the thread.
REMOTE_MODULE_LINES = 350
REMOTE_FUNCTION_LINES = 50


def _files() -> list[Path]:
    return sorted(p for top in PROJECT for p in (REPO / top).glob("**/*.py")) + [REPO / "tasks.py"]


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = REPO / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(the project module a file imports, the name it binds it to when it renames it), lazy imports too."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, a.asname) for a in node.names if a.name.split(".")[0] in PROJECT]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PROJECT:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.append((full, alias.asname) if _is_module(full) else (node.module, None))
    return found


def test_no_module_name_is_used_twice_in_local_and_remote() -> None:
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "local").glob("**/*.py")) + sorted((REPO / "remote").glob("**/*.py")):
        if path.stem not in ("__init__", "__main__"):
            seen.setdefault(path.stem, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_project_module_is_imported_under_another_name() -> None:
    renamed = [f"{path.relative_to(REPO)}: {module} as {alias}" for path in _files()
               for module, alias in _imports(path) if alias and alias != module.rpartition(".")[2]]
    assert renamed == []


def test_the_project_imports_without_a_cycle() -> None:
    graph = {_module(p): {m for m, _ in _imports(p) if m != _module(p)} for p in _files()}
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


def test_benchmarks_import_nothing_from_tests() -> None:
    reached = [f"{path.relative_to(REPO)}: {module}" for path in sorted((REPO / "benchmarks").glob("**/*.py"))
               for module, _ in _imports(path) if module.split(".")[0] == "tests"]
    assert reached == []


def test_the_host_side_root_keeps_only_the_entry_points() -> None:
    # The layers live in folders (control_plane, orchestration, stages, ...); the root holds the verbs
    # and the few modules that span them.
    loose = sorted(p.name for p in (REPO / "remote").glob("*.py"))
    assert "__main__.py" in loose and len(loose) <= REMOTE_ROOT_AT_MOST, loose


def test_no_function_outside_the_tests_is_longer_than_a_screen() -> None:
    long = [f"{path.relative_to(REPO)}:{node.name} {node.end_lineno - node.lineno + 1} lines"
            for path in _files() if not path.is_relative_to(REPO / "tests")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST_FUNCTION]
    assert long == []


def _readme_tree() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("  remote/\n    __main__.py")
    return text[start:text.index("```", start)]


def test_the_readmes_host_side_tree_names_every_module_of_each_layer_and_nothing_else() -> None:
    import re

    tree = _readme_tree()
    # The entries are the cells of its columns made of folders (name/) and modules (name.py) alone.
    entry = re.compile(r"[a-z_0-9]+(/|\.py)")
    cells = [word for line in tree.splitlines()[1:] for cell in re.split(r"\s{2,}", line.strip())
             if all(entry.fullmatch(w) for w in cell.split(" ")) for word in cell.split(" ")]
    named = {word.rstrip("/").removesuffix(".py") for word in cells}
    folders = {p.name for p in (REPO / "remote").iterdir() if (p / "__init__.py").is_file()}
    loose = {p.stem for p in (REPO / "remote").glob("*.py")} - {"__init__"}
    assert named == folders | loose
    # The layers it lists module by module are exactly what their folders hold.
    for layer in ("control_plane", "orchestration"):
        modules = {p.stem for p in (REPO / "remote" / layer).glob("*.py")} - {"__init__"}
        missing = {m for m in modules if not re.search(rf"\b{m}\b", tree)}
        assert missing == set(), (layer, missing)


def _oversized(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        text = path.read_text()
        if len(text.splitlines()) > REMOTE_MODULE_LINES:
            found.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        found += [f"{path.relative_to(REPO)}:{node.name} {node.end_lineno - node.lineno + 1} lines"
                  for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > REMOTE_FUNCTION_LINES]
    return found


def test_no_host_side_module_is_over_350_lines_nor_a_function_over_50() -> None:
    assert _oversized(sorted((REPO / "remote").glob("**/*.py"))) == []


def test_the_workstation_imports_nothing_of_the_host_side_outside_its_shared_vocabulary() -> None:
    reached = [f"{path.relative_to(REPO)}: {module}"
               for path in sorted((REPO / "local").glob("**/*.py")) + [REPO / "tasks.py"]
               for module, _ in _imports(path)
               if module.split(".")[0] == "remote" and not module.startswith("remote.vocabulary")]
    assert reached == []


def test_the_shared_vocabulary_imports_only_itself_and_the_standard_library() -> None:
    import sys

    outside = []
    for path in sorted((REPO / "remote" / "vocabulary").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            outside += [f"{path.relative_to(REPO)}: {name}" for name in names
                        if not name.startswith("remote.vocabulary") and name.split(".")[0] not in sys.stdlib_module_names
                        and name != "__future__"]
    assert outside == []


def test_the_release_agent_spells_the_manifest_s_name_as_the_layout_does() -> None:
    # release.py is sent as source and run on its own, so it cannot import the layout.
    from remote.control_plane import release
    from remote.vocabulary import layout

    assert release.MANIFEST == layout.RELEASE_MANIFEST
