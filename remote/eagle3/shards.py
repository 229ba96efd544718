"""The hidden-state store: shards of per-sample ``.ckpt`` files, committed by rename.

Layout under the extract stage's output directory::

    plan.json                 what these shards were made from (prep release, layers, model, ...)
    shard-00000/              a complete shard: records [0, shard_size) of prep's order
        meta.json             {"shard": 0, "files": [...], "ids": [...], "sizes": [...], "checksum": "xxh3_64", "sums": [...]}
        data_000000000.ckpt   one record (see below)
    .shard-00001.tmp/         a shard being written; a restart deletes it and starts it again
    manifest.json             written last, when every shard is complete

Each ``.ckpt`` is a ``torch.save`` dict in the layout SpecForge's offline
trainer reads (``OfflineEagle3Dataset``; it walks the directory for ``*.ckpt``
and sorts the paths), so ``--train-hidden-states-path`` can point straight at
the output directory:

==================  =============  ==========================================
``input_ids``       (T,) int64     the record's tokens
``loss_mask``       (T,) int64     1 where the token is trained on
``aux_hidden_state``(1, T, 3H)     the configured layers' outputs, concatenated in order
``hidden_state``    (1, T, H)      the final hidden state (after the final norm; the lm_head's input)
``id``              str            the prep record id (ignored by SpecForge)
==================  =============  ==========================================

A shard's files are written as ``*.part`` inside the hidden temporary
directory and renamed to ``*.ckpt`` just before the directory itself is renamed
into place, so a reader never sees a half-written shard, and a crash leaves
nothing ending in ``.ckpt`` outside a complete shard.

**Checked states.** A shard's ``meta.json`` keeps each file's size and checksum (``xxh3_64`` of the
whole file; ``crc32`` where the writing Python lacks the xxhash package), taken from the bytes as
they are written. `load_sample` checks them on every read (the size alone on a memory-mapped read,
which touches only what it uses), `verify` checks a whole store on demand. A file that fails is
never trained on: `condemn` turns its shard back into a torn one (the next extract redoes that shard
alone), removes the extract's manifest, marks the dataset's extract job `failed` so that
`inv rerun --failed` extracts it again, and the reader fails in one line naming the file, the shard
and the dataset. A shard written before checksums existed is refused the same way (extract again):
there is nothing to check it against, and an unchecked file is what this guards against.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import Any, Callable, NoReturn

from remote.vocabulary import layout
from remote.control_plane.progress import read_json, write_json_atomic
from remote.eagle3 import StageInputError

SHARD_PREFIX = "shard-"
TMP_SUFFIX = ".tmp"


def shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:05d}"


def sample_name(record_index: int) -> str:
    # NOTE: zero-padded so that SpecForge's sorted path list keeps prep's order.
    return f"data_{record_index:09d}.ckpt"


class ShardStore:
    """The shards under one extract output directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def shard_dir(self, index: int) -> Path:
        return self.root / shard_name(index)

    def is_complete(self, index: int) -> bool:
        return (self.shard_dir(index) / "meta.json").is_file()

    def meta(self, index: int) -> dict[str, Any]:
        return json.loads((self.shard_dir(index) / "meta.json").read_text())

    def complete_shards(self) -> list[int]:
        return sorted(int(p.name[len(SHARD_PREFIX):]) for p in self.root.glob(f"{SHARD_PREFIX}*") if (p / "meta.json").is_file())

    def remove_torn(self) -> list[str]:
        """Delete shards a killed run left half-written; their names."""
        torn = sorted(self.root.glob(f".{SHARD_PREFIX}*{TMP_SUFFIX}"))
        for path in torn:
            shutil.rmtree(path)
        return [p.name for p in torn]

    def reset(self) -> None:
        """Forget every shard and the manifest (the inputs changed)."""
        for path in self.root.glob(f"{SHARD_PREFIX}*"):
            shutil.rmtree(path)
        (self.root / "manifest.json").unlink(missing_ok=True)
        self.remove_torn()

    def use_plan(self, plan: dict[str, Any], since: tuple[str, ...] = ()) -> bool:
        """Record what the shards are made from; False (and a reset) when older shards came from something else.
        `since`: keys an older aerie's plan lacks, compared only where it has them (its shards taken at its word)."""
        path = self.root / "plan.json"
        old = read_json(path)
        lacks = [key for key in since if isinstance(old, dict) and key not in old]
        changed = old is not None and old != {k: v for k, v in plan.items() if k not in lacks}
        if changed:
            self.reset()
        write_json_atomic(path, plan)
        return not changed

    def writer(self, index: int) -> "ShardWriter":
        return ShardWriter(self.root, index)

    def sample_files(self) -> list[Path]:
        """Every complete sample, in prep's order; a shard without checksums (an older aerie's) is
        condemned (`BadState`) before anything of it is read."""
        for index in self.complete_shards():
            if "sums" not in self.meta(index):
                condemn(self.shard_dir(index) / "meta.json", "has no checksums (extracted by an older aerie)")
        return sorted(p for index in self.complete_shards() for p in self.shard_dir(index).glob("*.ckpt"))


class ShardWriter:
    """Writes one shard into a temporary directory; `commit` renames it into place."""

    def __init__(self, root: Path, index: int) -> None:
        self.index = index
        self.final = root / shard_name(index)
        self.tmp = root / f".{shard_name(index)}{TMP_SUFFIX}"
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.files: list[str] = []
        self.ids: list[str] = []
        self.sizes: list[int] = []
        self.sums: list[str] = []

    def add(self, record_index: int, sample: dict[str, Any]) -> None:
        import torch

        name = sample_name(record_index)
        buffer = io.BytesIO()
        torch.save(sample, buffer)
        data = buffer.getbuffer()
        path = self.tmp / f"{name}.part"
        try:
            with open(path, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            self.abandon()  # a full disk gets back what this shard took
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        self.files.append(name)
        self.ids.append(str(sample.get("id", "")))
        self.sizes.append(len(data))
        self.sums.append(checksum(data))

    def commit(self) -> None:
        for name in self.files:
            os.replace(self.tmp / f"{name}.part", self.tmp / name)
        try:
            write_json_atomic(self.tmp / "meta.json", {"shard": self.index, "files": self.files, "ids": self.ids,
                                                       "sizes": self.sizes, "checksum": ALGORITHM, "sums": self.sums})
        except OSError:
            self.abandon()
            raise
        os.replace(self.tmp, self.final)

    def abandon(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- checksums -------------------------------------------------------------------------------


def _algorithm() -> tuple[str, Callable[[Any], str]]:
    try:
        import xxhash
    except ImportError:  # a SpecForge environment without it (the SGLang capture writes there)
        return "crc32", lambda data: f"{zlib.crc32(data):08x}"
    return "xxh3_64", lambda data: xxhash.xxh3_64_hexdigest(data)


ALGORITHM, checksum = _algorithm()
POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux's; elsewhere the pages fault in as the hash reads them


def checksum_of(algorithm: str, data: Any) -> str:
    """`data`'s checksum by the algorithm a shard's meta names."""
    if algorithm == ALGORITHM:
        return checksum(data)
    if algorithm == "crc32":
        return f"{zlib.crc32(data):08x}"
    raise StageInputError(f"states checked with {algorithm}, which this Python cannot compute: pip install xxhash on the host")


class BadState(StageInputError):
    """A stored state file that is not what extract wrote (or cannot be checked); its shard is condemned."""


def _expected(path: Path) -> tuple[int, str, str] | None:
    """(size, algorithm, checksum) of `path` by its shard's meta; None for a file outside any shard
    (no meta.json beside it: a test's or a tool's own file)."""
    meta = _meta(path.parent)
    if meta is None:
        return None
    if path.name not in meta["index"]:
        condemn(path, "is not in its shard's meta.json")
    i = meta["index"][path.name]
    if "sums" not in meta:
        condemn(path, "has no checksum (extracted by an older aerie)")
    return meta["sizes"][i], meta.get("checksum", "xxh3_64"), meta["sums"][i]


def content_id(path: Path) -> str:
    """What stands for `path`'s content without reading it: the checksum its shard's meta.json records (an
    extract redone writes other states under the same names), else its size and time (a file outside any shard)."""
    meta = _meta(path.parent)
    if meta is not None and "sums" in meta and path.name in meta["index"]:
        return meta["sums"][meta["index"][path.name]]
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


_METAS: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}


def _meta(directory: Path) -> dict[str, Any] | None:
    """A shard's meta.json, read once per version of it (a redone shard has a new one)."""
    path = directory / "meta.json"
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (stat.st_ino, stat.st_mtime_ns)
    kept = _METAS.get(str(directory))
    if kept is None or kept[0] != key:
        meta = read_json(path, {})
        meta["index"] = {name: i for i, name in enumerate(meta.get("files", []))}
        kept = _METAS[str(directory)] = (key, meta)
    return kept[1]


def load_sample(path: Path, mmap: bool = False) -> dict[str, Any]:
    """One record, checked against its shard's meta: its size, and unless `mmap` its checksum (with `mmap`
    only the tensors actually touched are read from disk, and hashing would read them all).

    The tensors are memory-mapped either way: the checksum's pass brings the file into the page cache
    and the tensors are read from there, so a checked read costs one pass over the file, as a plain
    ``torch.load`` does (docs/benchmarks.md)."""
    import torch

    path = Path(path)
    expected = _expected(path)
    if expected is not None:
        _check(path, expected, whole=not mmap)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _check(path: Path, expected: tuple[int, str, str], whole: bool) -> int:
    """`path`'s size, and with `whole` its checksum, against what extract recorded; its size."""
    size_, algorithm, sum_ = expected
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        condemn(path, "is missing (its shard's meta.json lists it)")
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size != size_:
            condemn(path, f"is {size} bytes where extract wrote {size_} ({'truncated' if size < size_ else 'grown'})")
        if whole and size:
            # NOTE: populated in one call: a page fault per 4 KiB page costs more than the hash itself.
            with mmap.mmap(handle.fileno(), 0, flags=mmap.MAP_SHARED | POPULATE, prot=mmap.PROT_READ) as view:
                found = checksum_of(algorithm, view)
            if found != sum_:
                condemn(path, f"does not match its {algorithm} checksum (its bytes changed since extract wrote them)")
    return size


def verify(root: Path, beat: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Every complete shard of the store at `root` read and checked (`BadState` at the first bad file);
    counts of files and bytes checked."""
    files = total = 0
    for path in ShardStore(root).sample_files():
        expected = _expected(path)
        if expected is None:  # its shard was condemned or redone since it was listed
            condemn(path, "lost its shard's meta.json while it was being verified")
        files, total = files + 1, total + _check(path, expected, whole=True)
        beat()
    return {"files": files, "bytes": total}


# -- a bad file: its shard redone ---------------------------------------------------------------


def condemn(path: Path, problem: str) -> NoReturn:
    """Mark the shard of `path` for extract to redo, and raise `BadState` naming the file, the shard and
    the dataset. Its shard becomes a torn one (extract deletes and redoes exactly those), the extract's
    manifest goes (nothing trains on the store until extract has run again), and the dataset's
    extract job, when this is a pipeline's store, is recorded `failed` so that `inv rerun --failed`
    runs it before train again."""
    shard = path.parent
    store = shard.parent
    dataset, job = _owner(store)
    redo = f"`inv rerun --failed` extracts {shard.name} again" if job else f"extract {store} again"
    line = f"{path} {problem}: shard {shard.name} of {dataset} is marked for extract again; {redo}, then trains"
    if shard.name.startswith(SHARD_PREFIX):
        torn = store / f".{shard.name}{TMP_SUFFIX}"
        shutil.rmtree(torn, ignore_errors=True)
        try:
            os.replace(shard, torn)
        except OSError:
            pass  # condemned already by another reader of this run
    (store / "manifest.json").unlink(missing_ok=True)
    if job:
        _mark_failed(job, line)
    raise BadState(line)


def _owner(store: Path) -> tuple[str, Path | None]:
    """(the dataset named as a user knows it, the extract job's directory when a pipeline's job wrote
    `store`). A chunked route's chunk belongs to its draft/chunked job, which redoes it itself."""
    if store.name == "extract" and len(store.parents) > 2 and store.parents[1].name == layout.DATA:
        root, dataset = store.parents[2], store.parent.name
        job = layout.job_dir(root, dataset, "extract")
        return f"dataset {dataset}", job if (job / layout.STATE).is_file() else None
    return f"{store.parent.name} ({store.parent.parent.name})", None


def _mark_failed(job: Path, line: str) -> None:
    """The extract job's record says it failed, unless it is running (a run that is writing anew)."""
    from remote.control_plane.store import JobStore  # here: a clean read never needs it

    store = JobStore(layout.root_of(job))
    with store.locked(job):
        state = read_json(job / layout.STATE, {})
        if not isinstance(state, dict) or state.get("state") not in ("succeeded", "empty"):
            return
        state.update(state="failed", ended_at=time.time(), message=f"its states failed a check: {line}")
        write_json_atomic(job / layout.STATE, state)
