"""One `remote` verb run from the workstation's own sources, sent on stdin: where nothing is deployed yet.

Self-contained (standard library, no imports from `remote` until the sources are in place): the
workstation sends this file's source with ``python3 -c`` (local/host/verbs.py, `RemoteHost.call_sent`), as
it sends release.py for a deploy, so that `inv check` and `inv plan` work on a host that has never
had a deploy -- the first thing a user runs on a new host -- and run the checkout's code, not an
older release's. Stdin: one JSON line (the verb's arguments), then zlib-compressed JSON of
``{"remote/...py": source}``. The modules load from memory: nothing is written on the host.

    python3 -c "$(cat sent.py)" VERB < request
"""

import importlib.abc
import importlib.util
import json
import sys
import zlib


class Sources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the `remote` package's modules from the sent sources, ahead of sys.path
    (NOTE: so that a stale `remote/` in the working directory or a deployed release is never mixed in)."""

    def __init__(self, files):
        self.files = files

    def find_spec(self, name, path=None, target=None):
        base = name.replace(".", "/")
        for file, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if file in self.files:
                return importlib.util.spec_from_loader(name, self, origin=file, is_package=package)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        file = module.__spec__.origin
        module.__file__ = file  # tracebacks and messages name the checkout's path, e.g. remote/preflight.py
        exec(compile(self.files[file], file, "exec"), module.__dict__)


def main(argv):
    stream = sys.stdin.buffer
    args = stream.readline().decode()
    sys.meta_path.insert(0, Sources(json.loads(zlib.decompress(stream.read()))))
    entry = importlib.import_module("remote.__main__")
    return entry.main([argv[0], args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
