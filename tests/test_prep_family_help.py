"""A dataset prep cannot read is refused with where to look, and what is there works: the README's
section "Teaching prep a new family" quotes the refusal its worked example's rows get, and its
steps (the detector, the role aliases, the sample, the test), applied to a copy of remote/prep,
teach prep the family."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from local.exceptions import AerieError
from local.inventory.schema import load
from local.validation import samples
from remote.vocabulary.hints import TEACH_A_FAMILY

pytestmark = pytest.mark.e2e  # prep runs as a process, as `inv validate` runs it

REPO = Path(__file__).resolve().parents[1]
TITLE = "Teaching prep a new family"


def section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"### {TITLE}\n")
    return text[start:text.index("\n#", start + 1)]


def blocks(kind: str) -> list[str]:
    """The section's fenced blocks of `kind`, unindented."""
    found = re.findall(rf"^( *)```{kind}\n(.*?)^\1```", section(), flags=re.S | re.M)
    return ["\n".join(line[len(indent):] for line in body.splitlines()) + "\n" for indent, body in found]


def test_the_refusal_names_the_readme_section_that_teaches_a_family() -> None:
    assert f'"{TITLE}"' in TEACH_A_FAMILY


def test_the_worked_example_s_rows_get_the_refusal_the_readme_quotes(tmp_path: Path) -> None:
    (tmp_path / "dialog.jsonl").write_text(blocks("jsonl")[0])
    (tmp_path / "support.yaml").write_text(json.dumps({
        "backend": "local", "host": {"root": str(tmp_path / "root")},
        "datasets": {"B3": {"source": str(tmp_path / "dialog.jsonl"), "kind": "native"}}}))
    with pytest.raises(AerieError) as refused:
        samples.check(load(str(tmp_path / "support.yaml")), console())
    quoted = blocks("")[0].strip()
    assert f"aerie: {refused.value}" == quoted and quoted.endswith(TEACH_A_FAMILY)


def test_the_worked_example_s_steps_teach_prep_the_family(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "remote", copy / "remote", ignore=shutil.ignore_patterns("__pycache__"))
    detector, aliases = blocks("diff")[0], blocks("python")[0]
    normalise = copy / "remote" / "prep" / "normalise.py"
    source = normalise.read_text()
    for hunk in detector.split("...\n"):  # each hunk: its context and `-` lines found, replaced by context and `+`
        before = "".join(line[1:] + "\n" for line in hunk.splitlines() if not line.startswith("+"))
        after = "".join(line[1:] + "\n" for line in hunk.splitlines() if not line.startswith("-"))
        assert source.count(before) == 1, f"the README's detector step no longer matches _detect:\n{before}"
        source = source.replace(before, after)
    normalise.write_text(source)
    roles = copy / "remote" / "prep" / "roles.py"
    roles.write_text(roles.read_text().replace("ROLE_ALIASES: dict[str, str] = {\n",
                                               "ROLE_ALIASES: dict[str, str] = {\n" + aliases, 1))
    (copy / "inventories" / "samples").mkdir(parents=True)
    (copy / "inventories" / "samples" / "dialog.jsonl").write_text(blocks("jsonl")[0])
    test = blocks("python")[1]
    script = f"import json\nfrom remote.prep.normalise import normalise\n{test}\n{test.split('(')[0][4:]}()\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=copy, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


def console():  # noqa: ANN201
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=200)
