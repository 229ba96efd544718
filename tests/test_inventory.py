"""Inventories: the shipped ones load, and every mistake names the file, the key and what was expected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from local.exceptions import AerieError
from local.inventory.schema import REPO, load


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
         "stages.prep.max_lenght: unknown key (expected one of: command, stall_after, log_limit, max_length"),
        ("backend: local\nhost: [root\n", "not valid YAML"),
        ("- a\n", "expected a mapping of keys"),
        ("backend: local\nhost: {root: r}\ndatasets: {'../../etc': {source: s, kind: native}}\n",
         "datasets: '../../etc' is not a dataset name: use letters, digits, '_', '.' and '-', starting with a letter"),
        ("backend: local\nhost: {root: r}\ndatasets: {'a/b': {source: s, kind: native}}\n", "'a/b' is not a dataset name"),
        ("backend: local\nhost: {root: r}\ndatasets: {pipeline: {source: s, kind: native}}\n",
         "'pipeline' is not a dataset name: use letters, digits, '_', '.' and '-', starting with a letter or digit, "
         "at most 64 characters, and not pipeline or draft"),
        ("backend: local\nhost: {root: r, env: {'X; touch pwned': '1'}}\n",
         "env key 'X; touch pwned' is not an environment variable name"),
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


@pytest.mark.e2e
def test_a_bad_inventory_reaches_the_user_as_one_line_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: local\nhost: {root: r, colour: blue}\n")
    done = subprocess.run([sys.executable, "-m", "invoke", "status", "-i", path], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"aerie: {path}: host.colour: unknown key (expected one of: address, port, user, " \
        "identity, known_hosts, ssh_config, root, python, connect_timeout, keepalive, control_persist, env)"


@pytest.mark.e2e
def test_invoke_config_chooses_the_default_inventory(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: local\nhost: {root: r, colour: blue}\n")
    env = {**__import__("os").environ, "INVOKE_INVENTORY": path}
    done = subprocess.run([sys.executable, "-m", "invoke", "status"], cwd=REPO, capture_output=True, text=True, env=env)
    assert done.returncode == 2 and path in done.stderr


def test_every_value_in_the_host_command_is_quoted(tmp_path: Path) -> None:
    """Values reach the host's shell quoted: a hostile one stays one word (the inventory refuses bad env names)."""
    import shlex

    from local.host.verbs import RemoteHost

    inventory = load(write(tmp_path, "backend: local\nhost: {root: '/r o;ot', python: 'py thon', env: {K: 'v; touch x'}}\n"))
    command = RemoteHost(inventory).command("status", {"datasets": ["a'b"]})
    words = shlex.split(command.split("&& ", 1)[1])
    assert words[:2] == ["K=v; touch x", "PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}"]
    assert words[3:7] == ["py thon", "-S", "-m", "remote"] and "a'b" in words[-1]  # -S: status is stdlib only
    inventory.host.env["X;touch y"] = "1"  # past validation (a model built in code): refused all the same
    with pytest.raises(AerieError, match="host.env key 'X;touch y' is not an environment variable name"):
        RemoteHost(inventory).command("status", {})


def test_the_host_refuses_a_job_name_that_would_leave_its_root(tmp_path: Path) -> None:
    from remote.control_plane.store import HostError, JobStore

    with pytest.raises(HostError, match="'../../etc' is not a job name"):
        JobStore(tmp_path).directory("../../etc", "prep")


def test_infer_concurrency_is_auto_by_default_a_number_pins_it_and_anything_else_is_one_line(tmp_path: Path) -> None:
    base = "backend: local\nhost: {root: r}\n"
    assert load(write(tmp_path, base)).stages.infer.concurrency == "auto"
    assert load(write(tmp_path, base + "stages: {infer: {concurrency: 12}}\n")).stages.infer.concurrency == 12
    for bad in ("fast", 0, True):
        with pytest.raises(AerieError, match=r"stages.infer.concurrency: expected auto or a whole number of requests >= 1 \(got"):
            load(write(tmp_path, base + f"stages: {{infer: {{concurrency: {str(bad).lower()}}}}}\n"))
