"""Word when a pipeline run ends (`notify:` of the inventory), sent from the host: the laptop may be closed.

The pipeline runner calls `run_ended` once, after its run (remote/orchestration/runner.py `main`), and
`watching` around it when `notify.jobs` asks for word of each failed job too. What happened is read from
the jobs' states on disk, as `inv status` reads them, never from the runner's memory. A webhook gets JSON
that Slack's and Discord's incoming webhooks both take (``text`` and ``content``, the same message) and,
for other readers, the same facts under ``aerie``; a command gets the message on its stdin and in
``$AERIE_NOTIFY_MESSAGE``. Its URL is a secret (remote/vocabulary/secrets.py): it is never logged, and
an error that would name it names ``***``. A notification that fails is a line in the runner's log and
never fails the run.

Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from remote.control_plane import jobs
from remote.vocabulary import layout, secrets
from remote.vocabulary.states import DRAFT, JobState

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Iterator

#: The next command the message names, by how the run ended.
NEXT = {"succeeded": "`inv eval` measures the draft; `inv status` shows the run",
        "failed": "`inv rerun --failed` starts the failed jobs and those behind them; `inv status` says why",
        "stopped": "`inv rerun --failed` resumes the run where it stopped"}
#: How often `watching` reads the jobs' states.
WATCH_SECONDS = 5.0
FAILED = (JobState.FAILED.value, JobState.DIED.value, JobState.BROKEN.value, JobState.EMPTY.value)


def run_ended(root: Path, stage_config: dict[str, Any]) -> None:
    """Send word of the run's end, if `notify:` asks for it."""
    settings = stage_config.get("notify")
    if not settings:
        return
    try:
        _run_ended(root, stage_config, settings)
    except Exception as exc:  # noqa: BLE001 — word about a run never fails the run
        print(f"notify: not sent: {type(exc).__name__}: {exc}", flush=True)


def _run_ended(root: Path, stage_config: dict[str, Any], settings: dict[str, Any]) -> None:
    keys = [node["key"] for node in stage_config.get("plan", [])]
    states = job_states(root, keys)
    state = run_state(root, states)
    counts = counted(states)
    accept = (states.get(f"{DRAFT}/train") or {}).get("metrics", {}).get("accept_length")
    send(settings, {"event": "run", "state": state, "counts": counts, "accept_length": accept,
                    "failed": sorted(k for k, job in states.items() if job["state"] in FAILED), "next": NEXT[state]},
         message(root, state, counts, states, accept))


def job_states(root: Path, keys: list[str]) -> dict[str, dict[str, Any]]:
    now = time.time()
    return {key: jobs.describe(layout.key_dir(root, key), now) for key in keys
            if (layout.key_dir(root, key) / layout.STATE).exists()}


def run_state(root: Path, states: dict[str, dict[str, Any]]) -> str:
    """``stopped`` when `inv stop` asked the runner to end, ``succeeded`` when every job did, else ``failed``."""
    if (layout.runner_dir(root) / layout.STOP).exists():
        return "stopped"
    done = all(job["state"] == JobState.SUCCEEDED.value for job in states.values())
    return "succeeded" if states and done else "failed"


def counted(states: dict[str, dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in states.values():
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    return counts


def message(root: Path, state: str, counts: dict[str, int], states: dict[str, dict[str, Any]],
            accept: float | None) -> str:
    said = ", ".join(f"{n} {name}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    failed = [f"{key} ({job['state']}: {job['message'][:200]})" for key, job in states.items() if job["state"] in FAILED]
    lines = [f"aerie: the pipeline on {socket.gethostname()}:{root} {state}: {said or 'no jobs'}"]
    lines += failed[:5] + ([f"and {len(failed) - 5} more"] if len(failed) > 5 else [])
    if accept is not None:
        lines.append(f"draft: held-out accept length {accept:.3f}")
    lines.append(f"next: {NEXT[state]}")
    return "\n".join(lines)


def send(settings: dict[str, Any], facts: dict[str, Any], text: str) -> None:
    """The webhook and the command, each on its own: one failing is logged and the other still goes."""
    timeout = float(settings.get("timeout") or 5.0)
    url = settings.get("url") or ""
    hidden = [os.environ.get(name, "") for name in secrets.REFERENCE.findall(url)]
    if url:
        _logged("webhook", lambda: post(url, facts, text, timeout), hidden)
    if settings.get("command"):
        _logged("command", lambda: run_command(settings["command"], facts, text, timeout), hidden)


def post(url: str, facts: dict[str, Any], text: str, timeout: float) -> None:
    body = json.dumps({"text": text, "content": text[:2000], "aerie": facts}).encode()  # Discord: 2000 at most
    request = urllib.request.Request(secrets.expand(url), data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "aerie"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()


def run_command(command: str, facts: dict[str, Any], text: str, timeout: float) -> None:
    env = {**os.environ, "AERIE_NOTIFY_MESSAGE": text, "AERIE_NOTIFY_STATE": facts["state"],
           "AERIE_NOTIFY_EVENT": facts["event"], "AERIE_NOTIFY_FACTS": json.dumps(facts)}
    done = subprocess.run(["/bin/sh", "-c", command], input=text.encode(), env=env, timeout=timeout,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit {done.returncode}: {last}")


def _logged(what: str, call: Any, hidden: list[str]) -> None:
    """`call`, its failure a line of the log with the webhook's secrets (`hidden`) masked; never raised."""
    try:
        call()
        print(f"notify: {what} sent", flush=True)
    except Exception as exc:  # noqa: BLE001 — word about a run never fails the run
        print(f"notify: the {what} failed: {secrets.mask(f'{type(exc).__name__}: {exc}', hidden)}", flush=True)


@contextmanager
def watching(root: Path, stage_config: dict[str, Any]) -> Iterator[None]:
    """While the run goes on: word of each job that fails, once, when `notify.jobs` asks for it."""
    settings = stage_config.get("notify") or {}
    if not settings.get("jobs"):
        yield
        return
    keys = [node["key"] for node in stage_config.get("plan", [])]
    told = {k for k, job in job_states(root, keys).items() if job["state"] in FAILED}  # a resumed run's old failures
    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_SECONDS):
            for key, job in job_states(root, keys).items():
                if job["state"] in FAILED and key not in told:
                    told.add(key)
                    send(settings, {"event": "job", "state": job["state"], "job": key, "next": NEXT["failed"]},
                         f"aerie: {key} {job['state']} on {socket.gethostname()}: {job['message'][:300]}")

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
