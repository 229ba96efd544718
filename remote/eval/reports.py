"""`inv eval`'s report: every draft's accept length and speed-up per setting, their ranking, which to serve.

The report is JSON (``report.json`` in the job's output, and ``eval.json``
beside train's draft when it is one of those compared)::

    {"baseline": {"tokens_per_s", ...},
     "drafts": {NAME: {"path", "configs": [{"num_steps", "topk", "num_draft_tokens", "accept_length",
                                            "tokens_per_s", "speedup", ...}],
                       "best": {...its fastest config..., "flags": [...]}}},
     "ranking": [NAME, ...],            # fastest first, by the tok/s of each draft's best setting
     "best": {...the fastest config of all..., "draft": NAME, "flags": [...]},
     "serve": NAME | null,              # the fastest draft if it beats the baseline, else none
     "warnings": [...]}
"""

from __future__ import annotations

from typing import Any

from remote.eval.eval_settings import Server, Setting
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


def draft_entry(path: str, results: list[tuple[Setting, Measurement]], baseline: Measurement,
                server_args: list[str]) -> dict[str, Any]:
    """One draft: each of its settings against the baseline, and its fastest with the flags that serve it."""
    configs = [config_entry(setting, measured, baseline) for setting, measured in results]
    best = max(configs, key=lambda c: c["tokens_per_s"], default=None)
    if best is not None:
        best = {**best, "flags": [*server_args, *Setting.of(best).flags(path)]}
    return {"path": path, "configs": configs, "best": best}


def build(baseline: Measurement, results: list[tuple[Server, Measurement]], server_args: list[str],
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report of one evaluation: every draft's settings against the one baseline, ranked, the one to serve."""
    by_draft: dict[str, tuple[str, list[tuple[Setting, Measurement]]]] = {}
    for server, measured in results:
        assert server.draft and server.path and server.setting, "the baseline is measured apart"
        by_draft.setdefault(server.draft, (server.path, []))[1].append((server.setting, measured))
    drafts = {name: draft_entry(path, runs, baseline, server_args) for name, (path, runs) in by_draft.items()}
    # NOTE: sorted() is stable: drafts equally fast keep the inventory's order.
    ranking = sorted((n for n in drafts if drafts[n]["best"]), key=lambda n: -drafts[n]["best"]["tokens_per_s"])
    best = {**drafts[ranking[0]]["best"], "draft": ranking[0]} if ranking else None
    serve = best["draft"] if best and (best["speedup"] or 0) > 1 else None
    base = {"tokens_per_s": round(baseline.tokens_per_s, 2), "completion_tokens": baseline.completion_tokens,
            "seconds": round(baseline.seconds, 3)}
    return {
        "baseline": base,
        "drafts": drafts,
        "ranking": ranking,
        "best": best,
        "serve": serve,
        "warnings": warnings(drafts, best, serve, base["tokens_per_s"]),
        **(extra or {}),
    }


def warnings(drafts: dict[str, dict[str, Any]], best: dict[str, Any] | None, serve: str | None,
             baseline_tokens_per_s: float) -> list[str]:
    found = []
    for name, entry in drafts.items():
        for c in entry["configs"]:
            where = f"{name}, num_steps {c['num_steps']}, topk {c['topk']}, num_draft_tokens {c['num_draft_tokens']}"
            if c["accept_length"] is None:
                found.append(f"{where}: the server reported no spec_verify_ct: speculation did not run "
                             "(check --speculative-algorithm EAGLE3 and the server's log)")
            elif c["accept_length"] < UNUSED_BELOW:
                found.append(f"{where}: accept length {c['accept_length']:.2f} is about 1.0: the draft's tokens are "
                             "almost never kept (wrong algorithm, auxiliary layers or vocabulary, or an untrained draft)")
    if best is not None and serve is None and best["speedup"] is not None:
        every = "the draft" if len(drafts) == 1 else f"every one of the {len(drafts)} drafts"
        found.append(f"speculation makes serving SLOWER with {every}: the fastest, {best['draft']} with "
                     f"{Setting.of(best).label()}, gives {best['tokens_per_s']:.1f} tok/s against "
                     f"{baseline_tokens_per_s:.1f} without it (speed-up {best['speedup']:.2f}); "
                     "serve without a draft until one beats that")
    return found
