"""What a task asks an inventory besides its values, answered once for both of its forms.

An inventory is either the pydantic model (`local.inventory.schema.Inventory`, just validated) or
its values read back from the cache (`local.inventory.loader`), which must not import
pydantic. Both read their values as attributes, so these answers need nothing else.
"""

from __future__ import annotations

from typing import Any

from local.exceptions import AerieError


class InventoryQueries:
    """Mixed into both forms; they provide ``backend``, ``hosts``, ``datasets``, ``stages``, ``path``,
    `stage_names` and `per_host_views`."""

    __slots__ = ()

    @property
    def executor(self) -> str:
        """The host-side executor of every job (remote/control_plane/executors.py): the one place that maps the backend to it."""
        return "slurm" if self.backend == "slurm" else "process"  # type: ignore[attr-defined]

    @property
    def is_multi_host(self) -> bool:
        return bool(self.hosts)  # type: ignore[attr-defined]

    def views(self) -> dict[str, Any]:
        """One single-host inventory per host, holding the datasets it runs; {} name for one host."""
        return {"": self} if not self.is_multi_host else self.per_host_views()

    def per_host_views(self) -> dict[str, Any]:
        raise NotImplementedError

    def stage_names(self) -> list[str]:
        raise NotImplementedError

    def stage(self, name: str) -> Any:
        """A stage's settings; an unknown name is an error."""
        # NOTE: the names, not a dump of every stage: `inv run` asks once per job, thousands of times.
        known = self.stage_names()
        if name not in known:
            raise AerieError(f"unknown stage {name!r}: expected one of {', '.join(known)}")
        return getattr(self.stages, name)  # type: ignore[attr-defined]

    def select(self, names: list[str] | None) -> list[str]:
        """The named datasets in inventory order, or all of them; an unknown name is an error."""
        datasets = list(self.datasets)  # type: ignore[attr-defined]
        if not names:
            return datasets
        unknown = [n for n in names if n not in datasets]
        if unknown:
            raise AerieError(f"unknown dataset {', '.join(unknown)} in {self.path}: "  # type: ignore[attr-defined]
                             f"expected one of {', '.join(datasets) or '(none)'}")
        return [n for n in datasets if n in names]
