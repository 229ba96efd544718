"""`inv check`: the host's checks before a run, from this checkout's code sent along; `--install` first installs
pyproject's `host` extra into the host's Python."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from local.console import line
from local.jobs import specs
from local.views import tables
from local.visible import VisibleStream, visible

if TYPE_CHECKING:
    from rich.console import Console

    from local.host.verbs import RemoteHost


def check(host: RemoteHost, console: Console, install: bool = False, verify: bool = False) -> list[dict[str, Any]]:
    """The host's checks, run from this checkout's code sent along (`call_sent`): nothing needs to be deployed.
    `install`: first install pyproject's `host` extra into the host's Python. `verify`: also check every
    stored state against the size and checksum extract recorded (reads them all)."""
    from local.tasks import planning

    inventory = host.inventory
    if install:
        from local.host import packages

        wanted = packages.requirements()
        console.print(line(f"installing into {visible(host.python)} on {host.name}: {' '.join(wanted)}"))
        out = VisibleStream(sys.stdout.buffer)  # pip's words, as the host's: shown, never obeyed
        try:
            host.pip_install(wanted, out)
        finally:
            out.close()
    extract = specs.sent_settings(inventory, "extract")  # as extract's job gets them: one way to the host
    results = host.call_sent("check", layers=extract["layers"], dtype=extract["dtype"],
                             datasets=list(inventory.datasets),
                             model=specs.dumped(inventory.target, host.root)["model"],
                             server_url=inventory.stages.infer.server_url,
                             readiness=planning.readiness(inventory, host.root),
                             extract_engine=extract["engine"], verify=verify)
    console.print(tables.checks(results, f"checks on {host.name}"))
    return results
