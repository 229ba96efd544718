"""`inv validate` on the host side: prep over each dataset's local sample, in memory.

Usage: ``python -m remote.prep.validate '<json>'`` (or ``-``: the JSON on stdin) with::

    {"target": {"tokenizer": PATH, "trust_remote_code": BOOL},
     "stage": {prep settings},
     "datasets": {"A1": {"kind": "native", "sample": "/abs/sample.jsonl", ...}}}

Prints, through `remote.vocabulary.wire.emit`, a list with one entry per dataset:
``{"dataset", "kind", "formats", "rows", "kept", "skipped", "skip_reasons",
"mean_tokens", "dropped_fields", "tool_declarations", "error", ...}`` (the counts of
`remote.prep.preparer.Summary.counts`). A dataset that cannot be checked (no sample file, a
tokenizer that does not load) gets an entry with `error` set, never a crash;
the workstation decides what fails. Nothing is written to disk.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from remote.control_plane import collector
from remote.prep.errors import PrepError
from remote.prep.load import Source, iter_rows
from remote.prep.preparer import Summary, run_prep
from remote.prep.prep_settings import PrepSettings, Target
from remote.prep.lean_imports import import_transformers
from remote.vocabulary.wire import emit


def validate(request: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per dataset of `request` (the CLI's JSON argument)."""
    target = Target.from_config(request.get("target") or {})
    try:
        # Always in this process: samples are small, and workers would cost more than they save.
        settings = replace(PrepSettings.from_config(request.get("stage") or {}), num_proc=1)
    except PrepError as exc:
        return [_error(name, ds, str(exc)) for name, ds in (request.get("datasets") or {}).items()]
    tokenizer = functools.cache(lambda: _tokenizer(target))  # loaded for the first sample there is to read
    entries = []
    for name, dataset in (request.get("datasets") or {}).items():
        kind = dataset.get("kind", "native")
        try:
            source = _sample(name, dataset)
            summary = _check(source, name, kind, target, settings, tokenizer()[0])
        except PrepError as exc:
            entries.append(_error(name, dataset, str(exc)))
            continue
        note = f"tokens not counted: {tokenizer()[1]}" if tokenizer()[1] else None
        entries.append({"dataset": name, "kind": kind, **summary.counts(), "error": None, "note": note})
    return entries


def _check(source: Source, name: str, kind: str, target: Target, settings: PrepSettings, tokenizer: Any) -> Summary:
    return run_prep(iter_rows(source), (kind, name, target, settings, tokenizer, tokenizer is not None), settings)


def _sample(name: str, dataset: dict[str, Any]) -> Source:
    """The dataset's sample to read, or a `PrepError` saying why there is none."""
    sample = dataset.get("sample")
    if not sample:
        raise PrepError(f"datasets.{name} has no sample: set `sample` to a small local file")
    if not Path(sample).is_file():  # `sample`, else `source` (the workstation says which the user wrote)
        if dataset.get("sample_key") == "source":
            raise PrepError(f"datasets.{name}.source: {sample} is not a file here, and datasets.{name} has no sample: "
                            "fix the path, or set `sample` to a small local file")
        raise PrepError(f"datasets.{name}.sample: {sample} does not exist")
    return Source(str(sample), limit=dataset.get("limit"))


def _tokenizer(target: Target) -> tuple[Any, str | None]:
    """The tokenizer, loaded once for every dataset, or the reason it cannot be (then rows
    are still normalised and counted: the schema is what loses datasets)."""
    if not target.tokenizer:
        return None, "target.tokenizer is not set: prep of a native dataset needs the target's tokenizer"
    try:
        return target.load(), None
    except PrepError as exc:
        return None, str(exc)


def _error(name: str, dataset: dict[str, Any], message: str) -> dict[str, Any]:
    return {
        "dataset": name,
        "kind": dataset.get("kind", "native"),
        **Summary().counts(),
        "error": message,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m remote.prep.validate '<json request>' (or - to read it from stdin)", file=sys.stderr)
        return 2
    try:
        request = json.loads(sys.stdin.read() if argv[0] == "-" else argv[0])  # "-": any number of datasets
    except json.JSONDecodeError as exc:
        print(f"validate: the request is not JSON ({exc.msg} at position {exc.pos})", file=sys.stderr)
        return 2
    if not isinstance(request, dict):
        print("validate: the request must be a JSON object with target, stage and datasets", file=sys.stderr)
        return 2
    if Target.from_config(request.get("target") or {}).tokenizer:
        collector.tune()
        import_transformers()
    emit(validate(request))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
