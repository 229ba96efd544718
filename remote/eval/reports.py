"""`inv eval`'s report: accept length and speed-up per setting, the fastest, and loud warnings.

The report is JSON (``report.json`` in the job's output and ``eval.json``
beside the draft)::

    {"baseline": {"tokens_per_s", ...},
     "configs": [{"num_steps", "topk", "num_draft_tokens", "accept_length", "tokens_per_s", "speedup", ...}],
     "best": {...the fastest config..., "flags": [...]},
     "warnings": [...]}
"""

from __future__ import annotations

from typing import Any

from remote.eval.eval_settings import Setting
from remote.eval.sglang import Measurement

#: An acceptance length this close to 1.0 means the draft's tokens are (almost) never kept.
UNUSED_BELOW = 1.1


def config_entry(setting: Setting, measured: Measurement, baseline: Measurement) -> dict[str, Any]:
    accept = measured.accept_length
    return {
        "num_steps": setting.num_steps, "topk": setting.topk, "num_draft_tokens": setting.num_draft_tokens,
        "accept_length": round(accept, 3) if accept is not None else None,
        "tokens_per_s": round(measured.tokens_per_s, 2),
        "speedup": round(measured.tokens_per_s / baseline.tokens_per_s, 3) if baseline.tokens_per_s else None,
        "completion_tokens": measured.completion_tokens, "spec_verify_ct": measured.verify_ct,
        "seconds": round(measured.seconds, 3),
    }


def build(baseline: Measurement, results: list[tuple[Setting, Measurement]], draft: str,
          server_args: list[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report of one evaluation: every setting against the baseline, the fastest, the warnings."""
    configs = [config_entry(setting, measured, baseline) for setting, measured in results]
    best = max(configs, key=lambda c: c["tokens_per_s"], default=None)
    if best is not None:
        setting = Setting.of(best)
        best = {**best, "flags": [*server_args, *setting.flags(draft)]}
    return {
        "baseline": {"tokens_per_s": round(baseline.tokens_per_s, 2), "completion_tokens": baseline.completion_tokens,
                     "seconds": round(baseline.seconds, 3)},
        "configs": configs,
        "best": best,
        "warnings": warnings(configs, best),
        "draft": draft,
        **(extra or {}),
    }


def warnings(configs: list[dict[str, Any]], best: dict[str, Any] | None) -> list[str]:
    found = []
    for c in configs:
        where = f"num_steps {c['num_steps']}, topk {c['topk']}, num_draft_tokens {c['num_draft_tokens']}"
        if c["accept_length"] is None:
            found.append(f"{where}: the server reported no spec_verify_ct: speculation did not run "
                         "(check --speculative-algorithm EAGLE3 and the server's log)")
        elif c["accept_length"] < UNUSED_BELOW:
            found.append(f"{where}: accept length {c['accept_length']:.2f} is about 1.0: the draft's tokens are "
                         "almost never kept (wrong algorithm, auxiliary layers or vocabulary, or an untrained draft)")
    if best is not None and best["speedup"] is not None and best["speedup"] < 1:
        found.append(f"speculation makes serving SLOWER: the best setting gives {best['tokens_per_s']:.1f} tok/s against "
                     f"{best['tokens_per_s'] / best['speedup']:.1f} without it (speed-up {best['speedup']:.2f}); "
                     "serve without a draft until it is better")
    return found
