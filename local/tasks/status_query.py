"""`inv status`: every job's state from one remote command per host, as a table, JSON, or refreshed in place."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from local.views import live, status_data

if TYPE_CHECKING:  # rich: imported while the host answers (`while_importing`), for the table only
    from rich.console import Console


def status(fetch: Callable[[], dict[str, Any]], console: Console, title: str, as_json: bool = False,
           watch: float = 0) -> dict[str, Any]:
    """One status (from `fetch`: one remote command per host), as a table, JSON, or refreshed in place."""
    if watch and not as_json:
        return live.refresh(fetch, console, title, watch)
    if as_json:
        state = fetch()
        print(json.dumps(status_data.as_json(state), indent=2))
        return state
    state, status_table = while_importing(fetch, "local.views.status_table")  # rich: for the table only
    console.print(status_table.render(state, title=title))
    return state


def while_importing(fetch: Callable[[], Any], module: str) -> tuple[Any, Any]:
    """`fetch()` (a remote command: mostly waiting) in a thread while `module` is imported here, so that
    the host answers while the laptop loads the code that shows the answer."""
    import importlib
    import threading

    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append((fetch(), None))
        except BaseException as exc:  # noqa: BLE001 — re-raised below, in the caller's thread
            answer.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    loaded = importlib.import_module(module)
    worker.join()
    value, error = answer[0]
    if error is not None:
        raise error
    return value, loaded
