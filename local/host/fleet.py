"""Several hosts as one: each host's work runs in parallel, each host's failure stays its own.

An inventory with `hosts:` becomes one single-host view per host (the datasets it
runs); a task's work runs on every view at once, like Fabric's `ThreadingGroup`,
and each host's output is shown in one piece under its name. One host that is
down is reported, and does not delay or fail the others' work.
"""

from __future__ import annotations

import io
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from local.transport.shared import shared
from local.exceptions import AerieError
from local.host.verbs import RemoteHost
from local.inventory.loader import load
from local.visible import visible

if TYPE_CHECKING:
    from rich.console import Console

    from local.inventory.values import Inventory

T = TypeVar("T")


@dataclass
class Fleet:
    inventory: Inventory
    hosts: dict[str, RemoteHost]
    """By host name ("" for an inventory with one `host`)."""

    @property
    def is_multi(self) -> bool:
        return self.inventory.is_multi_host

    @property
    def single(self) -> RemoteHost:
        if self.is_multi:
            raise AerieError(f"{self.inventory.path} has several hosts; this task works on one")
        return self.hosts[""]

    def each(self, work: Callable[[RemoteHost, Console], T], console: Console) -> dict[str, T | AerieError]:
        """`work` on every host; one host: as is, errors raised; several: in parallel, errors collected."""
        if not self.is_multi:
            return {"": work(self.single, console)}
        from rich.console import Console
        from rich.rule import Rule
        from rich.text import Text

        outputs = {name: io.StringIO() for name in self.hosts}

        def buffered(name: str, host: RemoteHost) -> T:
            out = Console(file=outputs[name], width=console.width, highlight=False, soft_wrap=True,
                          force_terminal=console.is_terminal, color_system=console.color_system)
            return work(host, out)

        results = self._in_parallel(buffered)
        for name in self.hosts:
            console.print(Rule(f"{name} ({self.hosts[name].name})", align="left"))
            console.out(outputs[name].getvalue(), end="", highlight=False)
            if isinstance(results[name], AerieError):
                console.print(Text(f"{name}: {visible(str(results[name]))}", "bold red"))
        return results

    @property
    def title(self) -> str:
        return ", ".join(f"{h.name}:{h.root}" for h in self.hosts.values())

    def host_of(self, dataset: str) -> RemoteHost:
        """The host that runs `dataset` (the pipeline's pseudo datasets: the only host)."""
        if not self.is_multi:
            return self.single
        self.inventory.select([dataset])
        return self.hosts[self.inventory.assignment()[dataset]]

    def name_of(self, host: RemoteHost) -> str:
        """The inventory's name for one of this fleet's hosts (`each` keys its results by it)."""
        return next(name for name, one in self.hosts.items() if one is host)

    def raise_failures(self, results: dict[str, Any]) -> None:
        """After every host has had its turn: one error naming each host that failed."""
        failed = {name: r for name, r in results.items() if isinstance(r, AerieError)}
        if failed:
            raise AerieError("failed on " + ", ".join(f"{name} ({error})" for name, error in failed.items()))

    def status(self) -> dict[str, Any]:
        """Every host's jobs in one answer, each tagged with its host; unreachable hosts listed."""
        if not self.is_multi:
            return self.single.status()
        answers = self._in_parallel(lambda name, host: host.status())
        merged: dict[str, Any] = {"jobs": [], "unreachable": [], "current_release": {}, "now": None}
        for name, answer in answers.items():
            if isinstance(answer, AerieError):
                merged["unreachable"].append({"host": name, "message": str(answer)})
                continue
            merged["now"] = answer["now"]
            merged["current_release"][name] = answer["current_release"]
            merged["jobs"] += [{**job, "host": name} for job in answer["jobs"]]
            merged.setdefault("gpus", []).extend({**gpu, "host": name} for gpu in answer.get("gpus", []))
        return merged

    def _in_parallel(self, work: Callable[[str, RemoteHost], T]) -> dict[str, T | AerieError]:
        """`work(name, host)` on every host at once; a host's `AerieError` is its result, not raised."""
        from concurrent.futures import ThreadPoolExecutor  # here: one host, the common case, needs no threads

        def attempt(name: str) -> T | AerieError:
            try:
                return work(name, self.hosts[name])
            except AerieError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
            return dict(zip(self.hosts, pool.map(attempt, self.hosts)))

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()


@contextmanager
def fleet(name: str) -> Iterator[Fleet]:
    inventory = load(name)
    # Shared: the tasks of one `inv` invocation (`inv deploy rerun --failed`) use one connection per host.
    group = Fleet(inventory, {host: RemoteHost(view, shared(view.host)) for host, view in inventory.views().items()})
    try:
        yield group
    finally:
        group.close()
