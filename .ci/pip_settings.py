"""Prints this machine's pip settings as `uv pip install` arguments, one per line.

uv reads no pip.conf and no PIP_* variable, so without these it would install from another place than pip:
PyPI's CUDA build of torch, say, where pip's find-links hold a CPU-only wheel of the same version.
"""

from __future__ import annotations

import ast
import subprocess
import sys

#: pip's setting -> uv's option; each takes a whitespace-separated list, as pip reads it.
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint"}
#: Which of pip's sections wins, the strongest first: a PIP_* variable, then an install section, then global.
SECTIONS = (":env:", "install", "global")


def settings(listing: str) -> dict[str, str]:
    """`pip config list`'s lines (`section.name='value'`), the strongest section's value of each name."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in SECTIONS and name in OPTIONS:
            found[section, name] = ast.literal_eval(value)
    return {name: next(found[section, name] for section in SECTIONS if (section, name) in found)
            for _, name in found}


def arguments(chosen: dict[str, str]) -> list[str]:
    # pip takes the best version across all its indexes; uv, by default, the first index that has the package.
    args = ["--index-strategy", "unsafe-best-match"]
    for name, value in chosen.items():
        for item in value.split():
            args += [OPTIONS[name], item]
    return args


if __name__ == "__main__":
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, check=True).stdout
    print(*arguments(settings(listing)), sep="\n")
