"""`inv deploy`: check here, then send only what changed, in one stream, and switch atomically.

Round trips: one to read the host's current manifest (a `cat`: no Python starts
on the host for a deploy that sends nothing), one to send the changed files as a
gzip tar on stdin; the host assembles the release beside the old one and
switches `current` by rename (remote/control_plane/release.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shlex
import struct
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local.exceptions import AerieError
from local.host.verbs import RemoteHost
from local.paths import REPO
from remote.vocabulary import layout
from remote.vocabulary.wire import CLOSE, OPEN, decode

#: What a release holds: the host-side code and the sample data the `local` inventory reads.
SHIPPED = ("remote", "inventories/samples")
SKIPPED_PARTS = {"__pycache__", ".pytest_cache"}


def manifest(repo: Path = REPO, ship: tuple[str, ...] | list[str] = ()) -> dict[str, str]:
    """Every shipped file -- `SHIPPED`, and the inventory's `deploy.ship` -- by path relative to the checkout,
    with its sha256."""
    files = {}
    for top in (*SHIPPED, *ship):
        base = repo / top
        if not base.exists():
            raise AerieError(f"deploy.ship: {top!r} is not in the checkout ({base}): give a file or folder of it")
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            relative = path.relative_to(repo)
            if path.is_file() and not SKIPPED_PARTS & set(relative.parts) and path.suffix != ".pyc":
                files[relative.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def check_sources(repo: Path = REPO, paths: list[str] | None = None) -> None:
    """Byte-compile `paths` (default: everything under remote/) in memory: a syntax error stops the deploy here.

    A deploy passes only the files it sends: those the host holds already passed this check.
    """
    problems = []
    chosen = sorted((repo / "remote").rglob("*.py")) if paths is None else [
        repo / p for p in sorted(paths) if p.endswith(".py") and p.startswith("remote/")]
    for path in chosen:
        if _cached(path):
            continue
        try:
            compile(path.read_bytes(), str(path.relative_to(repo)), "exec")
        except SyntaxError as exc:
            problems.append(f"{exc.filename}:{exc.lineno}: {exc.msg}")
    if problems:
        raise AerieError("remote/ does not compile, nothing was sent: " + "; ".join(problems))


def _cached(path: Path) -> bool:
    """Whether this Python's bytecode of `path` is current (by its mtime and size, as an import decides): it
    compiled, so it compiles. A first deploy sends every file, most of which this checkout has compiled already."""
    try:
        with open(importlib.util.cache_from_source(str(path)), "rb") as cached:
            header = cached.read(16)
        stat = path.stat()
    except (OSError, ValueError):
        return False
    return (header[:8] == importlib.util.MAGIC_NUMBER + bytes(4)  # flags 0: checked by timestamp, not by hash
            and header[8:] == struct.pack("<II", int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF))


@dataclass
class Diff:
    """What a deploy would change on the host."""

    base: str | None
    files: dict[str, str]
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    @property
    def is_noop(self) -> bool:
        return not (self.added or self.changed or self.removed)

    @property
    def send(self) -> list[str]:
        return self.added + self.changed

    @property
    def release_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()[:8]
        return f"{time.strftime('%Y%m%d-%H%M%S')}-{digest}"


#: How long a read of the manifest waits for a deploy in flight to switch.
LOCK_WAIT_S = 60


def current_release(host: RemoteHost) -> dict[str, Any]:
    """The host's current manifest, read with `cat` between the payload tags; nothing deployed: no files.

    The read shares the lock that a deploy's switch holds (remote/control_plane/release.py), so it waits for
    a deploy in flight to end rather than report the release that deploy is replacing. Where
    the host has no `flock` (util-linux), or the wait runs out, the manifest is read as it is.
    """
    path = shlex.quote(f"{host.root}/current/{layout.RELEASE_MANIFEST}")
    lock = shlex.quote(f"{host.root}/.deploy.lock")
    empty = shlex.quote(json.dumps({"id": None, "files": {}}))
    result = host.transport.run(f"printf %s {shlex.quote(OPEN)}; flock -s -w {LOCK_WAIT_S} {lock} cat {path} 2>/dev/null "
                                f"|| cat {path} 2>/dev/null || printf %s {empty}; printf '%s\\n' {shlex.quote(CLOSE)}")
    try:
        current = decode(result.stdout)
    except ValueError:  # a manifest cut short: the host's own reader treats it as no release too
        return {"id": None, "files": {}}
    return current if isinstance(current, dict) and isinstance(current.get("files"), dict) else {"id": None, "files": {}}


def diff(host: RemoteHost, files: dict[str, str]) -> Diff:
    """This checkout's `files` against the host's current release."""
    current = current_release(host)
    theirs = current.get("files", {})
    return Diff(
        base=current.get("id"),
        files=files,
        added=sorted(set(files) - set(theirs)),
        changed=sorted(p for p in files if p in theirs and theirs[p] != files[p]),
        removed=sorted(set(theirs) - set(files)),
    )


def pack(paths: list[str], repo: Path = REPO) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        for path in paths:
            archive.add(repo / path, arcname=path, recursive=False)
    return buffer.getvalue()


def push(host: RemoteHost, diff: Diff, repo: Path = REPO) -> dict[str, Any]:
    """Send the changed files, switch, and prune to `deploy.keep` releases: {id, pruned (the ids removed)}."""
    args = {"id": diff.release_id, "files": diff.files, "send": diff.send, "keep": host.inventory.deploy.keep}
    return host.release("apply", stdin=json.dumps(args).encode() + b"\n" + pack(diff.send, repo))
