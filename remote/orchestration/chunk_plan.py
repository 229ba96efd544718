"""The chunked route's plan, in functions of their own (`remote.orchestration.chunked` runs it): what
a record costs on disk, the chunks cut to fit the budget, the records held out for measurement, each
pass's order of chunks, and a chunk's records copied out of prep's outputs."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from remote import sizing
from remote.vocabulary import layout
from remote.control_plane.progress import Progress, write_json_atomic
from remote.eagle3 import StageInputError
from remote.eagle3.extract_settings import ExtractSettings
from remote.eagle3.train_settings import TrainSettings

#: The copied ids (int32) and mask (int8) of a chunk's prep subset, per token, rounded up.
PREP_BYTES_PER_TOKEN = 8
#: A record's share of its shard's directory and meta.json (a 4 KiB block each), at worst one shard a record.
SHARD_BYTES = 8192
#: A chunk's small files and directories, each a 4 KiB block: per part (prep, extract, plan, manifests)
#: and the chunk's own (its directory, the run's state and progress files).
DATASET_BYTES = 64 * 1024
CHUNK_BYTES = 32 * 1024
#: The most of the budget the held-out records' states may keep; lower-ranked ones beyond it are trained on.
HELDOUT_SHARE = 0.25
#: Seeds the chunks' records and each pass's order of chunks.
SEED = 0


def record_size(tokens: int, per_token: int) -> int:
    """Disk one record takes in a chunk: its states file, its copied ids, its share of the shard."""
    return sizing.record_bytes(tokens, per_token) + tokens * PREP_BYTES_PER_TOKEN + SHARD_BYTES


def reserved(parts: int) -> int:
    """Disk the run's directories take besides their records (`parts`: the chunk's, and the held-out one's if any)."""
    return CHUNK_BYTES + DATASET_BYTES * parts


def state_bytes(shared_config: dict[str, Any], settings: ExtractSettings) -> int:
    """A token's hidden states on disk, for the target of `shared_config` (`remote.sizing`)."""
    hidden = sizing.hidden_size((shared_config.get("target") or {}).get("model"))
    if not hidden:
        raise StageInputError("target.model has no readable config.json with hidden_size on the host")
    return sizing.bytes_per_token(settings.layers, hidden, settings.dtype)


def token_counts(prep_dir: Path) -> list[int]:
    """Each record's token count, in prep's order (the order extract reads)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from remote.eagle3.prep_input import shard_files

    counts: list[int] = []
    for file in shard_files(prep_dir):
        counts += pc.list_value_length(pq.read_table(file, columns=["input_ids"])["input_ids"]).to_pylist()
    return counts


def cut(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges whose sizes sum to at most `budget`, greedily."""
    ranges, start, used = [], 0, 0
    for index, size in enumerate(sizes):
        if size > budget:
            raise StageInputError(f"record {index} alone needs {size:,} B on disk, more than the {budget:,} B of "
                                  "stages.extract.disk_budget left for a chunk: raise the budget or use the online route")
        if used + size > budget:
            ranges.append((start, index))
            start, used = index, 0
        used += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


def offline_path(dataset: str, index: int, shard_size: int) -> Path:
    """Where the offline route's extract would store the record (the held-out rule hashes this path)."""
    from remote.eagle3.shards import sample_name, shard_name

    return layout.output_dir(Path(), dataset, "extract") / shard_name(index // shard_size) / sample_name(index)


def epochs_per_pass(epochs: int, passes: int) -> list[int]:
    """How many epochs each pass trains on a chunk while it is on disk: `epochs` spread over `passes`."""
    return [epochs // passes + (1 if p < epochs % passes else 0) for p in range(passes)]


def pass_order(chunks: int, index: int) -> list[int]:
    """The order of the chunks in pass `index`: as planned first, then shuffled anew each pass."""
    order = list(range(chunks))
    if index:
        random.Random(SEED + index).shuffle(order)
    return order


def steps_in(records: list[int], batch: int) -> int:
    """Optimizer steps of one epoch over chunks of `records` records each."""
    return sum(-(-n // batch) for n in records)


def steps_before(records: list[int], batch: int, epochs: int, passes: int, index: int, position: int) -> int:
    """Optimizer steps taken once pass `index` has trained its first `position` chunks (`records`: each
    chunk's), every pass training its share of the epochs (`epochs_per_pass`)."""
    if index >= passes:
        return epochs * steps_in(records, batch)
    shares = epochs_per_pass(epochs, passes)
    order = pass_order(len(records), index)
    return sum(shares[:index]) * steps_in(records, batch) + shares[index] * steps_in([records[k] for k in order[:position]], batch)


def group(records: list[tuple[str, int, int]]) -> dict[str, list[int]]:
    """{dataset: record indices in prep's order} of (dataset, index, tokens) records."""
    parts: dict[str, list[int]] = {}
    for name, index, _ in records:
        parts.setdefault(name, []).append(index)
    return {name: sorted(indices) for name, indices in parts.items()}


def held_out(records: list[tuple[str, int, int]], per_token: int, budget: int, shard_size: int,
             train: TrainSettings, progress: Progress) -> set[tuple[str, int]]:
    """The records train would hold out, by their offline paths, as many as fit `HELDOUT_SHARE` of the budget."""
    from remote.eagle3 import heldout

    paths = {offline_path(name, i, shard_size): (name, i, n) for name, i, n in records}
    _, held = heldout.split(list(paths), train.eval_records, train.eval_fraction)
    kept, used = set(), 0
    for path in sorted(held, key=heldout._rank):
        name, i, n = paths[path]
        used += record_size(n, per_token)
        if used > budget * HELDOUT_SHARE:
            progress.note(f"held out {len(kept)} of {len(held)} records: {HELDOUT_SHARE:.0%} of the budget holds their states")
            break
        kept.add((name, i))
    return kept


def captured(shared_config: dict[str, Any], ids: list[int] | None) -> list[int] | None:
    """The HF hidden_states the layer ids name for this target (`remote.eagle3.layer_ids`): states
    kept under another meaning of the ids (aerie before SGLang's per-architecture rule) are not reused."""
    from remote.eagle3 import layer_ids

    model = (shared_config.get("target") or {}).get("model")
    try:
        return layer_ids.captured(ids, layer_ids.target_architecture(Path(model))) if model and ids else None
    except StageInputError:
        return None  # extract itself refuses the target, naming why


def copy_records(preps: dict[str, Path], selection: dict[str, list[int]], out: Path) -> None:
    """The selected records of each dataset's prep output as one prep output of their own (parquet and manifest)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from remote.eagle3.prep_input import COLUMNS, read_manifest, shard_files

    tables, release = [], None
    for name, indices in selection.items():
        release = release or read_manifest(preps[name])["release"]
        wanted, seen = sorted(indices), 0
        for file in shard_files(preps[name]):
            rows = pq.read_metadata(file).num_rows
            local = [i - seen for i in wanted if seen <= i < seen + rows]
            if local:
                tables.append(pq.read_table(file, columns=COLUMNS).take(pa.array(local)))
            seen += rows
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tokens-00000.parquet.{os.getpid()}.tmp"
    pq.write_table(pa.concat_tables(tables), tmp)
    os.replace(tmp, out / "tokens-00000.parquet")
    write_json_atomic(out / "manifest.json", {"release": release, "kept": sum(len(v) for v in selection.values()),
                                              "source": {name: str(preps[name]) for name in selection}})
