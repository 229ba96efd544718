"""`inv deploy`: what changed sent to each host as a new release, and said in a few lines (local/host/releases.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from local.console import line
from local.exceptions import AerieError
from local.visible import visible

if TYPE_CHECKING:
    from rich.console import Console

    from local.host.verbs import RemoteHost

LISTED = 12  # paths a deploy lists before it summarises (a dry run lists all)
#: What Ctrl-C leaves, before anything was sent and after: the host switches `current` in one rename, once a
#: release has arrived whole (remote/control_plane/release.py), so it never runs half of one.
NOTHING_SENT = "deploy interrupted (Ctrl-C) before anything was sent: the host runs the release it ran"
INTERRUPTED = ("deploy interrupted (Ctrl-C): the host runs a whole release, the one it ran or this checkout's (a "
               "release goes live in one rename, once it has arrived whole); `inv deploy` again says which, and sends "
               "what is missing")


def deploy(host: RemoteHost, console: Console, dry_run: bool = False) -> str | None:
    """Send what changed to one host (`inv deploy` has validated the inventory's data first)."""
    from local.host import releases  # here: `inv status` and `inv launch` never need it

    diff = releases.diff(host, releases.manifest(ship=host.inventory.deploy.ship))
    releases.check_sources(paths=diff.send)
    where = f"{host.name}:{host.root}"
    if diff.is_noop:
        console.print(line(f"Nothing to deploy: {where} runs release {visible(str(diff.base))}, identical to this checkout."))
        return diff.base
    listed = [(label, path, style) for label, paths, style in
              (("add", diff.added, "green"), ("change", diff.changed, "yellow"), ("remove", diff.removed, "red"))
              for path in paths]
    shown = listed if dry_run else listed[:LISTED]
    for label, path, style in shown:  # a removed path is the host's manifest's: shown, never read as markup
        console.print(line((f"  {label:<6}", style), f" {visible(path)}"))
    if len(shown) < len(listed):
        console.print(f"  ... and {len(listed) - len(shown)} more (`inv deploy --dry-run` lists all)")
    summary = f"{len(diff.added)} added, {len(diff.changed)} changed, {len(diff.removed)} removed"
    if dry_run:
        console.print(line(f"Dry run: would deploy {summary} to {where} (now {visible(str(diff.base or 'nothing'))}); "
                            f"it sends {_shipped(host.inventory.deploy.ship)}."))
        return None
    answer = releases.push(host, diff)
    release, pruned = answer["id"], answer.get("pruned", [])
    live = releases.current_release(host)  # read after the switch: a deploy from elsewhere may have followed it
    if live.get("files") != diff.files:
        raise AerieError(f"{where}: another deploy replaced release {release} before this one ended; the host runs "
                         f"{visible(str(live.get('id')))}, not this checkout: `inv deploy` again to send it")
    live_as = "it is live" if live.get("id") == release else f"the host runs {visible(str(live.get('id')))}, the same files"
    kept = (f"; removed {len(pruned)} older release{'s' * (len(pruned) != 1)} (deploy.keep: "
            f"{host.inventory.deploy.keep})") if pruned else ""
    console.print(line(f"Deployed release {release} to {where}: {summary}; {live_as}{kept}."))
    return release


def _shipped(ship: list[str]) -> str:
    from local.host.releases import SHIPPED

    return ", ".join(f"{top}/" for top in SHIPPED) + (f" and deploy.ship: {visible(', '.join(ship))}" if ship else
                                                      " (add your own files with deploy.ship in the inventory)")
