"""Releases on the host: what is deployed, and an atomic switch to a new one.

Self-contained (standard library, no imports from `remote`): the workstation
sends this file's source with ``python3 -c`` so that it works on a host where
nothing is deployed yet. Layout under the root::

    releases/<id>/            one complete tree per deploy, never changed after
    releases/<id>/.aerie-release.json   its manifest: {path: sha256}
    current -> releases/<id>  switched by rename, so it is always whole
    releases/.incoming-<id>/  a deploy in progress; removed by the next deploy

Verbs: ``manifest ROOT`` prints the current release's manifest; ``apply ROOT
`` reads one JSON line (the new manifest, which files are sent, and how many
releases to keep), then a gzip tar of those files, from stdin, switches, and
prunes the older releases no job runs from.
"""

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time

MANIFEST = ".aerie-release.json"
OPEN, CLOSE = "<aerie-payload>", "</aerie-payload>"


def emit(payload):
    sys.stdout.write(OPEN + json.dumps(payload, separators=(",", ":")) + CLOSE + "\n")


def current_manifest(root):
    link = os.path.join(root, "current")
    try:
        with open(os.path.join(link, MANIFEST)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"id": None, "files": {}}


def sha256(path):
    """The file's SHA-256 in hex, read a block at a time (the one such digest of a file on the host)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def link_or_copy(source, target):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(source, target)  # releases never change, so sharing inodes is safe
    except OSError:
        shutil.copy2(source, target)


def extract(archive, member, incoming, expected):
    # Checked by hand rather than with tarfile's filter="data", which Pythons before 3.11.4 lack.
    if member.name not in expected or not member.isfile():
        raise RuntimeError("unexpected entry %r in the deploy stream" % member.name)
    target = os.path.join(incoming, member.name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with archive.extractfile(member) as source, open(target, "wb") as handle:
        shutil.copyfileobj(source, handle)
    os.chmod(target, 0o644)


def build(root, args, stream):
    """Assemble the new release in an incoming directory; return its path."""
    releases = os.path.join(root, "releases")
    for name in os.listdir(releases):
        if name.startswith(".incoming-"):  # left by an interrupted deploy
            shutil.rmtree(os.path.join(releases, name), ignore_errors=True)
    incoming = os.path.join(releases, ".incoming-" + args["id"])
    os.makedirs(incoming)
    base = current_manifest(root)
    base_dir = os.path.join(root, "current")
    for path, digest in args["files"].items():
        if path not in args["send"]:
            if base["files"].get(path) != digest:
                raise RuntimeError("base release changed under this deploy (%s): deploy again" % path)
            link_or_copy(os.path.join(base_dir, path), os.path.join(incoming, path))
    expected = set(args["send"])
    with tarfile.open(fileobj=stream, mode="r|gz") as archive:
        for member in archive:
            extract(archive, member, incoming, expected)
    for path in args["send"]:
        if sha256(os.path.join(incoming, path)) != args["files"][path]:
            raise RuntimeError("%s arrived corrupted: deploy again" % path)
    with open(os.path.join(incoming, MANIFEST), "w") as handle:
        json.dump({"id": args["id"], "files": args["files"], "created_at": time.time()}, handle)
    return incoming


def settle(incoming, target, files):
    """Rename the built release into place, or keep the one already there under its id.

    An id is the second and a digest of the files, so a release of that id holds these files
    (a release is renamed in whole and never changed): the same checkout deployed again within
    the second, after another checkout's deploy switched away from it, finds its own release.
    """
    if os.path.isdir(target):
        try:
            with open(os.path.join(target, MANIFEST)) as handle:
                kept = json.load(handle).get("files")
        except (OSError, ValueError, AttributeError):
            kept = None  # torn: a prune killed halfway through removing it; never current, so replaced
        if kept == files:
            shutil.rmtree(incoming)
            return
        if kept is not None:
            raise RuntimeError("release %s exists with other files: deploy again" % os.path.basename(target))
        shutil.rmtree(target)
    os.rename(incoming, target)


def switch(root, release_id):
    """Point `current` at the release with one rename: never a moment without a whole release."""
    temporary = os.path.join(root, ".current.tmp")
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(os.path.join("releases", release_id), temporary)
    os.replace(temporary, os.path.join(root, "current"))


def in_use(root):
    """Releases that running jobs still execute from."""
    used = set()
    jobs = os.path.join(root, "jobs")
    for dataset in os.listdir(jobs) if os.path.isdir(jobs) else []:
        if not os.path.isdir(os.path.join(jobs, dataset)):
            continue
        for stage in os.listdir(os.path.join(jobs, dataset)):
            try:
                with open(os.path.join(jobs, dataset, stage, "state.json")) as handle:
                    state = json.load(handle)
            except (OSError, ValueError):
                continue
            # NOTE: a broken record (not an object) keeps no release: `inv status` shows it as broken.
            if isinstance(state, dict) and state.get("state") in ("running", "stalled", "waiting") and state.get("release"):
                used.add(state["release"])
    return used


def created(releases, name):
    """When a release was made, from its manifest (a torn one: never, so it goes first)."""
    try:
        with open(os.path.join(releases, name, MANIFEST)) as handle:
            return float(json.load(handle).get("created_at") or 0)
    except (OSError, ValueError, AttributeError, TypeError):
        return 0.0


def prune(root, keep):
    """Remove all but the newest `keep` releases, except the live one and those jobs run from.

    NOTE: by their manifests' times: ids order by the second only, and two deploys within one second differ
    in the digest that follows it."""
    releases = os.path.join(root, "releases")
    names = sorted((n for n in os.listdir(releases) if not n.startswith(".")), key=lambda n: (created(releases, n), n))
    spare = set(names[-keep:]) | in_use(root) | {os.path.basename(os.path.realpath(os.path.join(root, "current")))}
    removed = [n for n in names if n not in spare]
    for name in removed:
        shutil.rmtree(os.path.join(releases, name), ignore_errors=True)
    return removed


def apply(root):
    stream = sys.stdin.buffer
    args = json.loads(stream.readline())
    os.makedirs(os.path.join(root, "releases"), exist_ok=True)
    with open(os.path.join(root, ".deploy.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two deploys at once take turns
        incoming = build(root, args, stream)
        settle(incoming, os.path.join(root, "releases", args["id"]), args["files"])
        switch(root, args["id"])
        removed = prune(root, args["keep"])  # the inventory's deploy.keep, its default resolved there
    emit({"id": args["id"], "pruned": removed})


def main(argv):
    verb, root = argv[0], argv[1]
    if verb == "manifest":
        emit(current_manifest(root))
    elif verb == "apply":
        try:
            apply(root)
        except (RuntimeError, tarfile.TarError, EOFError, OSError, ValueError) as exc:
            emit({"error": "deploy failed on the host, the previous release is untouched: %s" % exc})
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
