"""A stage command whose behaviour the test chooses, plugged in through the stage contract.

Not a mock of aerie: it is an ordinary stage that the real supervisor runs. The
dataset's `source` says what to do, e.g. ``records=5 sleep=0.1 exit=0``:

- ``records``: how many records to report written (one per ``sleep`` seconds)
- ``skip``: how many to report skipped, as ``reason`` (default "bad row")
- ``exit``: the exit code
- ``hold``: seconds to sleep afterwards without reporting (for `stalled`)
- ``unless``: a file on the host; when it exists, exit 0 (the user's "fix")
- ``child``: start a grandchild `sleep` and write its pid to the output dir
"""

import os
import subprocess
import sys
import time

from remote.progress import Progress
from remote.stages import StageContext


def main() -> int:
    ctx = StageContext.from_env()
    plan = dict(item.split("=", 1) for item in ctx.source.split())
    if plan.get("child"):
        child = subprocess.Popen(["sleep", "300"])
        (ctx.output / "child.pid").write_text(str(child.pid))
    with Progress.from_env(interval=0) as progress:
        print(f"scripted stage for {ctx.dataset} writes to {ctx.output}", flush=True)
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
