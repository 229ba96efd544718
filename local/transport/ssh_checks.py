"""What both SSH clients (local/transport/openssh.py, local/transport/paramiko_ssh.py) check before they
connect: which known_hosts file holds the host's key, and, under the test suite, that the address is loopback."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from local.exceptions import AerieError

if TYPE_CHECKING:
    from local.inventory.values import Host

#: Set by the test suite: refuse any SSH address that is not loopback.
LOOPBACK_ONLY_ENV = "AERIE_TEST_ONLY_LOOPBACK"


def known_hosts(host: Host) -> Path:
    """The host keys both SSH clients check against: the inventory's file, else the user's own."""
    return Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()


def refuse_non_loopback(address: str) -> None:
    if not os.environ.get(LOOPBACK_ONLY_ENV):
        return
    resolved = socket.getaddrinfo(address, None)[0][4][0]
    if not ipaddress.ip_address(resolved).is_loopback:
        raise AerieError(f"refusing to connect to {address} ({resolved}): tests may reach loopback only")
