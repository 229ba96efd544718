"""Inventories validated once, then read back without YAML or pydantic.

Importing pydantic and building the inventory's models is about a fifth of what
`inv deploy` costs as typed. An inventory that validated is kept as compact JSON
under .aerie/cache/inventory/, keyed by its file's bytes and path and the schema's
code (local/inventory/schema.py); while they are unchanged, `load` reads that JSON back.

What comes back reads like the models: attributes, `model_dump`, `model_dump_json`,
what `local.inventory.queries` answers for both (`stage`, `select`, `views`, `executor`),
and `slurm.for_stage`. Anything else (e.g. `assignment()`, or an unknown
dataset's refusal) is answered by the real pydantic model, built from the cached values
the first time it is needed.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from local.inventory.queries import InventoryQueries
from local.paths import REPO, resolve_path, write_replacing

if TYPE_CHECKING:
    from pydantic import BaseModel

    from local.inventory.schema import Inventory

CACHE = REPO / ".aerie" / "cache" / "inventory"
#: What decides how a file becomes an inventory: the schema, its defaults, and `load`'s rules.
SCHEMA_CODE = (REPO / "local" / "inventory" / "schema.py", REPO / "local" / "paths.py")


class Record:
    """One model's validated values: attributes and dumps as pydantic gives them, the rest from the model."""

    __slots__ = ("_data", "_given", "_shape", "_wrapped", "_real")

    def __init__(self, data: dict[str, Any], given: dict[str, Any], shape: dict[str, Any],
                 real: BaseModel | None = None) -> None:
        # `given`: only the keys the file set, so that the model rebuilt from it knows what
        # was left to its default (`Slurm.for_stage` reads `exclude_unset`).
        self._data, self._given, self._shape, self._wrapped, self._real = data, given, shape, {}, real

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._data:
            if name not in self._wrapped:
                self._wrapped[name] = self._wrap(name)
            return self._wrapped[name]
        return getattr(self._model(), name)

    def _wrap(self, name: str) -> Any:
        value, given, shape = self._data[name], self._given.get(name) or {}, self._shape["fields"].get(name)
        if shape is None or value is None:
            return value
        if "values" in shape:  # e.g. datasets: a dict of models
            return {key: Record(item, given.get(key) or {}, shape["values"]) for key, item in value.items()}
        return Record(value, given, shape)

    def _model(self) -> BaseModel:
        if self._real is None:
            from local.inventory import schema  # NOTE: pydantic, only for what the cache cannot answer

            self._real = getattr(schema, self._shape["class"]).model_validate(self._given)
        return self._real

    def model_dump(self, *, exclude: set[str] | None = None, **options: Any) -> dict[str, Any]:
        if options or not isinstance(exclude, (set, frozenset, type(None))):
            return self._model().model_dump(exclude=exclude, **options)
        return {key: copy.deepcopy(value) for key, value in self._data.items() if key not in (exclude or ())}

    def model_dump_json(self) -> str:
        return json.dumps(self._data, sort_keys=True)


class CachedInventory(InventoryQueries, Record):
    """An `Inventory` read back from the cache; `path` is where its file is.

    Besides the values, the cache keeps what `inv launch` and `inv rerun` ask the model for
    (`derived`: each stage's Slurm resources), computed by the model when it was validated,
    so that these tasks never import pydantic either. The rest of what tasks ask
    (`select`, `stage`, `views`, `executor`) is `InventoryQueries`', shared with the model.
    """

    __slots__ = ("path", "_derived")

    def __init__(self, data: dict[str, Any], given: dict[str, Any], shape: dict[str, Any], path: Path,
                 derived: dict[str, Any], real: Inventory | None = None) -> None:
        super().__init__(data, given, shape, real)
        self.path, self._derived = path, derived

    @property
    def slurm(self) -> Any:
        return SlurmResources(self.__getattr__("slurm"), self._derived["slurm"])

    def stage_names(self) -> list[str]:
        return list(self._data["stages"])

    def per_host_views(self) -> dict[str, Any]:
        return self._model().per_host_views()  # type: ignore[attr-defined]

    def _model(self) -> BaseModel:
        real = super()._model()
        real.path = self.path  # type: ignore[attr-defined]
        return real


class SlurmResources:
    """`schema.slurm`, whose `for_stage` answers from the cache."""

    def __init__(self, record: Record, by_stage: dict[str, dict[str, Any]]) -> None:
        self.record, self.by_stage = record, by_stage

    def __getattr__(self, name: str) -> Any:
        return getattr(self.record, name)

    def for_stage(self, stage: str) -> dict[str, Any]:
        return copy.deepcopy(self.by_stage[stage]) if stage in self.by_stage else self.record.for_stage(stage)


def load(name_or_path: str, cache: Path = CACHE) -> Inventory:
    """`local.inventory.schema.load`, validated once per version of the file and of the schema."""
    path = resolve_path(name_or_path)
    try:
        key = _key(path)
    except OSError:  # a missing file: the full load says so in one line
        key = None
    if key is not None:
        stored = _read(cache / f"{key}.json", path)
        if stored is not None:
            return stored  # type: ignore[return-value]
    from local.inventory import schema

    real = schema.load(name_or_path)
    data, given = real.model_dump(mode="json"), real.model_dump(mode="json", exclude_unset=True)
    shape = shape_of(type(real))
    derived = {"slurm": {stage: real.slurm.for_stage(stage) for stage in data["stages"]}}
    if key is not None:
        _write(cache, key, {"key": key, "path": str(path), "data": data, "given": given, "shape": shape,
                            "derived": derived})
    return CachedInventory(data, given, shape, path, derived, real)  # type: ignore[return-value]


def shape_of(model: type[BaseModel]) -> dict[str, Any]:
    """Which fields of `model` hold models (or dicts of models), down to the leaves, by class name."""
    from typing import get_args, get_origin

    from pydantic import BaseModel

    def is_model(kind: Any) -> bool:
        return isinstance(kind, type) and issubclass(kind, BaseModel)

    fields: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if get_origin(annotation) is dict and is_model(get_args(annotation)[1]):
            fields[name] = {"values": shape_of(get_args(annotation)[1])}
            continue
        inner = [kind for kind in (annotation, *get_args(annotation)) if is_model(kind)]
        if inner:
            fields[name] = shape_of(inner[0])
    return {"class": model.__name__, "fields": fields}


def _key(path: Path) -> str:
    digest = hashlib.sha256(f"{path.resolve()}\0{REPO}\0".encode() + path.read_bytes())
    for code in SCHEMA_CODE:
        digest.update(b"\0" + code.read_bytes())
    return digest.hexdigest()


def _read(file: Path, path: Path) -> CachedInventory | None:
    try:
        stored = json.loads(file.read_text())
        if stored["key"] == file.stem and isinstance(stored["data"], dict) and isinstance(stored["given"], dict) \
                and isinstance(stored["shape"]["fields"], dict) and isinstance(stored["derived"]["slurm"], dict):
            return CachedInventory(stored["data"], stored["given"], stored["shape"], path, stored["derived"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # NOTE: a corrupt entry costs one full load, never the task
    return None


def _write(cache: Path, key: str, document: dict[str, Any]) -> None:
    try:
        write_replacing(cache / f"{key}.json", json.dumps(document))
    except OSError:
        pass  # a read-only checkout validates every time, as before
