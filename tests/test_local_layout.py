"""The workstation's side by layer (issue 31), measured from the code: a few modules at local/'s root, one
folder per layer, imports that run one way, one owner for a job's spec and its key, one form of the inventory."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "local"
ROOT_AT_MOST = 6
LONGEST_MODULE = 250
#: What each layer may import of local/ besides the root's modules (cli, console, exceptions, paths, visible).
#: The tasks' bodies sit on top; nothing imports them but tasks.py.
MAY_IMPORT = {
    "inventory": set(),
    "transport": {"inventory"},
    "host": {"inventory", "transport"},
    "jobs": {"inventory"},
    "views": set(),
    "validation": {"inventory", "jobs", "transport", "host", "views"},
    "tasks": {"inventory", "transport", "host", "jobs", "views", "validation"},
}
#: The keys of a job's spec, as the host reads them (remote/control_plane/supervisor.py, runner.py).
SPEC_KEYS = {"dataset", "stage", "command", "source", "kind", "stall_after", "log_limit", "config"}


def _modules() -> list[Path]:
    return sorted(LOCAL.glob("**/*.py"))


def _layer(path: Path) -> str:
    """The folder a module of local/ sits in; "" for the root's."""
    parts = path.relative_to(LOCAL).parts
    return parts[0] if len(parts) > 1 else ""


def _imported_layers(path: Path) -> set[str]:
    """The layers of local/ a module imports, lazy and type-checking imports too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "local" and len(parts) > 1 and (LOCAL / parts[1]).is_dir():
                found.add(parts[1])
            elif parts == ["local"] and isinstance(node, ast.ImportFrom):
                found |= {a.name for a in node.names if (LOCAL / a.name).is_dir()}
    return found


def test_at_most_six_modules_stay_at_the_root_and_every_folder_is_a_known_layer() -> None:
    loose = sorted(p.name for p in LOCAL.glob("*.py"))
    assert len(loose) <= ROOT_AT_MOST, loose
    folders = {p.name for p in LOCAL.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(MAY_IMPORT)


def test_each_layer_imports_only_the_layers_beneath_it() -> None:
    wrong = [f"{path.relative_to(REPO)} imports local.{layer}" for path in _modules() if _layer(path)
             for layer in sorted(_imported_layers(path) - MAY_IMPORT[_layer(path)] - {_layer(path)})]
    assert wrong == []


def test_the_roots_modules_import_no_layer() -> None:
    # cli, console, exceptions, paths and visible are what every layer may use: they stand beneath all.
    assert {p.name: _imported_layers(p) for p in LOCAL.glob("*.py") if _imported_layers(p)} == {}


def test_the_layers_have_no_cycle() -> None:
    # From the imports as they are (the rule above bounds them by the table; this holds the table's order too).
    graph: dict[str, set[str]] = {layer: set() for layer in MAY_IMPORT}
    for path in _modules():
        if _layer(path):
            graph[_layer(path)] |= _imported_layers(path) - {_layer(path)}

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    assert [layer for layer in graph if reaches(layer, layer)] == []


def test_no_module_of_local_is_longer_than_250_lines() -> None:
    long = {str(p.relative_to(REPO)): n for p in _modules() if (n := len(p.read_text().splitlines())) > LONGEST_MODULE}
    assert long == {}


def _spec_literals(source: str, name: str) -> list[str]:
    """Dict literals holding most of a spec's keys: where a job's spec is written out."""
    return [f"{name}:{node.lineno}" for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict)
            and len(SPEC_KEYS & {k.value for k in node.keys if isinstance(k, ast.Constant)}) >= 5]


def _hand_built_keys(source: str, name: str) -> list[str]:
    """f-strings that join two values with a lone `/`: how a `dataset/stage` key is built by hand."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            for left, middle, right in zip(node.values, node.values[1:], node.values[2:]):
                if isinstance(left, ast.FormattedValue) and isinstance(right, ast.FormattedValue) \
                        and isinstance(middle, ast.Constant) and middle.value == "/" \
                        and left.format_spec is None and right.format_spec is None:  # not `{used:,.0f}/{total:,.0f}`
                    found.append(f"{name}:{node.lineno}")
    return found


def _sites(rule: Callable[[str, str], list[str]]) -> list[str]:
    return [site for path in _modules() for site in rule(path.read_text(), str(path.relative_to(REPO)))]


def test_a_jobs_spec_is_written_as_a_literal_once_by_its_builder() -> None:
    sites = _sites(_spec_literals)
    assert len(sites) == 1 and sites[0].startswith("local/jobs/specs.py:"), sites


def test_no_job_key_is_built_by_hand_the_hosts_layout_owns_it() -> None:
    assert _sites(_hand_built_keys) == []


def test_the_rules_see_what_they_forbid() -> None:
    # Each rule, on a line of the kind local/ used to hold five or six times.
    spec = '{"dataset": d, "stage": s, "command": None, "source": "", "kind": "native", "config": {}}'
    assert _spec_literals(spec, "probe.py") == ["probe.py:1"]
    assert _hand_built_keys('key = f"{job[\'dataset\']}/{job[\'stage\']}"', "probe.py") == ["probe.py:1"]
    assert _hand_built_keys('path = f"{root}/current"', "probe.py") == []
    assert _hand_built_keys('memory = f"{used:,.0f}/{total:,.0f} GiB"', "probe.py") == []


def test_the_inventory_has_one_form() -> None:
    # The fast path reads the values the schema validated: no imitation class to fall back through.
    for path in sorted((LOCAL / "inventory").glob("*.py")):
        text = path.read_text()
        assert "__getattr__" not in text and "type: ignore" not in text, path.name


def _readme_tree() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("  local/\n")
    return text[start:text.index("```", start)]


def test_the_readmes_workstation_tree_is_the_tree() -> None:
    tree = _readme_tree()
    named = set(re.findall(r"^    ([a-z_]+/)", tree, flags=re.M))
    assert named == {f"{p.name}/" for p in LOCAL.iterdir() if (p / "__init__.py").is_file()}
    for folder in named:
        modules = {p.stem for p in (LOCAL / folder).glob("*.py")} - {"__init__"}
        missing = {m for m in modules if not re.search(rf"\b{m}\b", tree)}
        assert missing == set(), (folder, missing)
    loose = {p.name for p in LOCAL.glob("*.py")} - {"__init__.py"}
    assert {name for name in loose if name not in tree} == set()
