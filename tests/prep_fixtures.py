"""Fixtures and helpers of the prep tests: the tiny Kimi-style tokenizer, built once per session.

Import the fixtures into a test module (``from tests.prep_fixtures import tiny_tokenizer``)
so pytest finds them there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from remote.prep.pipeline import Prepared, Preparer
from remote.prep.settings import Target
from remote.tiny_tokenizer import build_tokenizer
from tests.settings import prep_settings

FIXTURES = Path(__file__).parent / "fixtures" / "prep"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path) -> Any:
    return Target(str(tiny_tokenizer_dir)).load()


def read_rows(name: str) -> list[Any]:
    """The rows of a JSONL fixture, parsed (a broken line would fail the test, on purpose)."""
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def prepare(tokenizer: Any, rows: list[Any], kind: str = "native", **settings: Any) -> Prepared:
    """One batch through prep, in this process."""
    preparer = Preparer(kind, "T", Target(), prep_settings(**settings), tokenizer)
    return preparer.process(list(enumerate(rows)))


def masked_runs(tokenizer: Any, input_ids: Any, loss_mask: Any) -> list[str]:
    """The decoded text of each run of masked tokens, in order."""
    runs, current = [], []
    for token, masked in zip(input_ids.tolist(), loss_mask.tolist()):
        if masked:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run, skip_special_tokens=False) for run in runs]


def expected_turns(conversation: list[dict[str, Any]]) -> list[str]:
    """What the tiny template renders for each assistant turn, written out by hand from its rules."""
    last_user = max((i for i, m in enumerate(conversation) if m["role"] == "user"), default=-1)
    turns = []
    for i, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        text = ""
        if message.get("reasoning_content") and i > last_user:
            text += f"<think>{message['reasoning_content']}</think>"
        text += message["content"]
        if message.get("tool_calls"):
            text += "<|tool_calls_section_begin|>"
            for call in message["tool_calls"]:
                text += f"<|tool_call_begin|>{call['id']}<|tool_call_argument_begin|>{call['function']['arguments']}<|tool_call_end|>"
            text += "<|tool_calls_section_end|>"
        turns.append(text + "<|im_end|>")
    return turns
