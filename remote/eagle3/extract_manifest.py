"""The extract stage's manifest as training reads it, typed: the layers the states were captured at, their width.

Train takes the draft's layers from here, never from a setting of its own: the states on disk are
what the draft reads, whatever the inventory says today.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from remote.eagle3 import StageInputError, read_upstream_manifest

#: The fields train needs; a manifest without them comes from an older aerie (without ``hidden_states``,
#: its states were kept under the ids' old meaning: one layer off on a Kimi target).
REQUIRED = ("release", "layers", "hidden_states", "hidden_size", "width")
#: The fields every input of one training must share.
SHARED = ("layers", "hidden_states", "hidden_size", "width")


@dataclass(frozen=True)
class ExtractManifest:
    """What train reads of ``<extract output>/manifest.json``."""

    #: The release that extracted the states (saved beside each draft).
    release: str
    #: The auxiliary layer ids, as the draft's config gives them to SGLang (`remote.eagle3.layer_ids`).
    layers: list[int]
    #: The HF hidden_states those ids captured.
    hidden_states: list[int]
    hidden_size: int
    #: The aux states' width: ``len(layers) x hidden_size``.
    width: int
    records: int
    #: The dtype the states are stored in (None: an extract that did not say).
    dtype: str | None

    @classmethod
    def read(cls, directory: Path) -> "ExtractManifest":
        """The manifest in `directory`, refused in one line when extract did not finish or an older aerie wrote it."""
        raw = read_upstream_manifest(directory, "extract", REQUIRED)
        layers = raw["layers"]
        if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise StageInputError(f"extract manifest {directory / 'manifest.json'}: layers {layers!r} are not layer ids; rerun extract")
        try:
            return cls(str(raw["release"]), list(layers), [int(i) for i in raw["hidden_states"]], int(raw["hidden_size"]),
                       int(raw["width"]), int(raw.get("records") or 0), raw.get("dtype"))
        except (TypeError, ValueError):
            raise StageInputError(f"extract manifest {directory / 'manifest.json'} is malformed: rerun extract") from None

    @classmethod
    def read_all(cls, directories: list[Path]) -> "ExtractManifest":
        """One manifest standing for every input (the draft trains on every dataset's states), refused when
        they were extracted with different layers or from a different target width; records summed."""
        manifests = [cls.read(d) for d in directories]
        first = manifests[0]
        for directory, manifest in zip(directories[1:], manifests[1:]):
            for key in SHARED:
                if getattr(manifest, key) != getattr(first, key):
                    raise StageInputError(
                        f"{directory}: extracted with {key} {getattr(manifest, key)}, but {directories[0]} with "
                        f"{getattr(first, key)}: rerun extract for all datasets with the same settings")
        return cls(first.release, first.layers, first.hidden_states, first.hidden_size, first.width,
                   sum(m.records for m in manifests), first.dtype)
