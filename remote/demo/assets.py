"""The demo's tiny target built offline on the host (`inv demo`), unless it is there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from remote.control_plane import collector
from remote.demo import tiny_model, tiny_tokenizer


def build(root: Path) -> dict[str, object]:
    """The tokenizer and a Llama wired to recite (`remote.demo.tiny_model`) under `root`/assets, built
    under a temporary name and renamed into place."""
    out = root / "assets" / "tiny-target"
    # NOTE: a target without the recital file is an older demo's random one: its draft cannot learn.
    if (out / "config.json").exists() and (out / tiny_model.RECITAL_FILE).exists():
        return {"path": str(out), "built": False}
    collector.tune()  # the build imports torch and transformers into the verb's process
    building = out.with_name(out.name + ".tmp")
    shutil.rmtree(building, ignore_errors=True)  # left by an interrupted build
    tiny_tokenizer.build_tokenizer(building)
    tiny_model.main([str(building), "--tokenizer", str(building), "--recite", tiny_model.DEMO_RECITAL])
    shutil.rmtree(out, ignore_errors=True)
    os.replace(building, out)
    return {"path": str(out), "built": True}
