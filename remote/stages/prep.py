"""The prep stage: one dataset read, normalised, tokenised and written, every loss counted.

Run by the supervisor as ``python -m remote.stages.prep`` (see
`remote.stages` for the environment). Exit codes: 0 records written; 1 the
yield guard failed (no records kept, or fewer than ``min_kept_ratio``), with
the top skip reasons on stderr; 2 bad input (a missing file, a bad setting,
a tokenizer that cannot be loaded), with one line saying what to fix.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from typing import Any

from remote.prep.errors import PrepError
from remote.prep.count import estimate_rows
from remote.prep.load import Source, iter_rows
from remote.prep.preparer import Summary, kept_ratio_failure, run_prep
from remote.prep.prep_settings import PrepSettings, Target
from remote.prep.lean_imports import import_pyarrow, import_transformers
from remote.prep.write import OutputWriter
from remote.control_plane import collector
from remote.control_plane.progress import Progress, read_json
from remote.stages import StageContext

KINDS = ("native", "prompts")


def main() -> int:
    collector.tune()
    try:
        ctx = StageContext.from_env()
    except KeyError as exc:
        print(f"prep: environment variable {exc.args[0]} is not set (the supervisor sets AERIE_*)", file=sys.stderr)
        return 2
    if Target.from_config(ctx.shared_config.get("target") or {}).tokenizer:  # it tokenises and writes shards
        import_transformers()
        import_pyarrow()
    try:
        return run(ctx)
    except PrepError as exc:
        print(f"prep {ctx.dataset}: {exc}", file=sys.stderr)
        return 2


def run(ctx: StageContext) -> int:
    """Prep the dataset of `ctx` into `ctx.output`; the exit code."""
    if ctx.kind not in KINDS:
        raise PrepError(f"datasets.{ctx.dataset}.kind must be one of {', '.join(KINDS)} (got {ctx.kind!r})")
    settings = _with_infer_kwargs(ctx, PrepSettings.from_config(ctx.stage_config))
    source = Source.from_config(ctx.source or ctx.dataset_config.get("source", ""), ctx.dataset_config)
    target = Target.from_config(ctx.shared_config.get("target") or {})
    started = time.time()
    with Progress.from_env() as progress:
        progress.note(f"reading {source.source}")
        rows = estimate_rows(source)
        if rows:
            progress.expect(rows)  # every row is kept or skipped
        writer = OutputWriter(ctx.output, ctx.kind, settings.shard_size)
        try:
            summary = run_prep(iter_rows(source), (ctx.kind, ctx.dataset, target, settings), settings, writer, progress)
        except BaseException:
            writer.abort()
            raise
        failure = kept_ratio_failure(summary, settings.min_kept_ratio)
        if failure:
            writer.abort()
            progress.note(failure[:200])
            print(f"prep {ctx.dataset}: {failure}", file=sys.stderr)
            return 1
        writer.commit(_manifest(ctx, source, target, settings, summary, time.time() - started))
        line = (f"kept {summary.kept} of {summary.rows} rows: {summary.records} records, {summary.tokens} tokens, "
                f"{summary.loss_tokens} learned ({summary.reasoning_tokens} of reasoning)")
        progress.note(line)
        print(f"prep {ctx.dataset}: {line}; skipped {dict(summary.top_reasons())}")
    return 0


def _with_infer_kwargs(ctx: StageContext, settings: PrepSettings) -> PrepSettings:
    """For the tokenize stage, the chat template kwargs the infer stage's server used: its answers
    were generated after contexts rendered with them, so the records' contexts must be too."""
    if ctx.stage != "tokenize":
        return settings
    manifest = read_json(ctx.upstream("infer") / "manifest.json")
    used = ((manifest or {}).get("sampling") or {}).get("chat_template_kwargs") if isinstance(manifest, dict) else None
    if not isinstance(used, dict):
        return settings
    return replace(settings, chat_template_kwargs={**settings.chat_template_kwargs, **used})


def _manifest(
    ctx: StageContext, source: Source, target: Target, settings: PrepSettings, summary: Summary, seconds: float
) -> dict[str, Any]:
    return {
        "dataset": ctx.dataset,
        "kind": ctx.kind,
        "release": ctx.release,
        "source": asdict(source),
        **summary.counts(),
        "tokens": summary.token_stats(),
        "encoding": asdict(summary.encoding),
        "tokenizer": target.tokenizer,
        "trust_remote_code": target.trust_remote_code,
        "settings": asdict(settings),
        "seconds": round(seconds, 2),
        "created_at": time.time(),
    }


if __name__ == "__main__":
    sys.exit(main())
