"""The setup's installer: uv, given the machine's pip settings, so that it installs from where pip would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SETTINGS = Path(__file__).parents[1] / ".ci" / "pip_settings.py"


def uv_arguments(tmp_path: Path, config: str, **variables: str) -> list[tuple[str, str]]:
    """What .ci/pip_settings.py prints under a pip config file of `config` and these PIP_* variables, paired."""
    (tmp_path / "pip.conf").write_text(config)
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(tmp_path / "pip.conf"), **variables)
    out = subprocess.run([sys.executable, str(SETTINGS)], env=env, capture_output=True, text=True, check=True).stdout.split()
    return list(zip(out[::2], out[1::2]))


def test_uv_gets_pip_s_strongest_setting_of_each_name_every_item_of_a_list_and_pip_s_choice_across_indexes(
        tmp_path: Path) -> None:
    pairs = uv_arguments(tmp_path, "[global]\nfind-links = /global/wheels\nextra-index-url = file:///a file:///b\n"
                                   "[install]\nfind-links = /install/wheels\n[download]\nindex-url = file:///elsewhere\n",
                         PIP_CONSTRAINT="/env/constraints.txt")
    assert pairs[0] == ("--index-strategy", "unsafe-best-match")
    assert ("--find-links", "/install/wheels") in pairs and ("--find-links", "/global/wheels") not in pairs
    assert ("--extra-index-url", "file:///a") in pairs and ("--extra-index-url", "file:///b") in pairs
    assert ("--constraint", "/env/constraints.txt") in pairs
    assert ("--index-url", "file:///elsewhere") not in pairs  # another command's section


def test_a_pip_variable_outranks_the_config_files(tmp_path: Path) -> None:
    pairs = uv_arguments(tmp_path, "[install]\nfind-links = /install/wheels\n", PIP_FIND_LINKS="/env/wheels")
    assert [value for option, value in pairs if option == "--find-links"] == ["/env/wheels"]
