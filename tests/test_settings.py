"""Every stage setting is declared once, in the inventory's schema; the host has no second default."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from local.inventory import Stages
from remote.infer.infer_settings import InferSettings, SettingsError
from remote.prep.errors import PrepError
from remote.prep.prep_settings import PrepSettings
from remote.settings import need
from benchmarks.harness.checkout import REPO
from benchmarks.harness.stage_settings import complete

HOST_SETTINGS = {"prep": PrepSettings, "infer": InferSettings}
SCHEMA_KEYS = sorted({key for field in Stages.model_fields.values() for key in field.annotation.model_fields})


@pytest.mark.parametrize("stage", HOST_SETTINGS)
def test_the_hosts_typed_settings_have_required_fields_only_and_all_are_in_the_schema(stage: str) -> None:
    fields = dataclasses.fields(HOST_SETTINGS[stage])
    with_default = [f.name for f in fields if f.default is not dataclasses.MISSING
                    or f.default_factory is not dataclasses.MISSING]
    assert with_default == [], f"{stage}: a second default for {with_default}: declare it in local/inventory.py only"
    schema = Stages.model_fields[stage].annotation.model_fields
    assert [f.name for f in fields if f.name not in schema] == []


def test_no_host_code_reads_a_stage_setting_with_a_default_of_its_own() -> None:
    """`settings.get("max_length", 2048)` beside the schema's 2048 (and SpecForge's 4096) is how they drifted."""
    pattern = re.compile(r"""\.get\(\s*["'](%s)["']\s*,""" % "|".join(SCHEMA_KEYS))
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted((REPO / "remote").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_the_workstations_settings_are_complete_for_the_host() -> None:
    assert PrepSettings.from_config(complete("prep")).max_length == Stages().prep.max_length
    assert InferSettings.from_config(complete("infer")).concurrency == Stages().infer.concurrency


def test_a_missing_setting_is_named_in_one_line() -> None:
    settings = complete("prep")
    del settings["shard_size"]
    with pytest.raises(PrepError, match=r"^stages\.prep\.shard_size is missing from the job's settings"):
        PrepSettings.from_config(settings)
    with pytest.raises(SettingsError, match=r"^stages\.infer\.concurrency, retries are missing"):
        InferSettings.from_config({k: v for k, v in complete("infer").items() if k not in ("concurrency", "retries")})
    with pytest.raises(ValueError, match=r"^stages\.train\.max_length is missing"):
        need({}, "train", "max_length")


def test_the_job_spec_carries_every_setting_of_its_stage(tmp_path: Path) -> None:
    from local import job_specs
    from local.inventory import load

    inventory = load("local")
    for stage in Stages.model_fields:
        name = next(iter(inventory.datasets))
        sent = job_specs.spec(inventory, name, stage)["config"]["stage"]
        declared = set(Stages.model_fields[stage].annotation.model_fields) - {"command", "stall_after"}
        assert declared <= set(sent), f"{stage}: the spec lacks {declared - set(sent)}"
