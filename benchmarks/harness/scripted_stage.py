"""A stage command whose behaviour the test chooses, plugged in through the stage contract.

Not a mock of aerie: it is an ordinary stage that the real supervisor runs. The
dataset's `source` says what to do, e.g. ``records=5 sleep=0.1 exit=0``:

- ``records``: how many records to report written (one per ``sleep`` seconds)
- ``total``: the total to announce first (`Progress.expect`), for the time left
- ``skip``: how many to report skipped, as ``reason`` (default "bad row")
- ``exit``: the exit code
- ``hold``: seconds to sleep afterwards without reporting (for `stalled`)
- ``unless``: a file on the host; when it exists, exit 0 (the user's "fix")
- ``child``: start a grandchild `sleep` and write its pid to the output dir
- ``need_url`` / ``shun_url``: fail unless / if that URL answers (the managed server)
- ``need_layers``: fail unless the job's settings hold these layers (``1,2,3``: `stages.extract.layers`)

With a directory argument (``scripted_stage.py DIR``), the plan is read from
``DIR/<dataset>.<stage>`` instead (default ``records=1``), so that every stage of a
pipeline has its own, and the start and end times go to ``DIR/trace/``.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from remote.control_plane.progress import Progress
from remote.stages import StageContext


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def read_plan(ctx: StageContext) -> tuple[dict[str, str], Path | None]:
    if len(sys.argv) < 2:
        return dict(item.split("=", 1) for item in ctx.source.split()), None
    plans = Path(sys.argv[1])
    path = plans / f"{ctx.dataset}.{ctx.stage}"
    text = path.read_text() if path.exists() else "records=1"
    return dict(item.split("=", 1) for item in text.split()), plans / "trace"


def main() -> int:
    ctx = StageContext.from_env()
    plan, trace = read_plan(ctx)
    started = time.time()
    if plan.get("need_url") and not answers(plan["need_url"]):
        print(f"server at {plan['need_url']} is not up", flush=True)
        return 4
    layers = ctx.stage_config.get("layers")
    if plan.get("need_layers") and layers != [int(n) for n in plan["need_layers"].split(",")]:
        print(f"layers {layers} are not the target's {plan['need_layers']}", flush=True)
        return 6
    if plan.get("shun_url") and answers(plan["shun_url"]):
        print(f"server at {plan['shun_url']} still holds the GPU", flush=True)
        return 5
    code = work(ctx, plan)
    if trace is not None:
        trace.mkdir(exist_ok=True)
        (trace / f"{ctx.dataset}.{ctx.stage}.json").write_text(json.dumps({"start": started, "end": time.time(), "code": code}))
    return code


def work(ctx: StageContext, plan: dict[str, str]) -> int:
    if plan.get("child"):
        child = subprocess.Popen(["sleep", "300"])
        (ctx.output / "child.pid").write_text(str(child.pid))
    with Progress.from_env(interval=0) as progress:
        print(f"scripted stage for {ctx.dataset} writes to {ctx.output}", flush=True)
        if plan.get("total"):
            progress.expect(int(plan["total"]))
        for _ in range(int(plan.get("skip", 0))):
            progress.skipped(plan.get("reason", "bad row"))
        for index in range(int(plan.get("records", 0))):
            time.sleep(float(plan.get("sleep", 0)))
            progress.written()
            print(f"record {index + 1}", flush=True)
    time.sleep(float(plan.get("hold", 0)))
    code = int(plan.get("exit", 0))
    if code and plan.get("unless") and os.path.exists(plan["unless"]):
        code = 0
    if code:
        print(f"ValueError: scripted failure for {ctx.dataset}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
