"""The host as the workstation sees it: `remote`'s command line, answered in JSON."""

from __future__ import annotations

import json
import shlex
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from local.exceptions import AerieError, NotDeployed
from local.paths import ENV_NAME, REPO
from local.transport.process import Result
from local.transport.protocol import Transport, open_transport
from remote.vocabulary import hints
from remote.vocabulary.wire import decode

if TYPE_CHECKING:
    from local.inventory.values import Inventory

NOT_DEPLOYED = 90  # the exit code of the guard in front of every job command
#: Verbs whose code is the standard library only: their Python starts with -S, since a host
#: virtualenv's site (its .pth files, editable installs) can cost more than the verb itself.
#: Jobs they start are new interpreters with their site.
BARE_VERBS = frozenset({"status", "launch", "run", "rerun", "stop", "logs", "eval_report"})
RELEASE_AGENT = (REPO / "remote" / "control_plane" / "release.py").read_text()
SENT_AGENT = REPO / "remote" / "control_plane" / "sent.py"
#: Verbs that start jobs: they are sent the inventory's secrets (local/inventory/secret_values.py), on stdin only.
JOB_VERBS = frozenset({"launch", "run", "rerun"})
#: Longer JSON arguments go on stdin: Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN), which
#: the specs of a launch of about 120 jobs reach.
INLINE_ARGS = 64 * 1024


class RemoteHost:
    """Runs `python -m remote VERB` from the host's current release, one command per call."""

    def __init__(self, inventory: Inventory, transport: Transport | None = None) -> None:
        self.inventory = inventory
        self.root = inventory.host.root
        self.python = inventory.host.python
        self.transport = transport or open_transport(inventory.host)

    @property
    def name(self) -> str:
        return self.inventory.host.address or "localhost"

    def command(self, verb: str, args: dict[str, Any]) -> str:
        return self._invocation(verb, args)[0]

    def _invocation(self, verb: str, args: dict[str, Any]) -> tuple[str, bytes | None]:
        """The shell command that runs `verb`, and its stdin: the JSON arguments, unless short enough
        to be the command's last argument (`-` then reads them from stdin)."""
        current = shlex.quote(f"{self.root}/current")
        secrets = self._secrets() if verb in JOB_VERBS else {}
        payload = json.dumps({"root": self.root, **args, **({"secrets": secrets} if secrets else {})})
        # NOTE: a secret never goes on the command line: another user of the host may read it there (ps).
        inline = len(payload) <= INLINE_ARGS and not secrets
        return (f"[ -d {current} ] || exit {NOT_DEPLOYED}; cd {current} && "
                f"{self._env()}PYTHONPATH=.${{PYTHONPATH:+:$PYTHONPATH}} exec {shlex.quote(self.python)}"
                f"{' -S' if verb in BARE_VERBS else ''} -m remote {verb} {shlex.quote(payload) if inline else '-'}",
                None if inline else payload.encode())

    def _secrets(self) -> dict[str, str]:
        from local.inventory import secret_values  # here: `inv status` never reads them

        return secret_values.values(self.inventory)

    def _env(self) -> str:
        """`host.env` as shell assignments: values quoted, names checked (the inventory refuses bad ones first)."""
        for key in self.inventory.host.env:
            if not ENV_NAME.fullmatch(key):
                raise AerieError(f"host.env key {key!r} is not an environment variable name")
        return "".join(f"{k}={shlex.quote(v)} " for k, v in self.inventory.host.env.items())

    def status(self) -> dict[str, Any]:
        """`status`; a host where nothing is deployed yet simply has no jobs."""
        try:
            return self.call("status")
        except NotDeployed:
            return {"now": None, "current_release": None, "jobs": []}

    def call(self, verb: str, **args: Any) -> Any:
        """One remote command; its payload, or an `AerieError` with the host's reason."""
        return self._answer(self.transport.run(*self._invocation(verb, args)), verb)

    def stream(self, verb: str, out: BinaryIO, **args: Any) -> None:
        """A command whose stdout is text for the user (`logs`)."""
        result = self.transport.run(*self._invocation(verb, args), stream=out)
        if not result.ok:
            self._refuse(result, verb)

    def call_sent(self, verb: str, **args: Any) -> Any:
        """`call`, with this checkout's `remote/` sent along on stdin (remote/control_plane/sent.py): it works
        where nothing is deployed yet, and runs the checkout's code rather than an older release's."""
        payload = json.dumps({"root": self.root, **args}).encode()
        command = f"{self._env()}{shlex.quote(self.python)} -c {shlex.quote(SENT_AGENT.read_text())} {shlex.quote(verb)}"
        return self._answer(self.transport.run(command, stdin=payload + b"\n" + remote_sources()), verb)

    def pip_install(self, requirements: list[str], out: BinaryIO) -> None:
        """`python -m pip install` of `requirements` into the host's Python, its output copied to `out` as it comes."""
        specs = " ".join(shlex.quote(r) for r in requirements)
        result = self.transport.run(f"{self._env()}{shlex.quote(self.python)} -m pip install {specs} 2>&1", stream=out)
        if not result.ok:
            raise AerieError(f"{self.name}: pip install into {self.python} failed (exit {result.exit_code}): see its "
                             "output above")

    def release(self, verb: str, *args: str, stdin: bytes | None = None) -> Any:
        """The deploy agent, sent as source so that it runs where nothing is deployed yet."""
        argv = " ".join(shlex.quote(a) for a in (verb, self.root, *args))
        # -S: the agent needs the standard library only, and a virtualenv's site can cost more than the deploy.
        command = f"{shlex.quote(self.python)} -S -c {shlex.quote(RELEASE_AGENT)} {argv}"
        return self._answer(self.transport.run(command, stdin=stdin), f"deploy {verb}")

    def _answer(self, result: Result, what: str) -> Any:
        try:
            payload = decode(result.stdout)
        except ValueError:
            self._refuse(result, what)
        if isinstance(payload, dict) and "error" in payload:
            raise AerieError(f"{self.name}: {payload['error']}")
        return payload

    def _refuse(self, result: Result, what: str) -> None:
        if result.exit_code == NOT_DEPLOYED:
            raise NotDeployed(f"nothing is deployed to {self.name}:{self.root} yet: run {hints.inv('deploy')} first")
        if result.exit_code == 2 and result.stderr.strip():
            raise AerieError(f"{self.name}: {result.stderr.strip().splitlines()[-1]}")
        detail = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise AerieError(f"{self.name}: `{what}` failed (exit {result.exit_code}): {detail}")

    def close(self) -> None:
        self.transport.close()


def remote_sources(repo: Path = REPO) -> bytes:
    """Every module of `remote/` in the checkout, as zlib-compressed JSON {path: source}: what `call_sent` sends."""
    files = {path.relative_to(repo).as_posix(): path.read_text() for path in sorted((repo / "remote").rglob("*.py"))
             if "__pycache__" not in path.parts}
    return zlib.compress(json.dumps(files).encode(), 1)  # level 1: most of the saving for little of the time
