"""Speaking to SGLang for `inv eval`: its launch flags and its native ``/generate``.

What SGLang documents, and where (sgl-project/sglang):

- ``python -m sglang.launch_server --model-path M --host H --port P``; the
  speculative flags are fields of ``ServerArgs`` in
  ``python/sglang/srt/server_args.py``: ``--speculative-algorithm`` (``EAGLE3``
  for an EAGLE-3 draft; ``EAGLE`` feeds it the wrong states),
  ``--speculative-draft-model-path``, ``--speculative-num-steps`` ("the number
  of steps sampled from draft model"), ``--speculative-eagle-topk`` ("the
  number of tokens sampled from the draft model in eagle2 each step") and
  ``--speculative-num-draft-tokens`` (the tokens verified per step; with
  top-k 1 it is ``num_steps + 1``).
- ``POST /generate`` with ``{"input_ids" | "text", "sampling_params":
  {"temperature", "max_new_tokens"}}`` answers ``{"text", "meta_info": {...}}``;
  ``meta_info.completion_tokens`` counts the output tokens and
  ``meta_info.spec_verify_ct`` the verification forward passes of a
  speculative request. SGLang's own EAGLE tests (its spec-decoding test kit,
  ``test_batch_generation``) compute the acceptance length as
  ``Σ completion_tokens / Σ spec_verify_ct``, which is what aerie reports.
- ``GET /server_info`` returns the ``ServerArgs`` (``speculative_algorithm``,
  ``speculative_num_steps``, ...), read by `remote.eagle3.server_check.server_info`.
- A speculative server's ``--max-running-requests`` defaults to 48
  (``arg_groups/speculative_hook.py``: "Max running requests is reset to 48
  for speculative decoding"); a server without speculation has no such cap.
  So that the baseline and the grid batch alike, every server gets the same
  value: the inventory's (in ``server_args``), else 48.

Checked against SGLang 0.5.23: tests/test_sglang_args.py runs every command
built here through SGLang's own ``ServerArgs`` parser and resolution.

Standard library only.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from remote.eval.eval_settings import EvalSettings, Server

#: SGLang's --max-running-requests for a speculative server that does not set it.
SPECULATIVE_MAX_RUNNING = 48
MAX_RUNNING_FLAG = "--max-running-requests"


def server_args(settings: EvalSettings) -> list[str]:
    """The inventory's server flags, with the same --max-running-requests for every server of the comparison."""
    args = list(settings.server_args)
    if any(a == MAX_RUNNING_FLAG or a.startswith(MAX_RUNNING_FLAG + "=") or a == "--config" for a in args):
        return args
    return [*args, MAX_RUNNING_FLAG, str(SPECULATIVE_MAX_RUNNING)]


def batching_warnings(settings: EvalSettings) -> list[str]:
    """Where the servers may batch differently and aerie cannot tell (a --config file)."""
    args = list(settings.server_args)
    if "--config" in args and not any(a == MAX_RUNNING_FLAG or a.startswith(MAX_RUNNING_FLAG + "=") for a in args):
        return [f"server_args pass --config: if it does not set max-running-requests, SGLang caps the speculative "
                f"servers at {SPECULATIVE_MAX_RUNNING} running requests and the baseline not at all, so the speed-ups "
                f"compare different batching; add {MAX_RUNNING_FLAG} to stages.eval.server_args"]
    return []


def launch_argv(settings: EvalSettings, server: Server) -> list[str]:
    """The server's arguments (after the launcher): the target, with `server`'s draft and setting or none."""
    return ["--model-path", settings.model, "--host", "127.0.0.1", "--port", str(settings.port),
            *server_args(settings), *server.flags()]


def launch_command(settings: EvalSettings, server: Server) -> str:
    """The shell command that starts the target (with `server`'s speculation, or none)."""
    launcher = settings.launcher  # `{python} -m sglang.launch_server` unless the inventory says otherwise
    return launcher.replace("{python}", shlex.quote(sys.executable)) + " " + shlex.join(launch_argv(settings, server))


@dataclass
class Measurement:
    """What one pass of the prompts through a server gave."""

    completion_tokens: int
    verify_ct: int
    seconds: float
    requests: int

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def accept_length(self) -> float | None:
        """Σ completion_tokens / Σ spec_verify_ct; None when the server verified nothing (no speculation)."""
        return self.completion_tokens / self.verify_ct if self.verify_ct else None


class GenerateError(Exception):
    """A /generate request failed."""


def generate(url: str, prompt: dict[str, Any], max_new_tokens: int, timeout: float) -> dict[str, Any]:
    """One greedy request to SGLang's native /generate; its meta_info."""
    body = {**prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}}
    request = urllib.request.Request(url.rstrip("/") + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise GenerateError(f"/generate answered HTTP {exc.code}: {exc.read()[:200]!r}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise GenerateError(f"/generate failed: {exc}") from None
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict) or "completion_tokens" not in meta:
        raise GenerateError(f"/generate answered without meta_info.completion_tokens: {str(answer)[:200]}")
    return meta


def measure(url: str, prompts: list[dict[str, Any]], max_new_tokens: int, concurrency: int,
            timeout: float) -> Measurement:
    """Send every prompt (`concurrency` at a time) and time the whole pass."""
    started = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        metas = list(pool.map(lambda p: generate(url, p, max_new_tokens, timeout), prompts))
    finally:
        # NOTE: not `with`: on `inv stop` the caller must go on to stop the server at once, which
        # is what ends the requests still in flight, instead of waiting for them here.
        pool.shutdown(wait=False, cancel_futures=True)
    seconds = time.monotonic() - started
    return Measurement(
        completion_tokens=sum(int(m["completion_tokens"]) for m in metas),
        verify_ct=sum(int(m.get("spec_verify_ct") or 0) for m in metas),
        seconds=seconds,
        requests=len(metas),
    )
