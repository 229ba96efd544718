"""The eval stage (`inv eval`, job ``draft/eval``): the drafts measured on SGLang as they will be served.

It starts the target with SGLang once without speculation, then once per
draft of ``stages.eval.drafts`` and setting of ``stages.eval.grid``
(``--speculative-algorithm EAGLE3``), sends the same held-out prompts through
``/generate`` (greedy, a fixed ``max_new_tokens``) to each, and reports per
draft and setting the acceptance length (Σ completion_tokens / Σ
spec_verify_ct), the output tokens per second and the speed-up against the
run without speculation; the drafts ranked, and the one to serve, if any beats
the baseline (`remote.eval.reports`).

Settings (``stages.eval``, complete from the workstation): those of
`remote.eval.eval_settings.EvalSettings`. Every draft is checked before the
first server starts, so a bad path is one line naming it, not a server that
dies an hour in.

Only one server runs at a time, and it is always stopped: after each setting,
on failure, and on ``inv stop`` (SIGTERM). One left by a stage that was killed
outright is stopped by the next run (``server.json``).

Output: ``$AERIE_OUTPUT/report.json`` (the same as ``eval.json`` beside train's
draft when it is one of those compared), and ``server-*.log``.
"""

from __future__ import annotations

import signal
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from remote import stages
from remote.control_plane import inference_server, processes
from remote.vocabulary import layout
from remote.eagle3 import StageInputError, model_config
from remote.eval import prompt_source
from remote.eval import reports
from remote.eval.eval_settings import EvalSettings, Server, Setting
from remote.eval.sglang import (GenerateError, Measurement, batching_warnings, launch_command, measure,
                                server_args)
from remote.control_plane.progress import Progress, read_json, write_json_atomic
from remote.stages import StageContext

STOP_GRACE = 4.0  # seconds; `inv stop` kills the job's group 10 s after its SIGTERM
REPORT_BESIDE_DRAFT = "eval.json"


class EvalError(Exception):
    """The evaluation cannot go on (its port is taken): one line. A server that does not start is
    `inference_server.ServerError`, with what its log says went wrong."""


class Stopped(Exception):
    """SIGTERM (`inv stop`): end now, stopping the server on the way out."""


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    settings = EvalSettings.from_config(ctx.stage_config)
    check_drafts(settings.drafts, trained_draft(ctx))
    prompts = read_prompts(ctx, settings)
    servers = settings.servers()
    progress.expect(len(servers))  # the baseline and every draft x setting: `inv status` counts them down
    stop_leftover_server(ctx.output / "server.json")
    signal.signal(signal.SIGTERM, _on_term)
    print(f"eval: {len(prompts)} prompts, {settings.max_new_tokens} new tokens each, {settings.concurrency} at a "
          f"time; a baseline, then {len(settings.drafts)} draft(s) x {len(settings.grid)} setting(s)", flush=True)

    baseline = measure_on_server(ctx, settings, servers[0], prompts, progress)
    results = [(server, measure_on_server(ctx, settings, server, prompts, progress)) for server in servers[1:]]
    report = reports.build(baseline, results, server_args(settings), {
        "prompts": len(prompts), "max_new_tokens": settings.max_new_tokens,
        "concurrency": settings.concurrency, "release": ctx.release,
    })
    report["warnings"] += batching_warnings(settings)
    write_report(ctx, settings, report)
    best = report["best"] or {}
    progress.metrics(baseline_tokens_per_s=report["baseline"]["tokens_per_s"],
                     best_speedup=best.get("speedup"), best_accept_length=best.get("accept_length"))
    progress.note("; ".join([verdict(report), *report["warnings"]]))
    for line in report["warnings"]:
        print(f"WARNING: {line}", flush=True)
    print(f"eval: {verdict(report)}", flush=True)
    return report


def trained_draft(ctx: StageContext) -> Path:
    """Where train writes its draft (the default of ``stages.eval.drafts``)."""
    return layout.stage_output(ctx.data, "train") / "draft"


def check_drafts(drafts: dict[str, str], trained: Path) -> None:
    """Every draft is an SGLang draft directory (its config.json an object), or one line naming each that is not."""
    problems = []
    for name, path in drafts.items():
        why = draft_problem(Path(path))
        if why:
            fix = "train first, or set stages.eval.drafts" if Path(path) == trained else f"fix stages.eval.drafts.{name}"
            problems.append(f"draft {name!r}: no draft at {path} ({why}): {fix}")
    if problems:
        raise StageInputError("; ".join(problems))


def draft_problem(path: Path) -> str | None:
    """What keeps SGLang from loading `path` as a draft, checked here in a second rather than by a server."""
    try:
        model_config.read(path, "stages.eval.drafts")
    except model_config.ConfigError as exc:
        return exc.problem
    return None


def read_prompts(ctx: StageContext, settings: EvalSettings) -> list[dict[str, Any]]:
    if settings.prompts:
        return prompt_source.from_file(Path(settings.prompts), settings.num_prompts)
    return prompt_source.from_training(trained_draft(ctx).parent, settings.num_prompts)


def write_report(ctx: StageContext, settings: EvalSettings, report: dict[str, Any]) -> None:
    """report.json, and eval.json beside train's draft when it is one of the drafts compared."""
    write_json_atomic(ctx.output / "report.json", report)
    trained = trained_draft(ctx)
    if trained not in {Path(path) for path in settings.drafts.values()}:
        return
    try:
        write_json_atomic(trained.parent / REPORT_BESIDE_DRAFT, report)
    except OSError as exc:
        report["warnings"].append(f"could not write {trained.parent / REPORT_BESIDE_DRAFT}: {exc}")
        write_json_atomic(ctx.output / "report.json", report)


def verdict(report: dict[str, Any]) -> str:
    """The one line of what to serve."""
    best = report["best"]
    if best is None:
        return "no draft was measured"
    at = f"{best['draft']} with {Setting.of(best).label()}, speed-up {best['speedup']}"
    return f"serve {at}" if report["serve"] else f"serve no draft: none beats the baseline (the fastest: {at})"


def measure_on_server(ctx: StageContext, settings: EvalSettings, server: Server,
                      prompts: list[dict[str, Any]], progress: Progress) -> Measurement:
    name = server.label()
    command = launch_command(settings, server)
    url = f"http://127.0.0.1:{settings.port}"
    log = ctx.output / f"server-{server.slug()}.log"
    with running(command, log, ctx.output / "server.json", url, settings, progress, name):
        progress.note(f"{name}: sending {len(prompts)} prompts")
        # NOTE: one short request first, untimed: the first pass through a fresh server pays for warm-up.
        measure(url, prompts[:1], 8, 1, settings.request_timeout)
        measured = measure(url, prompts, settings.max_new_tokens, settings.concurrency, settings.request_timeout)
    accept = f", accept length {measured.accept_length:.3f}" if measured.accept_length else ""
    print(f"{name}: {measured.completion_tokens} tokens in {measured.seconds:.2f}s, "
          f"{measured.tokens_per_s:.1f} tok/s{accept}", flush=True)
    progress.written()
    return measured


@contextmanager
def running(command: str, log: Path, record: Path, url: str, settings: EvalSettings, progress: Progress,
            name: str) -> Iterator[int]:
    """The server of one setting, healthy, for the length of the block; always stopped after."""
    port = settings.port
    if is_listening(port):
        raise EvalError(f"port {port} on the host is already in use (another server?): "
                        "stop it or set stages.eval.port")
    progress.note(f"{name}: starting the server")
    print(f"server: {command}", flush=True)
    since = inference_server.log_end(log)
    pid = inference_server.start(command, log, env=settings.server_env)
    started = processes.identity(pid)
    write_json_atomic(record, started)
    try:
        inference_server.wait_healthy(url, settings.server_start_timeout, pid, log, beat=progress.beat, since=since)
        yield pid
    finally:
        inference_server.stop(started, grace=STOP_GRACE)
        record.unlink(missing_ok=True)


def stop_leftover_server(record: Path) -> None:
    """A server a killed run left behind (its pid checked with its start time and boot, never a reused pid)."""
    left = read_json(record, {})
    if isinstance(left, dict) and processes.is_ours(left):
        print(f"server: stopping pid {left['pid']}, left by an earlier run", flush=True)
        inference_server.stop(left, grace=STOP_GRACE)
    record.unlink(missing_ok=True)


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _on_term(signum: int, frame: object) -> None:
    # Once: `inv stop` signals the job's group and the supervisor passes its own SIGTERM on, so a
    # second one can land while the first unwinds through `inference_server.stop` and would cut it short,
    # leaving the server (a session of its own) running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped()


def main() -> None:
    try:
        stages.main("eval", run, (StageInputError, EvalError, GenerateError, inference_server.ServerError))
    except Stopped:
        raise SystemExit("eval: stopped; the server is stopped too") from None


if __name__ == "__main__":
    main()
