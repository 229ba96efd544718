"""Secrets reach the jobs and the inference server that need them, and nothing of the host's root, the
status or the logs ever holds one: `secrets:` names variables of the workstation's environment, ``${NAME}``
in `stages.infer.server_env` names one the same way, and a literal value there (older inventories) is
sealed the same way. A job the runner starts after `inv run` has returned (its SSH connection closed) still
gets them; a secret unset on the workstation is one line before anything starts; a mistyped key beside
`host.env` is refused without a value of it.

Real parts: the loopback sshd, the tasks as typed, the runner and supervisor; the stages are the scripted
stage behind a probe that records a hash of what its environment holds (never the value, which must not be
written anywhere a grep could find it), the server Python's http.server behind the same probe.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets as random_secrets
import sys
import time
from pathlib import Path

import pytest

from benchmarks.harness.checkout import SCRIPTED, Bench, copy_checkout
from local.exceptions import AerieError
from local.inventory import secret_values
from local.inventory.schema import load
from remote.vocabulary import secrets

PROBE = '''\
"""Record a hash of each named variable of this process's environment, then become the real command."""
import hashlib, json, os, sys
seen, tag, names, command = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
hashes = {n: hashlib.sha256(os.environ[n].encode()).hexdigest() if n in os.environ else None for n in names}
os.makedirs(seen, exist_ok=True)
with open(os.path.join(seen, tag + ".json"), "w") as out:
    json.dump(hashes, out)
os.execv(sys.executable, [sys.executable, *command])
'''
WATCHED = "HF_TOKEN,LEGACY_TOKEN,AERIE_T_WANDB"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def every_file_under(root: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in root.rglob("*") if path.is_file() and not path.is_symlink()}


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"AERIE_T_HF": f"hf_{random_secrets.token_hex(12)}", "AERIE_T_WANDB": f"wandb-{random_secrets.token_hex(12)}",
              "legacy": f"legacy-{random_secrets.token_hex(12)}"}
    monkeypatch.setenv("AERIE_T_HF", values["AERIE_T_HF"])
    monkeypatch.setenv("AERIE_T_WANDB", values["AERIE_T_WANDB"])
    return values


def secret_inventory(bench: Bench, plans: Path, port: int, tokens: dict[str, str]) -> None:
    """A prompts dataset: prep, infer against the managed server, tokenize, extract, then train; every
    stage the scripted one, train and the server behind the probe."""
    plans.mkdir(exist_ok=True)
    (plans / "health").write_text("ok")
    probe = plans.parent / "probe.py"
    probe.write_text(PROBE)
    seen = plans.parent / "seen"
    scripted = f"{{python}} {SCRIPTED} {plans}"
    stages = {name: {"command": scripted} for name in ("prep", "extract")}
    stages["train"] = {"command": f"{{python}} {probe} {seen} train {WATCHED} {SCRIPTED} {plans}"}
    stages["infer"] = {
        "command": scripted,
        "server_command": f"{sys.executable} {probe} {seen} server {WATCHED} -m http.server {port} --bind 127.0.0.1 "
                          f"--directory {plans}",
        "server_url": f"http://127.0.0.1:{port}/v1",
        "server_start_timeout": 30,
        "server_env": {"HF_TOKEN": "${AERIE_T_HF}", "LEGACY_TOKEN": tokens["legacy"]},
    }
    bench.inventory({"B": {"source": "B.data", "kind": "prompts"}}, stages, secrets=["AERIE_T_WANDB"])


# NOTE: control_persist 0: no shared connection outlives a command, so once `inv run` has returned
# nothing of the workstation is connected to the host.
ON_SSH_UNSHARED = pytest.mark.backends("ssh", control_persist=0)


@pytest.mark.e2e
@ON_SSH_UNSHARED
def test_a_secret_reaches_the_server_and_a_job_started_after_the_laptop_left_and_is_stored_or_shown_nowhere(
        bench: Bench, free_port: int, tokens: dict[str, str]) -> None:
    from tests.helpers.pipelines import wait_pipeline

    plans = bench.root.parent / "plans"
    secret_inventory(bench, plans, free_port, tokens)
    (plans / "B.extract").write_text("records=1 sleep=2")  # train starts well after `inv run` has returned
    bench.inv("deploy")
    bench.inv("run")
    returned = time.time()
    jobs = wait_pipeline(bench, timeout=120)
    assert {k: j["state"] for k, j in jobs.items()} == {k: "succeeded" for k in jobs}, jobs

    trace = json.loads((plans / "trace" / "draft.train.json").read_text())
    assert trace["start"] > returned  # started by the runner, the workstation long gone
    seen = {tag: json.loads((bench.root.parent / "seen" / f"{tag}.json").read_text()) for tag in ("train", "server")}
    assert seen["train"]["AERIE_T_WANDB"] == digest(tokens["AERIE_T_WANDB"])
    assert seen["server"]["HF_TOKEN"] == digest(tokens["AERIE_T_HF"])
    assert seen["server"]["LEGACY_TOKEN"] == digest(tokens["legacy"])  # a literal of an older inventory, too
    assert seen["train"]["HF_TOKEN"] is None  # the server's environment is the server's

    shown = bench.inv("status", "--json").stdout
    for dataset, stage in (("B", "infer"), ("draft", "train"), ("pipeline", "run"), ("B", "prep")):
        shown += bench.inv("logs", dataset, "--stage", stage, "-n", "1000").stdout
    files = every_file_under(bench.root)
    assert any(path.name == "spec.json" for path in files) and any(path.name == "server.log" for path in files)
    for value in tokens.values():
        assert value not in shown
        assert [path for path, data in files.items() if value.encode() in data] == []


@pytest.mark.e2e
@ON_SSH_UNSHARED
def test_a_secret_unset_here_is_one_line_before_anything_starts(bench: Bench, free_port: int,
                                                                 tokens: dict[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    secret_inventory(bench, bench.root.parent / "plans", free_port, tokens)
    bench.inv("deploy")
    monkeypatch.delenv("AERIE_T_WANDB")
    monkeypatch.delenv("AERIE_T_HF")
    for verb in (["run"], ["launch", "--stage", "prep"]):
        refused = bench.inv(*verb, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert refused.stderr.strip().count("\n") == 0
        assert "secrets AERIE_T_WANDB, AERIE_T_HF named in the inventory are not set here" in refused.stderr
        assert "export AERIE_T_WANDB=" in refused.stderr
    assert not (bench.root / "jobs").exists()  # nothing started


def test_a_mistyped_env_key_is_refused_in_one_line_without_a_value(tmp_path: Path) -> None:
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "local")
    value, other = f"hf_{random_secrets.token_hex(8)}", f"v-{random_secrets.token_hex(8)}"
    bench.host_settings = {"env": {"HF-TOKEN": value, "SLURM_CONF": other}}
    bench.inventory({"A": {"source": "a.jsonl", "kind": "native"}},
                    {"infer": {"server_env": {"TOKEN": value, "bad": 3}}})
    refused = bench.inv("status", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "env key 'HF-TOKEN' is not an environment variable name" in refused.stderr
    assert value not in refused.stderr and other not in refused.stderr and "***" in refused.stderr


# -- the parts, on their own ----------------------------------------------------------------------


def test_a_literal_is_sealed_and_a_reference_kept_and_the_host_expands_both(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps({"backend": "local", "host": {"root": str(tmp_path / "root")}, "secrets": ["A_KEY"],
                                "stages": {"infer": {"server_env": {"HF_TOKEN": "${MY_HF}", "PLAIN": "literal-1",
                                                                     "AUTH": "Bearer ${MY_HF}"}}},
                                "notify": {"url": "https://hooks.example/T0/abc"}}))
    inventory = load(str(path))
    sealed = secret_values.seal_env("stages.infer.server_env", inventory.stages.infer.server_env)
    assert sealed == {"HF_TOKEN": "${MY_HF}", "PLAIN": "${AERIE_SECRET_STAGES_INFER_SERVER_ENV_PLAIN}",
                      "AUTH": "Bearer ${MY_HF}"}
    sent = secret_values.values(inventory, {"A_KEY": "a", "MY_HF": "hf-1", "UNRELATED": "x"})
    assert sent == {"A_KEY": "a", "MY_HF": "hf-1", "AERIE_SECRET_STAGES_INFER_SERVER_ENV_PLAIN": "literal-1",
                    "AERIE_SECRET_NOTIFY_URL": "https://hooks.example/T0/abc"}
    assert secrets.expand_env(sealed, sent) == {"HF_TOKEN": "hf-1", "PLAIN": "literal-1", "AUTH": "Bearer hf-1"}
    with pytest.raises(AerieError, match=r"secret MY_HF named in the inventory is not set here"):
        secret_values.values(inventory, {"A_KEY": "a"})


def test_host_env_is_never_expanded_and_says_where_a_forwarded_variable_goes(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps({"backend": "local", "host": {"root": "r", "env": {"HF_TOKEN": "${HF_TOKEN}"}}}))
    with pytest.raises(AerieError, match=r"host.env is set as written, never expanded: .* name it in `secrets:`"):
        load(str(path))


def test_the_host_takes_the_secrets_out_of_the_arguments_and_names_a_missing_one_without_a_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    args = {"root": "/r", "secrets": {"AERIE_T_HELD": "v-1", "bad name": "x"}}
    monkeypatch.delenv("AERIE_T_HELD", raising=False)
    secrets.hold(args)
    assert args == {"root": "/r"} and os.environ["AERIE_T_HELD"] == "v-1" and "bad name" not in os.environ
    monkeypatch.delenv("AERIE_T_HELD")
    with pytest.raises(secrets.MissingSecret, match="the secret AERIE_T_HELD was not given to this run"):
        secrets.expand("x-${AERIE_T_HELD}")
    assert secrets.mask("GET https://h/abc failed: abc", ["https://h/abc", "abc"]) == "GET *** failed: ***"


def test_specforge_env_is_sealed_in_the_extract_spec_and_filled_in_for_the_capture_workers(tmp_path: Path) -> None:
    from local.jobs import specs
    from remote.eagle3 import StageInputError, sglang_engine

    path = tmp_path / "inv.yaml"
    path.write_text(json.dumps({"backend": "local", "host": {"root": str(tmp_path / "root")},
                                "stages": {"extract": {"specforge_env": {"HF_TOKEN": "hf-literal", "HOME_DIR": "${MY_DIR}"}}}}))
    inventory = load(str(path))
    sealed = specs.stage_config(inventory, "extract")["stage"]["specforge_env"]
    assert sealed == {"HF_TOKEN": "${AERIE_SECRET_STAGES_EXTRACT_SPECFORGE_ENV_HF_TOKEN}", "HOME_DIR": "${MY_DIR}"}
    assert "hf-literal" not in json.dumps(specs.stage_config(inventory, "extract"))
    sent = secret_values.values(inventory, {"MY_DIR": "/opt/sf"})
    assert sent == {"MY_DIR": "/opt/sf", "AERIE_SECRET_STAGES_EXTRACT_SPECFORGE_ENV_HF_TOKEN": "hf-literal"}
    os.environ.update(sent)
    try:
        env = sglang_engine.environment(sealed)
        assert (env["HF_TOKEN"], env["HOME_DIR"]) == ("hf-literal", "/opt/sf")
    finally:
        for name in sent:
            os.environ.pop(name, None)
    with pytest.raises(StageInputError, match=r"^stages.extract.specforge_env: the secret \w+ was not given to this run") as refused:
        sglang_engine.environment(sealed)
    assert "hf-literal" not in str(refused.value)
