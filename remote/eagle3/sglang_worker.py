"""One process of the serving engine's capture (``stages.extract.engine: sglang``), run under torchrun.

    <specforge python> -m torch.distributed.run --standalone --nproc-per-node N \\
        --no-python <specforge python> -m remote.eagle3.sglang_worker '<spec json>'

It runs in the host's SpecForge environment (SpecForge 0.2.0 and its pinned SGLang 0.5.14), one
process per GPU: SpecForge's ``init_distributed`` makes the tensor-parallel group, and its
``OfflineSGLangCapture`` builds SGLang's own model runner over it (``enable_return_hidden_states``,
no CUDA graphs, one extend pass per batch). The layer ids go to SGLang's own
``set_eagle3_layers_to_capture``, so what is stored is what the server feeds the draft; the
decoder layers SGLang then captures are reported back and checked against
`remote.eagle3.layer_ids` by the stage (`remote.eagle3.sglang_engine`).

After loading, rank 0 reads requests from stdin, one JSON line each (``{"prep": dir, "output":
dir}``), and hands each to every rank; each request fills the shards of `remote.eagle3.shards`
under ``output`` that are not complete yet, exactly as the HF engine does
(`remote.eagle3.extractor.fill`), rank 0 alone writing. End of stdin ends the processes. What
rank 0 has to say goes to stdout as tagged lines (`TAG` + JSON), which the stage reads;
everything else it or SGLang prints is only log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from remote.control_plane import collector, logfile
from remote.control_plane.processes import die_with_parent

TAG = "AERIE-CAPTURE "


class Events:
    """Rank 0's side of the channel to the stage: tagged JSON lines on the stdout it was given."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def send(self, event: str, **fields: Any) -> None:
        self.stream.write(TAG + json.dumps({"event": event, **fields}) + "\n")
        self.stream.flush()

    # the Progress calls `remote.eagle3.extractor.fill` makes
    def written(self, n: int = 1) -> None:
        self.send("written", n=n)

    def resumed(self) -> None:
        self.send("resumed")

    def skipped(self, reason: str, n: int = 1) -> None:
        self.send("skipped", reason=reason, n=n)

    def note(self, message: str) -> None:
        self.send("note", message=message)


class Silent:
    """The other ranks' progress: they compute, rank 0 reports."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def build(spec: dict[str, Any]):
    """SpecForge's offline capture of the target, tensor-parallel over every rank, capturing `spec["layers"]`."""
    import torch
    from specforge.offline_capture import OfflineSGLangCapture

    capture = OfflineSGLangCapture.from_pretrained(
        spec["target"], torch_dtype=getattr(torch, spec["dtype"]), trust_remote_code=spec["trust_remote_code"],
        **spec["sglang_args"])
    capture.set_capture_layers(list(spec["layers"]), capture_method="eagle3")
    return capture


def captured_layers(capture: Any) -> list[int]:
    """The decoder layers whose inputs SGLang now captures: its model's ``layers_to_capture``, read
    where SGLang's ``set_eagle3_layers_to_capture`` put it (a wrapper such as Kimi-K2.5's keeps it
    on its ``language_model``)."""
    # NOTE: SpecForge keeps its backend private; the model runner's model is SGLang's own object.
    model = capture._backend.model_runner.model
    inner = getattr(model, "language_model", model)
    return [int(j) for j in inner.model.layers_to_capture]


def capture_batch(capture: Any, batch: Sequence[Sequence[int]]) -> list[tuple[Any, Any]]:
    """(aux (T, len(layers) * H), final (T, H)) per sequence, padding cut off, on the CPU.

    Right-padded to one length: SpecForge's capture stacks the rows, so they must be as long as each
    other; a causal model's states at real positions do not depend on the pads after them.
    """
    import torch

    lengths = [len(ids) for ids in batch]
    ids = torch.zeros((len(batch), max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    out = capture.capture(input_ids=ids, attention_mask=mask, loss_mask=mask)
    return [(out.hidden_states[row, :n].to("cpu", copy=True), out.last_hidden_states[row, :n].to("cpu", copy=True))
            for row, n in enumerate(lengths)]


class PlannedStore:
    """The shard store as rank 0 found it when the request came: every rank skips the same shards
    (a shard rank 0 commits meanwhile must not change another rank's batches); only rank 0 writes."""

    def __init__(self, store: Any, complete: list[int], writes: bool) -> None:
        self.store, self.complete, self.writes = store, set(complete), writes

    def is_complete(self, index: int) -> bool:
        return index in self.complete

    def meta(self, index: int) -> dict[str, Any]:
        return self.store.meta(index) if self.writes else {"files": []}

    def writer(self, index: int) -> Any:
        return self.store.writer(index) if self.writes else _Discard()


class _Discard:
    def add(self, record_index: int, sample: dict[str, Any]) -> None:
        pass

    def commit(self) -> None:
        pass


def serve(capture: Any, spec: dict[str, Any], rank: int, events: Any) -> None:
    """Answer requests until rank 0's stdin ends."""
    import torch.distributed as dist

    from remote.eagle3.extractor import fill
    from remote.eagle3.prep_input import read_records
    from remote.eagle3.shards import ShardStore

    while True:
        request: list[Any] = [None]
        if rank == 0:
            line = sys.stdin.readline()
            if line.strip():
                request[0] = json.loads(line)
                request[0]["complete"] = ShardStore(Path(request[0]["output"])).complete_shards()
        dist.broadcast_object_list(request, src=0)
        if request[0] is None:
            return
        store = PlannedStore(ShardStore(Path(request[0]["output"])), request[0]["complete"], rank == 0)
        counts = fill(read_records(Path(request[0]["prep"])), store, spec["shard_size"], spec["batch_size"],
                      events, lambda batch: capture_batch(capture, batch))
        events.send("done", counts=counts)


def main(argv: list[str]) -> int:
    # NOTE: torchrun starts each worker in a session of its own, out of reach of the job's kill:
    # a worker must end with its torchrun, or it keeps its GPU after the job is gone.
    die_with_parent(os.getppid())()
    collector.tune()
    logfile.whole_lines()  # the capture's workers and the extract stage share the job's log
    spec = json.loads(argv[0])
    rank = int(os.environ.get("RANK", "0"))
    stream = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr  # SGLang's and SpecForge's prints are log, never events
    events = Events(stream) if rank == 0 else Silent()
    from specforge.distributed import init_distributed

    try:
        init_distributed(timeout=spec["timeout_minutes"], tp_size=spec["tp_size"])
        capture = build(spec)
        events.send("ready", captured=captured_layers(capture))
        serve(capture, spec, rank, events)
    except Exception as exc:  # noqa: BLE001 (told to the stage in one line, then the process fails)
        events.send("error", message=f"{type(exc).__name__}: {exc}")
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
