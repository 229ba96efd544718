"""`inv trust`: the host's key fingerprint shown, and added to known_hosts when the user confirms it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from local.exceptions import AerieError

if TYPE_CHECKING:
    from rich.console import Console

    from local.inventory.values import Inventory


def trust(inventory: Inventory, console: Console, expect: str | None, yes: bool) -> None:
    if inventory.host is None or not inventory.host.address:
        raise AerieError(f"{inventory.path}: trust works on one host reached over SSH (set host.address)")
    from local.transport import host_keys  # here: paramiko, which no other task imports before it connects
    from local.transport.paramiko_ssh import SshTransport

    transport = SshTransport(inventory.host)
    name, key = host_keys.scan(transport)
    console.print(f"{name} presents {key.get_name()} {key.fingerprint}")
    if host_keys.is_known(transport.known_hosts, name, key):
        console.print(f"Already trusted in {transport.known_hosts}.")
        return
    old = host_keys.changed(transport.known_hosts, name, key)
    if old is not None:
        console.print(f"[bold red]{name}'s key CHANGED[/]: {transport.known_hosts} holds {old.fingerprint}. "
                      "Trust the new one only if the host was rebuilt.")
    if expect and expect != key.fingerprint:
        raise AerieError(f"{name}: fingerprint is {key.fingerprint}, not the expected {expect}: not trusted")
    question = "Replace the old key with this one?" if old is not None else f"Trust this key for {name}?"
    if not (expect or yes or _confirm(console, f"{question} Compare it with the host's own `ssh-keygen -lf`.")):
        raise AerieError(f"{name}: not trusted; nothing was written")
    replaced = host_keys.add(transport.known_hosts, name, key)
    console.print(f"{'Replaced the changed key of' if replaced else 'Added'} {name} in {transport.known_hosts}.")


def _confirm(console: Console, question: str) -> bool:
    if not sys.stdin.isatty():
        raise AerieError("no terminal to confirm on: pass --fingerprint SHA256:... (from the host's admin) or --yes")
    return console.input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
