"""Validation results kept on this machine, keyed by a hash of everything they depend on.

`inv deploy` validates every dataset first (prep over its local sample, which costs
seconds: Python, transformers, the tokenizer). A dataset whose key is unchanged
since it last passed is not validated again. Its key hashes:

- the sample's bytes (a sample that is not a local file is never cached);
- prep's code: every file under remote/prep/, and every `remote` module that
  remote.prep.validate imports, found by reading the import statements;
- the tokenizer: its local files, or its hub id and the commit the local
  Hugging Face cache holds for it;
- the settings that reach prep (target, stages.prep) and the dataset's entry;
- this Python and the versions of the packages prep runs on.

Entries are JSON files under .aerie/cache/validate/, written to a unique name and
renamed. Only passes are kept: a dataset that fails is validated every time. A file
that does not read back as an entry is ignored, and replaced when it passes again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from local.paths import REPO, write_replacing

CACHE = REPO / ".aerie" / "cache" / "validate"
PREP = "remote/prep"
ENTRY = "remote/prep/validate.py"
#: Files this large are hashed by size and mtime: a tokenizer folder may be the model's, with its weights.
CONTENT_LIMIT = 16 << 20
#: The packages whose version can change what prep makes of a sample.
PACKAGES = ("transformers", "tokenizers", "tiktoken", "jinja2", "numpy", "pyarrow", "datasets")


def keys(request: dict[str, Any], repo: Path = REPO) -> dict[str, str | None]:
    """Each dataset's key (None: not cacheable) for a `remote.prep.validate` request."""
    shared = {
        "code": code_digest(repo),
        "runtime": runtime_digest(),
        "target": request["target"],
        "tokenizer": tokenizer_digest(request["target"], repo),
        "stage": request["stage"],
    }
    result: dict[str, str | None] = {}
    for name, dataset in request["datasets"].items():
        sample = Path(dataset.get("sample") or "")
        if not sample.is_file():
            result[name] = None  # a hub id read from this machine's cache: no bytes to hash
            continue
        document = {**shared, "name": name, "dataset": dataset, "sample": _file_digest(sample)}
        result[name] = hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()
    return result


def code_digest(repo: Path = REPO) -> str:
    """Every file under remote/prep/ and every repo module remote.prep.validate reaches, hashed."""
    digest = hashlib.sha256()
    for path in sorted(prep_code(repo)):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def prep_code(repo: Path = REPO) -> set[Path]:
    files = {p for p in (repo / PREP).rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    reached, pending = {repo / ENTRY}, [repo / ENTRY]
    while pending:
        for module in _remote_imports(pending.pop(), repo):
            found = _module_file(module, repo)
            for file in [*_package_inits(module, repo), *([found] if found else [])]:
                if file not in reached:
                    reached.add(file)
                    pending.append(file)
    return files | reached


#: Import statements, anywhere in a file (inside functions too); parenthesised name lists may span lines.
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)|import[ \t]+([^\n#]+))", re.M)


def _remote_imports(path: Path, repo: Path) -> set[str]:
    """The `remote...` modules a file imports, absolute or relative.

    NOTE: a regular expression, not `ast`: parsing and walking prep's modules cost more than
    the rest of a cached validation. It may over-match (an import in a docstring), which
    only adds a file to the hash.
    """
    package = path.relative_to(repo).with_suffix("").parts[:-1]
    names: set[str] = set()
    for source, imported, plain in IMPORT.findall(path.read_text(errors="replace")):
        if plain:
            names |= {part.split()[0] for part in plain.split(",") if part.strip()}
            continue
        dots = len(source) - len(source.lstrip("."))
        base = ".".join([*package[: len(package) - dots + 1], source.lstrip(".")] if dots else [source]).strip(".")
        names.add(base)
        names |= {f"{base}.{part.split()[0]}" for part in imported.strip("()").replace("\\", " ").split(",") if part.strip()}
    return {n for n in names if n == "remote" or n.startswith("remote.")}


def _module_file(module: str, repo: Path) -> Path | None:
    base = repo.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_inits(module: str, repo: Path) -> list[Path]:
    parts = module.split(".")
    inits = [repo.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    return [p for p in inits if p.is_file()]


def tokenizer_digest(target: dict[str, Any], repo: Path = REPO) -> str:
    """The tokenizer's files here, or its hub id with the commit this machine's cache holds."""
    name = target.get("tokenizer") or target.get("model")  # as remote.prep.prep_settings.Target chooses
    if not name:
        return "none"
    path = Path(name).expanduser()
    path = path if path.is_absolute() else repo / path  # validation runs from the checkout
    if path.is_file():
        return _file_digest(path)
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(file.relative_to(path).as_posix().encode() + b"\0" + _file_digest(file).encode())
        return digest.hexdigest()
    return f"hub:{name}@{_hub_commit(name)}"


def _hub_commit(repo_id: str) -> str:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    refs = Path(hub) / f"models--{repo_id.replace('/', '--')}" / "refs" / "main"
    try:
        return refs.read_text().strip()
    except OSError:
        return "absent"  # then validation says tokens were not counted; a later download changes the key


def runtime_digest() -> str:
    """This Python, and the installed versions (dist-info names) of the packages prep runs on."""
    installed = []
    for entry in sys.path:
        if entry.endswith("-packages") and os.path.isdir(entry):
            installed += [name for name in os.listdir(entry)
                          if name.endswith(".dist-info") and name.split("-")[0].lower() in PACKAGES]
    return f"{sys.executable} {sys.version} {' '.join(sorted(installed))}"


def _file_digest(path: Path) -> str:
    stat = path.stat()
    if stat.st_size > CONTENT_LIMIT:
        return f"size={stat.st_size} mtime={stat.st_mtime_ns}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


class ValidationCache:
    """Passed validation entries by key, one JSON file each."""

    def __init__(self, directory: Path = CACHE) -> None:
        self.directory = directory

    def get(self, key: str | None, name: str) -> dict[str, Any] | None:
        """The entry stored under `key` for dataset `name`, or None (absent, unreadable or not a pass)."""
        if key is None:
            return None
        try:
            stored = json.loads((self.directory / f"{key}.json").read_text())
            entry = stored["entry"]
            if stored["key"] == key and entry["dataset"] == name and is_pass(entry):
                return entry
        except (OSError, ValueError, KeyError, TypeError):
            pass  # NOTE: a corrupt or truncated file costs one validation, never the deploy
        return None

    def put(self, key: str | None, entry: dict[str, Any]) -> None:
        if key is None or not is_pass(entry):
            return
        # concurrent deploys each write whole files
        write_replacing(self.directory / f"{key}.json", json.dumps({"key": key, "entry": entry}))


def is_pass(entry: dict[str, Any]) -> bool:
    """A dataset that gave records and no error, with the fields the table shows."""
    return (isinstance(entry, dict) and not entry.get("error") and bool(entry.get("kept"))
            and isinstance(entry.get("skip_reasons"), dict) and all(k in entry for k in ("kind", "formats", "rows")))
