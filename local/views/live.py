"""The live table (`--watch`, `inv run --follow`, the demo), redrawn in place, or without a terminal a line per
change of state (local/views/state_lines.py), until the run ends."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from remote.vocabulary.states import RUNNER, RUNNER_STAGE, JobState

if TYPE_CHECKING:
    from rich.console import Console


def refresh(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float,
            until: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """The live table (`--watch`, `--follow`, the demo): fetched and redrawn every `interval` seconds
    until `until(state)` (None: never, on a terminal); the last state, whose frame stays on the screen.
    Without a terminal, a line per change of state instead, until the run ends. Ctrl-C is raised to the
    task (local/cli.py's `on_interrupt` says what goes on), once the terminal is whole again."""
    from rich.live import Live

    from local.views import status_table

    if not console.is_terminal:
        return lines_until_ended(fetch, console, title, interval, until or _all_ended)
    until = until or (lambda state: False)
    state = fetch()
    live = Live(status_table.render(state, title=title, fit=True), console=console, auto_refresh=False)
    # NOTE: not `with Live(...)`: a Ctrl-C while its first frame is drawn, inside `__enter__`, would skip
    # `__exit__` and leave the cursor hidden and stdout and stderr redirected into the table. Ctrl-C is not
    # caught: once `stop` has shown the cursor and ended the frame, the task says what goes on.
    try:
        live.start(refresh=True)
        while not until(state):
            time.sleep(interval)
            state = fetch()
            live.update(status_table.render(state, title=title, fit=True), refresh=True)
    finally:
        live.stop()
    return state


def follow(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float = 2.0) -> dict[str, Any]:
    """Refresh the table until the pipeline has ended (its runners; on Slurm, its jobs); the final status."""
    return refresh(fetch, console, title, interval, until=_pipeline_ended)


def lines_until_ended(fetch: Callable[[], dict[str, Any]], console: Console, title: str, interval: float,
                      until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The watch without a terminal (local/views/state_lines.py), then the whole table once, as `inv status` prints it."""
    from local.views import state_lines
    from local.views import status_table

    state = state_lines.follow(fetch, console, title, interval, until)
    console.print(status_table.render(state, title=title))
    return state


def _pipeline_ended(state: dict[str, Any]) -> bool:
    runners = [j for j in state["jobs"] if (j["dataset"], j["stage"]) == (RUNNER, RUNNER_STAGE)]
    return _all_ended({**state, "jobs": runners or state["jobs"]}) or bool(state.get("unreachable"))


def _all_ended(state: dict[str, Any]) -> bool:
    """Nothing left to watch: every job has ended (a blocked one too: only `inv rerun --failed` moves it)."""
    return all(JobState(job["state"]).is_terminal() for job in state["jobs"])
