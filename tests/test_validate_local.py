"""`inv validate` as the workstation asks for it: the key a missing file is named by, and any number of datasets."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from local.validation import samples
from local.exceptions import AerieError
from local.inventory.schema import load
from local.validation.cache import ValidationCache
from remote.prep.validate import validate as validate_on_host
from benchmarks.harness.checkout import Bench, copy_checkout


def inventory(tmp_path: Path, datasets: dict) -> Path:
    path = tmp_path / "inventories" / "test.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"backend": "local", "host": {"root": str(tmp_path / "root")}, "datasets": datasets}))
    return path


def test_a_missing_file_is_named_by_the_key_the_user_wrote(tmp_path: Path) -> None:
    asked = samples.request(load(str(inventory(tmp_path, {
        "S": {"source": "inventories/samples/absent.jsonl", "kind": "native"},
        "T": {"source": "org/hub-id", "kind": "native", "sample": "absent.jsonl"}}))))
    errors = {entry["dataset"]: entry["error"] for entry in validate_on_host(asked)}
    assert errors["S"] == ("datasets.S.source: inventories/samples/absent.jsonl is not a file here, and datasets.S "
                           "has no sample: fix the path, or set `sample` to a small local file")
    assert errors["T"] == f"datasets.T.sample: {tmp_path / 'inventories' / 'absent.jsonl'} does not exist"


@pytest.mark.e2e
def test_deploy_with_a_thousand_datasets_over_ssh(tmp_path: Path, sshd) -> None:  # noqa: ANN001
    # One argument of every dataset's settings passed Linux's 128 KiB at about 500 datasets: `inv deploy`
    # ended in "OSError: [Errno 7] Argument list too long" before anything was sent.
    bench = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", "ssh", sshd)
    bench.inventory({f"D{i:04d}-{'x' * 40}": {"source": "records=1", "kind": "native"} for i in range(1000)})
    first = bench.inv("deploy", timeout=300)
    assert "Deployed release" in first.stdout and "D0999" in first.stdout
    again = bench.inv("deploy", timeout=300)
    assert "validated (cached): D0000" in again.stdout and "and 992 more" in again.stdout
    assert "Nothing to deploy" in again.stdout
    assert bench.inv("status").stdout == "No jobs yet.\n"


def test_datasets_that_fail_alike_are_one_clause_of_the_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"D{i:04d}" for i in range(1000)] + ["odd"]
    inv = load(str(inventory(tmp_path, {name: {"source": "x.jsonl", "kind": "native"} for name in names})))
    failing = {"kind": "native", "formats": {}, "rows": 3, "kept": 0, "skipped": 3, "error": None}
    monkeypatch.setattr(samples, "validate", lambda inventory, asked=None: [
        {**failing, "dataset": name, "skip_reasons": {"no conversations field (keys: id, text)": 3}} for name in names[:-1]
    ] + [{**failing, "dataset": "odd", "skip_reasons": {}, "error": "datasets.odd.source: x.jsonl is not a file here"}])
    with pytest.raises(AerieError) as raised:
        samples.check(inv, Console(file=io.StringIO(), width=200), cache=ValidationCache(tmp_path / "cache"))
    assert str(raised.value) == (
        "datasets that would give zero records: D0000, D0001, D0002, D0003, D0004, D0005, D0006, D0007 and 992 more "
        "(no conversations field (keys: id, text)); odd (datasets.odd.source: x.jsonl is not a file here). "
        'README, "Teaching prep a new family", shows how to add a format prep does not read')
