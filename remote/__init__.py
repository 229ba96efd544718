"""The host side of aerie: shipped to the GPU host by `inv deploy` and run there.

The control plane (`remote.control_plane`: jobs, their supervisor, executors,
status) uses the standard library only, because the host's Python may have
nothing else installed; `remote.orchestration` runs stages in order. The stages under `remote.stages` may
import `datasets`, `transformers` and `torch`, which the host provides.
The workstation imports one part of it: `remote.vocabulary`, the words both sides share.

Every `inv status` or `inv launch` starts Python here, so what those verbs
import is what they wait for. Their modules import `typing` only for type
checkers: ``TYPE_CHECKING = False`` then ``if TYPE_CHECKING:`` (type checkers
read the name as `typing.TYPE_CHECKING`), because importing `typing` is a
measurable share of the host's part of an `inv status` (docs/benchmarks.md).
"""
