"""What the host's Python needs for the stages: pyproject.toml's `host` extra, the one list of them.

`inv check --install` installs it there with pip (`RemoteHost.pip_install`), so the list has one owner:
the same pins the tests run against. The control plane itself needs nothing installed.
"""

from __future__ import annotations

from pathlib import Path

from local.exceptions import AerieError
from local.paths import REPO

EXTRA = "host"


def requirements(repo: Path = REPO) -> list[str]:
    """The `host` extra's requirement specifiers, as pyproject.toml gives them (e.g. ``torch==2.13.0``)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the same parser, as a package
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise AerieError("reading pyproject.toml needs Python 3.11, or `pip install tomli` here") from None
    path = repo / "pyproject.toml"
    try:
        project = tomllib.loads(path.read_text())["project"]
        return list(project["optional-dependencies"][EXTRA])
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise AerieError(f"{path}: no [project.optional-dependencies] {EXTRA} list to install ({exc})") from None
