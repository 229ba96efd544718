"""A stage setting reaches the host one way: built into its job's spec (`local.jobs.specs`), and `inv plan` and
`inv check` send the host the values that builder made, not a reading of their own; the readiness checks take
the request's. `stages.extract.layers` is the setting held here, from the ast and through the builders."""

from __future__ import annotations

import ast
import io
from pathlib import Path
from typing import Any

from local.inventory.schema import validate

LOCAL = Path(__file__).resolve().parents[1] / "local"
#: Where the workstation may read `stages.extract.layers` off the inventory: its declaration and checks, the spec
#: builder, and the online route's train job, which is given extract's layers (train reading them from
#: extract's manifest is issue 41's train side).
READERS = {"local/inventory/stages.py", "local/jobs/pipeline.py"}


def reads_of_extract_layers(source: str) -> list[int]:
    """Lines of `source` that read ``<...>.extract.layers`` off the inventory's values."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and n.attr == "layers"
            and isinstance(n.value, ast.Attribute) and n.value.attr == "extract"]


def test_the_workstation_reads_extract_s_layers_only_where_they_are_declared_and_built_into_a_spec() -> None:
    found = {str(p.relative_to(LOCAL.parent)) for p in LOCAL.rglob("*.py") if reads_of_extract_layers(p.read_text())}
    assert found <= READERS, f"read stages.extract.layers from the spec's builder (specs.sent_settings): {found - READERS}"
    assert reads_of_extract_layers("host.call_sent('check', layers=inventory.stages.extract.layers)")  # the old route


def inventory(tmp_path: Path, layers: list[int]) -> Any:
    return validate({"backend": "local", "host": {"root": str(tmp_path / "root")},
                     "target": {"model": "{root}/target", "tokenizer": "{root}/target"},
                     "stages": {"extract": {"layers": layers, "dtype": "float32"}},
                     "datasets": {"A": {"source": "x", "kind": "native"}}})


class Host:
    """The workstation's view of a host as `inv check` uses it, keeping what it would send."""

    def __init__(self, inventory: Any, root: str) -> None:
        self.inventory, self.root, self.name, self.sent = inventory, root, "test", {}

    def call_sent(self, verb: str, **args: Any) -> list[dict[str, Any]]:
        self.sent[verb] = args
        return []


def test_inv_plan_and_inv_check_send_extract_s_settings_as_its_job_s_spec_carries_them(tmp_path: Path) -> None:
    from local.jobs import specs
    from local.tasks import host_checks, planning
    from rich.console import Console

    loaded = inventory(tmp_path, [1, 5, 9])
    spec = specs.spec(loaded, "A", "extract")["config"]["stage"]
    root = str(tmp_path / "root")

    plan = planning.request(loaded, root)
    assert (plan["layers"], plan["dtype"], plan["extract_engine"]) == (spec["layers"], spec["dtype"], spec["engine"])
    assert "layers" not in plan["readiness"]  # the readiness checks take the request's own
    host = Host(loaded, root)
    host_checks.check(host, Console(file=io.StringIO()))
    assert (host.sent["check"]["layers"], host.sent["check"]["dtype"]) == ([1, 5, 9], "float32")
    assert "layers" not in host.sent["check"]["readiness"]


def test_the_readiness_checks_hold_the_request_s_layers_against_the_target(tmp_path: Path) -> None:
    import json

    from remote import readiness

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 4, "vocab_size": 9}))
    asked = {"checks": ["target"], "model": str(tmp_path / "target")}
    [_, ok] = readiness.checks({"root": str(tmp_path), "layers": [0, 1, 2], "readiness": asked})
    [_, bad] = readiness.checks({"root": str(tmp_path), "layers": [0, 1, 3], "readiness": asked})
    assert ok["status"] == "ok" and bad["status"] == "fail" and "[3] out of range" in bad["detail"]
