"""The host's layout and names, each known in one place, measured from the source's syntax trees.

- Paths under the root (``<root>/jobs``, ``<root>/data``) are built by `remote.vocabulary.layout`
  alone: no other module joins the literal ``"jobs"`` or ``"data"`` into a path.
- The pseudo jobs of `inv run` (``pipeline/run``, ``draft/...``) are named once, in
  `remote.vocabulary.states`: nowhere else, on either side, is ``"pipeline"`` spelled, nor
  ``"draft"`` or ``"run"`` used as a job's dataset or stage.
- The control plane imports nothing of `remote` outside itself and the shared vocabulary (`remote.vocabulary`), so that it runs under ``python -S``
  on a host where nothing is installed.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable

from remote.vocabulary import layout

REPO = Path(__file__).resolve().parents[1]
LAYOUT = REPO / "remote" / "vocabulary" / "layout.py"
STATES = REPO / "remote" / "vocabulary" / "states.py"
#: Sent to the host as source text and run on its own (local/host/verbs.py), so it cannot import the layout:
#: its own spelling is checked against the layout's below instead.
RELEASE = REPO / "remote" / "control_plane" / "release.py"

ROOT_DIRS = {layout.JOBS, layout.DATA}
JOB_FILES = {layout.STATE, layout.SPEC, layout.PROGRESS, layout.LOG, layout.LOCK, layout.STOP, layout.SCRIPT,
             layout.SERVER_RECORD, layout.SERVER_LOG}
#: The modules that read and write jobs' files. A stage's files are its own (eval's server.json in its
#: output, the chunked route's state.json), and not the job store's.
JOB_FILE_USERS = ("remote/control_plane/", "remote/orchestration/runner.py", "remote/__main__.py")
PATH_CALLS = {"Path", "PurePath", "PurePosixPath", "join", "joinpath"}
#: Calls whose arguments name a job's dataset and stage (or a key of them).
JOB_CALLS = {"job_dir", "directory", "key_dir", "output_dir", "data_dir", "job_key", "stage"}
JOB_FIELDS = {"dataset", "stage"}


def _remote_files() -> list[Path]:
    return sorted((REPO / "remote").glob("**/*.py"))


def _both_sides() -> list[Path]:
    return _remote_files() + sorted((REPO / "local").glob("**/*.py")) + [REPO / "tasks.py"]


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}: {ast.unparse(node)[:100]}"


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(path: Path) -> list[tuple[ast.Constant, dict[int, ast.AST]]]:
    """Every string literal of the file's code (docstrings left out), with the tree's parents."""
    tree = ast.parse(path.read_text())
    parents, docs = _parents(tree), _docstrings(tree)
    return [(node, parents) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _names_a_root_dir(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """The literal joins ``jobs`` or ``data`` into a path: ``x / "jobs"``, ``Path("data")``,
    ``os.path.join(root, "jobs")``, or a ``"jobs/..."`` string joined as one."""
    value = node.value
    if value not in ROOT_DIRS and not any(value.startswith(f"{d}/") or f"/{d}/" in value for d in ROOT_DIRS):
        return False
    parent = parents.get(id(node))
    if isinstance(parent, ast.JoinedStr):
        return True  # f"{root}/data/{name}"
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        return True
    return isinstance(parent, ast.Call) and node in parent.args and _call_name(parent) in PATH_CALLS


def _names_a_job_file(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """The literal is one of a job's files, joined into a path (``directory / "state.json"``)."""
    parent = parents.get(id(node))
    if node.value not in JOB_FILES:
        return False
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div):
        return True
    return isinstance(parent, ast.Call) and node in parent.args and _call_name(parent) in PATH_CALLS | {"with_name"}


def _names_a_job(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """The literal is used as a job's dataset or stage: compared (``job["dataset"] == "draft"``,
    ``(d, s) == (RUNNER, "run")``), given as one (``"stage": "run"``, ``dataset="draft"``) or passed
    to a call that builds a job's path or key (``job_dir(root, "pipeline", "run")``)."""
    child, parent = node, parents.get(id(node))
    while isinstance(parent, (ast.Tuple, ast.List)):
        child, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.Compare):
        return True
    if isinstance(parent, ast.Dict):
        index = next((i for i, v in enumerate(parent.values) if v is child), None)
        key = parent.keys[index] if index is not None else None
        return isinstance(key, ast.Constant) and key.value in JOB_FIELDS
    if isinstance(parent, ast.keyword):
        return parent.arg in JOB_FIELDS
    return isinstance(parent, ast.Call) and child in parent.args and _call_name(parent) in JOB_CALLS


def test_only_the_layout_module_builds_paths_under_the_root() -> None:
    built = [_where(path, node) for path in _remote_files() if path not in (LAYOUT, RELEASE)
             for node, parents in _strings(path) if _names_a_root_dir(node, parents)]
    assert built == []


def test_only_the_layout_module_names_a_job_s_files() -> None:
    users = [p for p in _remote_files() if str(p.relative_to(REPO)).startswith(JOB_FILE_USERS) and p not in (LAYOUT, RELEASE)]
    assert len(users) > 10
    named = [_where(path, node) for path in users for node, parents in _strings(path) if _names_a_job_file(node, parents)]
    assert named == []


def test_the_workstation_names_the_host_s_paths_through_the_layout_too() -> None:
    files = sorted((REPO / "local").glob("**/*.py")) + [REPO / "tasks.py"]
    built = [_where(path, node) for path in files for node, parents in _strings(path) if _names_a_root_dir(node, parents)]
    assert built == []


def test_the_standalone_release_agent_spells_the_layout_as_the_layout_module_does() -> None:
    # release.py runs on the host before anything is deployed, so it keeps its own spelling of the
    # job store (to find the releases running jobs use); it must be the layout's.
    tree = ast.parse(RELEASE.read_text())
    literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert {layout.JOBS, layout.STATE} <= literals
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                and any(name.startswith("remote") for name in _imported(n))]


def test_the_pseudo_jobs_are_named_once_on_both_sides() -> None:
    spelled = []
    for path in _both_sides():
        if path == STATES:
            continue
        for node, parents in _strings(path):
            value = node.value
            if value == "pipeline" or value.startswith(("pipeline/", "draft/")):
                spelled.append(_where(path, node))  # the runner's dataset, or a key of a pseudo job
            elif value in ("draft", "run") and _names_a_job(node, parents):
                spelled.append(_where(path, node))
    assert spelled == []


def test_the_rules_above_catch_what_they_are_meant_to() -> None:
    # The checks themselves, on the spellings this layout replaced: each must be found.
    def found(source: str, rule: Callable[[ast.Constant, dict[int, ast.AST]], bool]) -> bool:
        tree = ast.parse(source)
        parents = _parents(tree)
        return any(rule(n, parents) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))

    for source in ('root / "jobs" / key', 'Path("data") / d', 'os.path.join(root, "jobs")', 'f"{root}/data/{name}"'):
        assert found(source, _names_a_root_dir), source
    for source in ('directory / "state.json"', 'record.with_name("server.log")', 'os.path.join(jobs, "spec.json")'):
        assert found(source, _names_a_job_file), source
    for source in ('job["dataset"] == "draft"', '(j["dataset"], j["stage"]) == (RUNNER, "run")', '{"stage": "run"}',
                   'job_dir(root, "pipeline", "run")', 'self.stage("train", s, data, inputs, "draft")'):
        assert found(source, _names_a_job), source
    for source in ('ctx.output / "draft"', 'settings["draft"]', '{"draft": str(out)}', 'VERBS = {"run": run}',
                   'status.get("jobs", [])', '{"jobs": jobs}'):
        assert not found(source, _names_a_job) and not found(source, _names_a_root_dir), source


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import names (`from remote import server`: remote.server), absolute ones only."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []
    return [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "remote" else [node.module]


def test_the_control_plane_imports_nothing_of_remote_outside_itself_and_the_shared_vocabulary() -> None:
    outside = set()
    for path in sorted((REPO / "remote" / "control_plane").glob("*.py")) + sorted((REPO / "remote" / "vocabulary").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(node):
                    if name.split(".")[0] == "remote" and not name.startswith(("remote.control_plane", "remote.vocabulary")):
                        outside.add((str(path.relative_to(REPO)), name))
    assert outside == set()
