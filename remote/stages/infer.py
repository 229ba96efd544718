"""The infer stage: the target model answers each prompt that prep wrote.

Reads ``<data>/prep/prompts.jsonl`` (records ``{"id", "conversations", "tools"?}``: the system
prompt, every user turn, an agent row's original calls and tool results) and writes
``<data>/infer/conversations.jsonl``: each conversation as the target regenerated it, every turn
in order after its own earlier answers (`remote.infer.conversation`), with their
``reasoning_content`` and ``tool_calls``, and per record what was not regenerated and why
(``regenerated``, counted in the manifest's ``turns`` and in the metrics): a native dataset,
which prep then tokenises.

Resumable by record id. Answers are appended to ``conversations.jsonl.part``
and made durable per batch; records the server refuses (a 4xx other than
408/429, with what its body says; an empty answer) go to ``skipped.jsonl``,
each with the settings it was asked with. A restart reads both, asks only for
the rest, and the finished file is renamed into place when every prompt is
answered or skipped. A refusal is kept only while the settings it was asked
with hold and the server has answered something: after an edit of
``stages.infer`` (its model, its server), or when the server refused
everything, a rerun asks again. ``.journal.json`` remembers which prompts and
sampling settings the journal belongs to: new prompts start it over; changed
sampling settings are refused once some prompt is answered, so one dataset
never mixes two temperatures.

A run in which the server refused every request fails with the server's reason
(its log shows the first refusal of each reason), never `empty`. A finished
``conversations.jsonl`` and its manifest stay in place while a later run
(`inv launch --force`, a fresh `inv run`, a rerun that asks refusals again)
adds to it: only that run's success replaces them.

A record that still fails after its retries (server down, 5xx, timeouts) is
counted under its reason and left for the next run; the job then fails, and
``inv rerun --failed`` continues it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from queue import SimpleQueue
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Iterator

from remote.infer.autotune import Autotuner, Fixed
from remote.infer import infer_files
from remote.infer.client import ChatClient, Result, check_reachable
from remote.infer.conversation import Regenerated, regenerate
from remote.infer.infer_files import (  # noqa: F401 (MANIFEST, PROMPTS, STATE: the stage's files, named here too)
    MANIFEST, OUTPUT, PART, PROMPTS, SKIPPED, STATE, InferError, Upstream, open_journal, read_prompts,
    read_upstream,
)
from remote.infer.journal import Journal
from remote.infer.tally import Tally
from remote.infer.infer_settings import InferSettings, SettingsError
from remote.control_plane.progress import Progress, count_lines
from remote import stages
from remote.stages import StageContext

#: Seconds of answers behind the `tokens_per_s` metric.
RATE_WINDOW = 60.0
#: Seconds between two readings of the answers for the tuner, while conversations go on.
OBSERVE_EVERY = 1.0
#: Distinct refusal reasons (a 4xx with its server's words) counted apart; the rest count under one.
REASONS_KEPT = 20


class InferRun:
    """One run of the stage over one dataset's prompts."""

    def __init__(self, output: Path, settings: InferSettings, progress: Progress, finished: bool = False) -> None:
        self.output = output
        self.settings = settings
        self.progress = progress
        self.client = ChatClient(settings)
        self.finished = Journal(output / OUTPUT) if finished else None  # an earlier run's answers, kept in place
        self.answers = Journal(output / PART)
        self.refused = Journal(output / SKIPPED)
        self.done: set[str] = set()
        self.failed: dict[str, int] = {}
        self.failed_in_a_row = 0
        self.asked_with = asked_with(settings)
        self.refusals: dict[str, int] = {}  # this run's and kept ones, by reason
        self.logged: set[str] = set()  # the reasons whose first refusal the log shows
        self.answered_any = False
        self.totals = {"retries": 0, "completion_tokens": 0}
        self.tally = Tally()
        self.tuner: Autotuner | Fixed = (
            Autotuner(settings.max_concurrency) if settings.is_auto else Fixed(settings.concurrency))
        self.recent: deque[tuple[float, int]] = deque()  # (when, completion tokens) of recent answers
        self.in_flight = 0  # conversations in flight (each one request at a time)
        self.replies: SimpleQueue[tuple[int, Result]] = SimpleQueue()  # each request answered, for the tuner
        self.started = time.monotonic()
        self.total = 0

    def resume(self) -> int:
        """Read what earlier runs finished; return how many records that is. A refusal is kept only if
        it was asked with these settings and the server has answered something: else it is asked again."""
        for journal in ([self.finished] if self.finished else []) + [self.answers]:
            for record in journal.read():
                self.done.add(record["id"])
                self.tally.add(record)
                self.progress.written()
        self.answered_any = bool(self.done)
        refused = list(self.refused.read())
        kept = [r for r in refused if self.answered_any and r.get("asked_with") == self.asked_with]
        if len(kept) < len(refused):
            self.refused.replace(kept)
            print(f"infer: asking again {len(refused) - len(kept)} prompts the server refused "
                  f"({'its settings changed since' if self.answered_any else 'it answered none'})", flush=True)
        for record in kept:
            self.done.add(record["id"])
            self.count_refusal(record.get("reason", "refused"))
        self.progress.resumed()
        return len(self.done)

    def refusal(self, result: Regenerated) -> dict[str, Any]:
        """The journal's line for a prompt the server refused (or whose only answer was empty, or truncated
        and dropped): its reason with the server's words, the first of each reason also in the log."""
        failure = result.failure
        reason = (result.ended or "empty answer") if failure is None else (
            f"{failure.reason}: {failure.detail}" if failure.detail else failure.reason)
        if reason not in self.refusals and len(self.refusals) >= REASONS_KEPT:
            reason = f"{failure.reason if failure else reason} (other reasons: see the log)"
        if reason not in self.logged:
            self.logged.add(reason)
            print(f"infer: the server refused prompt {result.record['id']}: {reason}", flush=True)
        return {"id": result.record["id"], "reason": reason, "asked_with": self.asked_with}

    def count_refusal(self, reason: str) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        self.progress.skipped(reason)

    def refuses_everything(self) -> bool:
        """The server refused every request it got and answered none (a misnamed model, a bad setting)."""
        return not self.answered_any and bool(self.refusals)

    def answer_all(self, prompts: Iterator[dict[str, Any]]) -> int:
        """Answer every prompt not yet done; return how many prompts there are in all."""
        self.total = 0
        todo = self.todo(prompts)
        pending: set[Future[Regenerated]] = set()  # each conversation in flight: one request at a time
        workers = self.settings.max_concurrency if self.settings.is_auto else self.settings.concurrency
        with ThreadPoolExecutor(workers, thread_name_prefix="infer") as pool:
            # NOTE: threads start only as requests need them, so `auto` at 12 holds 12, not 256.
            def fill() -> None:
                while len(pending) < self.tuner.concurrency and (record := next(todo, None)) is not None:
                    pending.add(pool.submit(self.regenerate, record))
                self.in_flight = len(pending)

            fill()
            while pending:
                # NOTE: a conversation of many turns outlasts many answers: the tuner hears of each answer
                # within a second, not when its conversation ends.
                finished, _ = wait(pending, timeout=OBSERVE_EVERY, return_when=FIRST_COMPLETED)
                pending -= finished
                self.in_flight = len(pending)
                self.observe_answers()
                fill()  # first: the server is not left short of requests while the batch is journaled
                self.collect(finished)
        self.observe_answers()
        return self.total

    def regenerate(self, record: dict[str, Any]) -> Regenerated:
        return regenerate(record, self.ask, self.settings.turns, self.settings.truncated)

    def ask(self, request: dict[str, Any]) -> Result:
        """One request of a conversation, noted with the concurrency it was sent at for the tuner.

        NOTE: after the tuner lowers the level, the conversations already started go on at the old load
        until they end; requests sent meanwhile ran under another load than the level's and are not
        counted for it (level 0 matches no window)."""
        level = self.tuner.concurrency if self.in_flight <= self.tuner.concurrency else 0
        result = self.client.answer(request)
        self.replies.put((level, result))
        return result

    def todo(self, prompts: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The prompts still to ask for, counting every prompt into `total` on the way."""
        for record in prompts:
            self.total += 1
            if record["id"] in self.done or self.is_server_gone() or self.is_refusing_all():
                continue  # a gone server: still count the prompts, so the message says how many are left
            yield record

    def collect(self, finished: set[Future[Regenerated]]) -> None:
        """Record the finished conversations as one durable batch."""
        answered, refused = [], []
        for future in finished:
            result = future.result()
            self.totals["retries"] += result.retries
            if result.turns:
                answered.append(result)
            elif result.failure is None or not result.failure.retryable:
                refused.append(self.refusal(result))
            else:
                self.fail(result)
        self.answers.append([r.to_json() for r in answered])
        self.refused.append(refused)
        self.count(answered, refused)

    def observe_answers(self) -> None:
        """Tell the tuner how the requests answered since went. Retries and final failures are the server's
        overload; a 4xx refusal is the prompt's own."""
        while not self.replies.empty():
            level, result = self.replies.get()
            if result.answer is not None:
                self.tuner.observe(level, result.answer.completion_tokens, result.seconds, error=result.retries > 0)
                now = time.monotonic()
                self.recent.append((now, result.answer.completion_tokens))
                while self.recent and self.recent[0][0] < now - RATE_WINDOW:
                    self.recent.popleft()
            elif result.failure is not None and result.failure.retryable:
                self.tuner.observe(level, 0, 0.0, error=True)

    def tokens_per_s(self) -> float:
        """Output tokens/s over the last `RATE_WINDOW` seconds (from this run's start, at first)."""
        if not self.recent:
            return 0.0
        span = max(time.monotonic() - max(self.recent[0][0], self.started), 1e-3)
        return sum(tokens for _, tokens in self.recent) / min(span, RATE_WINDOW)

    def fail(self, result: Regenerated) -> None:
        reason = result.failure.reason if result.failure else "no answer"
        self.failed[reason] = self.failed.get(reason, 0) + 1
        self.failed_in_a_row += 1
        self.progress.skipped(reason)

    def count(self, answered: list[Regenerated], refused: list[dict[str, Any]]) -> None:
        """Counters move only after the batch is on disk, so they never exceed the journal."""
        for result in answered:
            self.done.add(result.record["id"])
            self.tally.add(result.to_json())
            self.totals["completion_tokens"] += result.completion_tokens
            self.progress.written()
        for record in refused:
            self.done.add(record["id"])
            self.count_refusal(record["reason"])
        if answered:
            self.failed_in_a_row = 0
            self.answered_any = True
        self.progress.metrics(**self.totals, **self.tally.metrics(), concurrency=self.tuner.concurrency,
                              tokens_per_s=round(self.tokens_per_s(), 1))

    def is_server_gone(self) -> bool:
        """True after so many records in a row failed that the server must be down.

        NOTE: without this, a dead server would cost every remaining record its
        full retry budget (hours for 88k records) before the job could fail.
        """
        return self.failed_in_a_row >= max(8, 2 * self.tuner.concurrency)

    def is_refusing_all(self) -> bool:
        """True once as many requests as `is_server_gone` counts were refused and none answered: the
        rest would be refused too, and asking them would only bury the reason."""
        return self.refuses_everything() and sum(self.refusals.values()) >= max(8, 2 * self.tuner.concurrency)

    def close(self) -> None:
        self.answers.close()
        self.refused.close()


def finish(output: Path, ctx: StageContext, upstream: Upstream, settings: InferSettings, run: InferRun) -> None:
    """The journal made the finished file (`remote.infer.infer_files.finish`), its manifest written last."""
    run.close()
    infer_files.finish(output, run.finished is not None, {
        "release": ctx.release,
        "dataset": ctx.dataset,
        "upstream": {"stage": "prep", "release": upstream.release, "prompts_sha256": upstream.sha256},
        "records": run.progress.records,
        "skip_reasons": dict(run.progress.skip_reasons),
        "turns": run.tally.manifest(),
        "server_url": settings.server_url,
        "sampling": settings.sampling(),
        "finished_at": time.time(),
    })


def run_stage(ctx: StageContext, progress: Progress) -> None:
    """The whole stage; raises `InferError` for anything the user must act on."""
    try:
        settings = InferSettings.from_config(ctx.stage_config)
    except (SettingsError, TypeError) as exc:
        raise InferError(str(exc)) from None
    upstream = read_upstream(ctx)
    check_reachable(settings)
    ctx.output.mkdir(parents=True, exist_ok=True)
    finished = open_journal(ctx.output, upstream, settings, progress)
    progress.expect(count_lines(upstream.prompts))
    run = InferRun(ctx.output, settings, progress, finished)
    try:
        before = run.resume()
        progress.note(f"answering prompts from {settings.server_url} ({before} done before)")
        total = run.answer_all(read_prompts(upstream.prompts, progress))
    finally:
        run.close()
    if run.refuses_everything():
        why = "; ".join(f"{reason} (×{n})" for reason, n in sorted(run.refusals.items(), key=lambda kv: -kv[1])[:3])
        raise InferError(
            f"the server at {settings.server_url} refused every request and answered none: {why}; "
            f"fix stages.infer in the inventory (model {settings.model!r}), then `inv rerun --failed` asks again"
        )
    left = total - len(run.done)
    if left:
        why = ", ".join(f"{reason}: {n}" for reason, n in sorted(run.failed.items()))
        raise InferError(
            f"{left} of {total} prompts not answered ({why or 'stopped early'}) by {settings.server_url}; "
            "check the server, then `inv rerun --failed` continues where this stopped"
        )
    finish(ctx.output, ctx, upstream, settings, run)
    progress.note(f"answered {progress.records} of {total} prompts, {run.tally.answered} of their "
                  f"{run.tally.rows_turns} turns")


def main() -> None:
    stages.main("infer", run_stage, (InferError,))


def asked_with(settings: InferSettings) -> str:
    """A short digest of what decides the server's answer to a prompt (its address, the sampling): a
    refusal under other settings may be answered now."""
    what = json.dumps({"server_url": settings.server_url, **settings.sampling()}, sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()[:16]


if __name__ == "__main__":
    main()
