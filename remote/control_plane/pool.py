"""`each`: work over many jobs on a few plain threads, the results in order.

It overlaps the file system's rename latency, the forks and stop's waits of many jobs. Each job has
its own lock, so jobs never race with each other.

NOTE: plain threads rather than `concurrent.futures`: that module (with the `logging` it imports) is
slower to import than a launch of many jobs is to record them, and every `inv launch` and `inv stop`
starts Python on the host.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Callable


def each(work: Callable[[Any], Any], items: list[Any], threads: int = 8) -> list[Any]:
    """`work` over `items`, each thread taking every `threads`-th item. Every item is worked even when
    one fails; the first failure is raised after, in the caller's thread."""
    import threading

    results: list[Any] = [None] * len(items)
    failures: list[BaseException] = []

    def share(first: int) -> None:
        for index in range(first, len(items), threads):
            try:
                results[index] = work(items[index])
            except BaseException as exc:  # noqa: BLE001 — raised below, in the caller's thread
                failures.append(exc)

    workers = [threading.Thread(target=share, args=(first,)) for first in range(min(threads, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    return results
