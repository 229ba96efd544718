"""Stand-in extract and train commands for the chunked route's tests: the driver, not the model, is under test.

``chunk_standin.py extract BYTES_PER_TOKEN``: for the chunk's prep records, one file per
record of ``tokens x BYTES_PER_TOKEN`` bytes (a record's states) and a manifest, like
the real stage's layout. ``chunk_standin.py train LOG``: appends what it trained on
(the pass, the extract directories and their record counts) to LOG, and writes a draft.
``sleep=S`` in ``$STANDIN_SLEEP`` slows each command so a test can kill it mid-way.
"""

import json
import os
import sys
import time
from pathlib import Path

from remote.control_plane.progress import Progress
from remote.stages import StageContext


def extract(ctx: StageContext, per_token: int, progress: Progress) -> None:
    import pyarrow.parquet as pq

    prep = ctx.inputs("prep")[0]
    shard = ctx.output / "shard-00000"
    shard.mkdir(parents=True, exist_ok=True)
    count = 0
    for file in sorted(prep.glob("tokens-*.parquet")):
        for i, ids in enumerate(pq.read_table(file, columns=["input_ids"])["input_ids"].to_pylist()):
            (shard / f"data_{count:09d}.ckpt").write_bytes(b"\0" * (len(ids) * per_token))
            count += 1
            progress.written()
    (ctx.output / "manifest.json").write_text(json.dumps({"records": count}))


def train(ctx: StageContext, log: Path, progress: Progress) -> None:
    # Like the real trainer's checkpoint (`remote.eagle3.resume`), LOG records the passes done: a pass
    # the driver runs again after it ended trains nothing. One append, so a kill leaves it whole or absent.
    name = ctx.stage_config["chunk_pass"]
    done = [json.loads(line)["pass"] for line in log.read_text().splitlines()] if log.exists() else []
    seen = {str(d): len(list((Path(d) / "shard-00000").glob("*.ckpt"))) for d in ctx.config["inputs"]}
    if name not in done:
        with log.open("a") as handle:
            handle.write(json.dumps({"pass": name, "inputs": seen, "epochs": ctx.stage_config["epochs"],
                                     "schedule_steps": ctx.stage_config.get("schedule_steps")}) + "\n")
    (ctx.output / "draft").mkdir(parents=True, exist_ok=True)
    progress.written(sum(seen.values()))


if __name__ == "__main__":
    context = StageContext.from_env()
    time.sleep(float(os.environ.get("STANDIN_SLEEP", "0")))
    with Progress.from_env() as progress:
        if sys.argv[1] == "extract":
            extract(context, int(sys.argv[2]), progress)
        else:
            train(context, Path(sys.argv[2]), progress)
