"""Prep over a whole dataset: batches of rows through normalise, template and tokenise.

Every row read ends up either kept or counted under a skip reason, so the
summary always adds up (``rows == kept + skipped``). Batches run in this
process or, with ``num_proc > 1``, in a pool of workers that each load the
tokenizer once; results come back in order, so outputs are deterministic.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from remote.vocabulary.hints import TEACH_A_FAMILY
from remote.prep.load import Malformed
from remote.prep.normalise import Record, Skip, normalise
from remote.prep.prompt_turns import ask_points
from remote.prep.prep_settings import PrepSettings, Target
from remote.prep.sequences import Sequence, sequences
from remote.prep.summary import Summary
from remote.prep.template import ChatTemplate, tool_declaration
from remote.prep.tokenise import Encoder, EncodingStats, Tokens
from remote.prep.tool_ids import kimi_ids


@dataclass
class Prepared:
    """One batch's kept records (with their tokens, for native) and its counts."""

    records: list[Record]
    tokens: list[Tokens]
    summary: Summary


@dataclass
class Started:
    """A batch normalised and rendered, waiting for the tokenizer."""

    records: list[Record]
    #: Per record: its training sequences (native), or the prompt's text for the stats (prompts).
    sequences: list[list[Sequence]]
    texts: list[str | None]
    summary: Summary


class Preparer:
    """Turns batches of rows into records; one per process."""

    def __init__(self, kind: str, dataset: str, target: Target, settings: PrepSettings, tokenizer: Any = None,
                 tokenize: bool = True) -> None:
        self.kind = kind
        self.dataset = dataset
        self.settings = settings
        # NOTE: tokenize=False is `inv validate` on a workstation without the target's tokenizer:
        # rows are normalised and counted (the schema bugs), tokens are not.
        if tokenizer is None and tokenize and (kind == "native" or target.tokenizer):
            tokenizer = target.load()
        self.tokenizer = tokenizer
        self.template = ChatTemplate(tokenizer, settings.chat_template_kwargs) if tokenizer is not None else None
        self.encoder = Encoder(tokenizer, settings.max_length, settings.overlong) if tokenizer is not None else None

    def process(self, batch: list[tuple[int, Any]]) -> Prepared:
        return self.finish(self.start(batch))

    def start(self, batch: list[tuple[int, Any]]) -> Started:
        """The Python half: rows normalised and rendered with the chat template."""
        started = Started([], [], [], Summary(rows=len(batch)))
        for record in self._normalised(batch, started.summary):
            try:
                if self.kind == "native" and self.template is not None:
                    if self.template.renders_call_ids:
                        record.conversations = kimi_ids(record.conversations)
                    keep = self.settings.reasoning == "preserve"
                    found, text = sequences(self.template, record.conversations, record.tools, keep), None
                elif self.kind == "native":
                    found, text = [], None
                else:
                    found, text = [], self._prompt_text(record)
                    started.summary.turns_to_ask += len(ask_points(record.conversations))
                    started.summary.turns_left_out += record.left_out
            except Skip as skip:
                started.summary.skip_reasons[skip.reason] += 1
                continue
            if record.tools and found:
                started.summary.tool_declarations[tool_declaration(found[0].text, record.tools)] += 1
            started.records.append(record)
            started.sequences.append(found)
            started.texts.append(text)
        return started

    def finish(self, started: Started) -> Prepared:
        """The tokenizer's half (it releases the GIL, so it can overlap the next `start`)."""
        summary = started.summary
        if self.kind != "native" or self.encoder is None:
            summary.kept = summary.records = len(started.records)
            texts = [t for t in started.texts if t is not None]
            if self.tokenizer is not None and texts:
                for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]:
                    summary.add_tokens(len(ids))
            return Prepared(started.records, [], summary)
        flat = [sequence for found in started.sequences for sequence in found]
        encoded = iter(self.encoder.encode(flat))
        kept, kept_tokens = [], []
        for record, found in zip(started.records, started.sequences):
            results = [next(encoded) for _ in found]
            good = [(s, t) for s, t in zip(found, results) if isinstance(t, Tokens)]
            if not good:
                summary.skip_reasons[results[0].reason] += 1
                continue
            for result in results:
                if isinstance(result, Skip):
                    summary.records_skipped[result.reason] += 1
            summary.kept += 1
            summary.turns_expanded += len(good) - 1
            last = len(found[-1].conversation)
            for sequence, tokens in good:
                turn = len(sequence.conversation)
                # The record of the row's last turn keeps the row's id; the others name their turn.
                record_id = record.id if turn == last else f"{record.id}#{turn - 1}"
                kept.append(Record(record_id, sequence.conversation, record.tools, record.format))
                kept_tokens.append(tokens)
                summary.assistant_turns += len(sequence.spans)
                summary.add_tokens(len(tokens.input_ids), int(tokens.loss_mask.sum()), int(tokens.reasoning_mask.sum()))
                summary.truncated += tokens.truncated
        summary.records = len(kept)
        summary.encoding = EncodingStats(self.encoder.stats.method)
        summary.encoding.merge(self.encoder.stats)
        self.encoder.stats = EncodingStats(self.encoder.stats.method)
        return Prepared(kept, kept_tokens, summary)

    def _prompt_text(self, record: Record) -> str | None:
        """A prompt's first request as the target will see it, for the token stats; None leaves it out of them."""
        if self.template is None:
            return None
        first = ask_points(record.conversations)[0]
        try:
            return self.template.render(record.conversations[: first + 1], record.tools, generation_prompt=True)
        except Skip:
            return None  # stats only: never lose a prompt over them

    def _normalised(self, batch: list[tuple[int, Any]], summary: Summary) -> Iterator[Record]:
        for index, row in batch:
            try:
                if isinstance(row, Malformed):
                    raise Skip(row.reason)
                record = normalise(row, index, self.kind, self.dataset)
            except Skip as skip:
                summary.skip_reasons[skip.reason] += 1
                continue
            except Exception as exc:  # a shape normalise did not foresee must not stop the dataset
                summary.skip_reasons[f"unreadable row ({type(exc).__name__}: {str(exc)[:60]})"] += 1
                continue
            summary.formats[record.format] += 1
            summary.dropped_fields.update(record.dropped)
            yield record


def run_prep(
    rows: Iterable[Any],
    preparer_args: tuple,
    settings: PrepSettings,
    sink: Callable[[Prepared], None] | None = None,
    progress: Any = None,
) -> Summary:
    """Prep every row; `sink` receives each batch's kept records, `progress` the counts.

    `preparer_args` are `Preparer`'s arguments, so workers can build their own.
    A bad tokenizer or template raises `PrepError` here, before any worker starts.
    """
    local = Preparer(*preparer_args)  # fails fast, in this process, on a bad target
    total = Summary()
    batches = _batches(rows, settings.batch_size)
    with _Mapper(local, preparer_args, settings.num_proc) as mapper:
        for prepared in mapper(batches):
            total.merge(prepared.summary)
            if sink is not None:
                sink(prepared)
            if progress is not None:
                _report(progress, prepared.summary, total)
    return total


def kept_ratio_failure(summary: Summary, min_kept_ratio: float) -> str | None:
    """Why this dataset's yield fails the stage (zero or too few records kept), or None."""
    reasons = "; ".join(f"{reason}: {n}" for reason, n in summary.top_reasons()) or "no rows read"
    if summary.kept == 0:
        return f"no records kept from {summary.rows} rows; top skip reasons: {reasons}. {TEACH_A_FAMILY}"
    ratio = summary.kept / summary.rows
    if ratio < min_kept_ratio:
        return (
            f"kept {summary.kept} of {summary.rows} rows ({ratio:.1%}), under min_kept_ratio {min_kept_ratio:.1%};"
            f" top skip reasons: {reasons}"
        )
    return None


def _batches(rows: Iterable[Any], size: int) -> Iterator[list[tuple[int, Any]]]:
    numbered = enumerate(rows)
    while batch := list(itertools.islice(numbered, size)):
        yield batch


def _report(progress: Any, batch: Summary, total: Summary) -> None:
    if batch.records:
        progress.written(batch.records)
    for reason, n in batch.skip_reasons.items():
        progress.skipped(reason, n)
    progress.metrics(rows=total.rows, tokens=total.tokens)


class _Mapper:
    """Maps batches through a `Preparer` here, or through a pool of workers."""

    def __init__(self, local: Preparer, preparer_args: tuple, num_proc: int) -> None:
        self.local = local
        self.preparer_args = preparer_args
        self.num_proc = num_proc
        self.pool = None

    def __enter__(self) -> Callable[[Iterable[list]], Iterator[Prepared]]:
        if self.num_proc == 1:
            # NOTE: only a Rust tokenizer releases the GIL for long enough to gain from a thread;
            # with a tiktoken one (Kimi's) the thread's contention made prep a quarter slower.
            fast = self.local.encoder is not None and self.local.encoder.releases_gil
            return self._overlapped if fast else self._in_order
        global _worker
        if "fork" in multiprocessing.get_all_start_methods():
            # NOTE: forked workers inherit this process's preparer (tokenizer
            # loaded, template compiled), so they start in milliseconds.
            _worker = self.local
            self.pool = multiprocessing.get_context("fork").Pool(self.num_proc)
        else:
            self.pool = multiprocessing.get_context("spawn").Pool(
                self.num_proc, initializer=_init_worker, initargs=self.preparer_args
            )
        return self._in_pool

    def _in_order(self, batches: Iterable[list]) -> Iterator[Prepared]:
        for batch in batches:
            yield self.local.process(batch)

    def _overlapped(self, batches: Iterable[list]) -> Iterator[Prepared]:
        """In this process, one batch is tokenised on a thread while the next is rendered."""
        with ThreadPoolExecutor(1) as tokenizer_thread:
            pending = None
            for batch in batches:
                started = self.local.start(batch)
                if pending is not None:
                    yield pending.result()
                pending = tokenizer_thread.submit(self.local.finish, started)
            if pending is not None:
                yield pending.result()

    def _in_pool(self, batches: Iterable[list]) -> Iterator[Prepared]:
        """Results in order, with a few batches in flight (`Pool.imap` would read the whole dataset ahead)."""
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(self.pool.apply_async(_work, (batch,)))
            if len(pending) >= 2 * self.num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate() if exc[0] else self.pool.close()
            self.pool.join()


_worker: Preparer | Exception | None = None


def _init_worker(*preparer_args: Any) -> None:
    global _worker
    # NOTE: an initializer that raises makes Pool respawn workers forever; the
    # error is kept and raised by the first task instead, which ends the run.
    try:
        _worker = Preparer(*preparer_args)
    except Exception as exc:
        _worker = exc


def _work(batch: list[tuple[int, Any]]) -> Prepared:
    if isinstance(_worker, Exception):
        raise _worker
    return _worker.process(batch)
