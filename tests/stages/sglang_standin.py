"""A stand-in for ``python -m sglang.launch_server``: its flags, ``/health``, ``/server_info``
and the native ``/generate`` with ``meta_info``, over a known model of speculation.

Real SGLang needs a GPU (and the target's weights); this stand-in lets `inv eval`
be tested end to end on any machine. It parses a subset of SGLang's flags
strictly, and answers as SGLang does (`remote/eval/sglang.py` cites where SGLang
defines them). tests/test_sglang_args.py feeds it and the pinned real SGLang the
same bad command lines: it refuses each one SGLang refuses, and takes every
command `inv eval` builds. Like SGLang it caps a speculative server at 48
running requests unless told otherwise (``/server_info``'s
``max_running_requests``).

The model, from the environment (which `stages.eval.server_env` sets, so a
missing variable also shows that the settings did not reach the server):

- ``STANDIN_ACCEPT`` (required): the chance that one draft token is accepted;
  a draft whose ``config.json`` has ``standin_accept`` has that chance instead
  (so the drafts `inv eval` compares can differ, as real ones do).
  With top-k ``k`` a step is accepted with ``a = 1 - (1 - accept)**k``; with
  ``--speculative-algorithm EAGLE`` the draft gets the wrong states: ``a = 0``.
- A request asks for ``n`` tokens and gets ``n``; with speculation it takes
  ``ceil(n / L)`` verifications, ``L = 1 + a + a**2 + ... + a**num_steps``.
- Time: ``STANDIN_TOKEN_SECONDS`` per token without speculation, and per
  verification ``(1 + STANDIN_DRAFT_COST * num_draft_tokens)`` times that.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

if not __package__:  # NOTE: `inv eval` runs this file as a script, from outside the checkout's path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness.json_http import JSONHandler  # noqa: E402


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--mem-fraction-static", type=float)
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--speculative-algorithm", type=str.upper, choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE"])
    parser.add_argument("--speculative-draft-model-path")
    parser.add_argument("--speculative-num-steps", type=int)
    parser.add_argument("--speculative-eagle-topk", type=int)
    parser.add_argument("--speculative-num-draft-tokens", type=int)
    parser.add_argument("--max-running-requests", type=int)
    parser.add_argument("--device")
    return parser.parse_args(argv)


def step_acceptance(accept: float, algorithm: str | None, topk: int) -> float:
    return 0.0 if algorithm == "EAGLE" else 1 - (1 - accept) ** topk


def verifications(tokens: int, accept: float, algorithm: str | None, num_steps: int, topk: int) -> int:
    a = step_acceptance(accept, algorithm, topk)
    length = sum(a**i for i in range(num_steps + 1))
    return math.ceil(tokens / length)


def seconds(tokens: int, verify_ct: int | None, num_draft_tokens: int, token_seconds: float, draft_cost: float) -> float:
    if verify_ct is None:
        return tokens * token_seconds
    return verify_ct * token_seconds * (1 + draft_cost * num_draft_tokens)


def main(argv: list[str]) -> None:
    args = parse(argv)
    if "STANDIN_ACCEPT" not in os.environ:
        sys.exit("stand-in: STANDIN_ACCEPT is not set (stages.eval.server_env did not reach the server)")
    accept = float(os.environ["STANDIN_ACCEPT"])
    token_seconds = float(os.environ.get("STANDIN_TOKEN_SECONDS", "0.01"))
    draft_cost = float(os.environ.get("STANDIN_DRAFT_COST", "0.2"))
    speculative = args.speculative_algorithm is not None
    if speculative:
        draft_config = Path(args.speculative_draft_model_path or "") / "config.json"
        if not draft_config.is_file():
            sys.exit(f"stand-in: no draft config.json in {args.speculative_draft_model_path}")
        accept = float(json.loads(draft_config.read_text()).get("standin_accept", accept))
    journal = os.environ.get("STANDIN_JOURNAL")
    cap = args.max_running_requests or (48 if speculative else None)  # SGLang's speculative_hook.py
    info = {"model_path": args.model_path, "port": args.port, "tp_size": args.tp_size, "max_running_requests": cap,
            **{k: v for k, v in vars(args).items() if k.startswith("speculative_")}}
    time.sleep(float(os.environ.get("STANDIN_START_SECONDS", "0.3")))  # loading the model

    class Handler(JSONHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/health":
                self.send_json(200, {})
            elif self.path in ("/server_info", "/get_server_info"):
                self.send_json(200, info)
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/generate" or not ("text" in body or "input_ids" in body):
                self.send_json(400, {"error": "expected /generate with text or input_ids"})
                return
            tokens = int(body["sampling_params"]["max_new_tokens"])
            meta: dict[str, Any] = {"prompt_tokens": len(body.get("input_ids") or str(body.get("text")).split()),
                                    "completion_tokens": tokens, "finish_reason": {"type": "length"}}
            verify_ct = None
            if speculative:
                verify_ct = verifications(tokens, accept, args.speculative_algorithm, args.speculative_num_steps,
                                          args.speculative_eagle_topk)
                meta["spec_verify_ct"] = verify_ct
            time.sleep(seconds(tokens, verify_ct, args.speculative_num_draft_tokens or 0, token_seconds, draft_cost))
            if journal:
                with open(journal, "a") as handle:
                    handle.write(json.dumps({"port": args.port, "algorithm": args.speculative_algorithm,
                                             "num_steps": args.speculative_num_steps, "draft": args.speculative_draft_model_path,
                                             "max_running_requests": cap, "prompt": body.get("input_ids") or body.get("text"),
                                             "max_new_tokens": tokens, "temperature": body["sampling_params"].get("temperature")}) + "\n")
            self.send_json(200, {"text": "x " * tokens, "meta_info": meta})

    print(f"stand-in SGLang on {args.host}:{args.port}: {' '.join(argv)}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
