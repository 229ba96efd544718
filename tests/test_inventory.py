"""Inventories: the shipped ones load, and every mistake names the file, the key and what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from local.errors import AerieError
from local.inventory import REPO, load


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return str(path)


def test_the_shipped_inventories_load() -> None:
    local = load("local")
    assert local.backend == "local" and Path(local.host.root).is_absolute()
    assert Path(local.host.root).is_relative_to(REPO)
    gpu = load("gpu")
    assert gpu.host.address == "10.1.230.174" and gpu.host.root == "/root/eagle3-train"
    assert gpu.stages.extract.layers == [2, 30, 58]
    assert {"A1", "B5", "B8"} <= set(gpu.datasets)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("backend: ssh\nhost: {adress: h, root: /r}\n", "host.adress: unknown key (expected one of: address, port,"),
        ("backend: local\nhost: {root: r}\ndatasets: {A1: {source: s, kind: natve}}\n",
         "datasets.A1.kind: Input should be 'native' or 'prompts' (got 'natve')"),
        ("backend: local\nhost: {root: r, port: abc}\n", "host.port: Input should be a valid integer"),
        ("backend: local\n", "give either `host` (one host) or `hosts` (several, by name)"),
        ("backend: ssh\nhost: {root: /r}\n", "host.address is required when backend is ssh"),
        ("backend: local\nhost: {root: r}\nstages: {prep: {max_lenght: 3}}\n",
         "stages.prep.max_lenght: unknown key (expected one of: command, stall_after, max_length"),
        ("backend: local\nhost: [root\n", "not valid YAML"),
        ("- a\n", "expected a mapping of keys"),
    ],
)
def test_a_bad_inventory_names_the_key_and_what_was_expected(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(AerieError) as error:
        load(path)
    assert str(error.value).startswith(f"{path}: ")
    assert expected in str(error.value)


def test_an_unknown_inventory_name_lists_the_known_ones() -> None:
    with pytest.raises(AerieError, match=r"no inventory 'nope' .* use one of gpu, local"):
        load("nope")


def test_an_unknown_dataset_or_stage_is_refused_by_name() -> None:
    inventory = load("local")
    with pytest.raises(AerieError, match="unknown dataset Z9 in .*local.yaml: expected one of sharegpt"):
        inventory.select(["sharegpt", "Z9"])
    with pytest.raises(AerieError, match="unknown stage 'preb': expected one of prep, infer, extract, train"):
        inventory.stage("preb")


def test_a_bad_inventory_reaches_the_user_as_one_line_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: local\nhost: {root: r, colour: blue}\n")
    done = subprocess.run([sys.executable, "-m", "invoke", "status", "-i", path], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"aerie: {path}: host.colour: unknown key (expected one of: address, port, user, " \
        "identity, known_hosts, ssh_config, root, python, connect_timeout, keepalive, env)"


def test_invoke_config_chooses_the_default_inventory(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: local\nhost: {root: r, colour: blue}\n")
    env = {**__import__("os").environ, "INVOKE_INVENTORY": path}
    done = subprocess.run([sys.executable, "-m", "invoke", "status"], cwd=REPO, capture_output=True, text=True, env=env)
    assert done.returncode == 2 and path in done.stderr
