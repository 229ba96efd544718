"""Job specs: what the host needs to run one stage of one dataset, built from the inventory.

Every spec is a `JobSpec`, built by `job_spec`; a stage's settings go into its config by `stage_settings`.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, TypedDict

from local.exceptions import AerieError
from local.inventory import secret_values
from local.inventory.fields import dump
from remote.vocabulary import layout
from remote.vocabulary.states import DRAFT

if TYPE_CHECKING:
    from local.inventory.values import Inventory

#: A stage's settings that its spec carries as keys of its own, so that its config leaves them out: the
#: host's supervisor runs `command` and watches `stall_after`; the stage reads neither.
SPEC_ONLY = frozenset({"command", "stall_after"})
#: The name of train's draft when ``stages.eval.drafts`` is unset.
DEFAULT_DRAFT = "draft"


class _Job(TypedDict):
    """The keys every job's spec has."""

    dataset: str
    """The dataset it runs over (`draft` for the draft's jobs, `pipeline` for the runner): with `stage`, the job's
    name on the host (`layout.job_key`) and its folder there; the stage gets it as AERIE_DATASET."""
    stage: str
    """The stage it runs: the host runs that stage's default command unless `command` names another; the stage
    gets it as AERIE_STAGE."""
    command: str | None
    """The shell command the host's supervisor runs (`{python}`: the host's interpreter); None: the stage's default."""
    source: str
    """What the stage reads, as AERIE_SOURCE: the dataset's file or hub id, or tokenize's answers; "" for the
    draft's jobs and the runner."""
    kind: str
    """How the stage reads `source`, as AERIE_KIND: ``native`` chats or ``prompts``."""
    stall_after: float
    """Seconds without progress after which the host calls the live job `stalled`."""
    config: dict[str, Any]
    """What the stage reads, as AERIE_CONFIG: its settings (``stage``, from `stage_settings`), the target
    (``inventory``), the dataset's entry (``dataset``) and, for a stage that reads another's output, the folders
    it reads (``inputs``, ``prep_inputs``)."""


class JobSpec(_Job, total=False):
    """One job's spec, as `launch` (and the runner, for each job of its plan) gets it."""

    log_limit: int
    """The most bytes of the job's log its supervisor keeps while it runs; absent: no cap (the runner's)."""
    executor: str
    """What runs it on the host (remote/control_plane/executors.py): ``process`` or ``slurm``; absent: ``slurm``
    where `slurm` is given, else ``process``."""
    slurm: dict[str, Any]
    """The `sbatch` resources of its stage, for the slurm executor (the process executor ignores them)."""


def job_spec(dataset: str, stage: str, config: dict[str, Any], *, command: str | None, stall_after: float,
             log_limit: int | None = None, source: str = "", kind: str = "native", executor: str | None = None,
             slurm: dict[str, Any] | None = None) -> JobSpec:
    """The one builder of a spec; `log_limit`, `executor` and `slurm` left None are left out of it."""
    job: JobSpec = {"dataset": dataset, "stage": stage, "command": command, "source": source, "kind": kind,
                    "stall_after": stall_after, "config": config}
    if log_limit is not None:
        job["log_limit"] = log_limit
    if executor is not None:
        job["executor"] = executor
    if slurm is not None:
        job["slurm"] = slurm
    return job


def spec(inventory: Inventory, dataset: str, stage: str, inputs: list[str] | None = None,
         source: str | None = None) -> JobSpec:
    """Stage `stage` of `dataset`, on the executor that runs it, whole: nothing is patched in later.

    `inputs`: the folders it reads, for a stage that reads another's output (extract);
    `source`: a file it reads in place of the dataset's own, as native chats (tokenize: the target's answers).
    """
    settings = inventory.stage(settings_of(stage))
    entry = dataset_entry(inventory, dataset)
    if source is not None:
        entry |= {"source": source, "kind": "native"}
    config = {"dataset": entry, **stage_config(inventory, stage)}
    if inputs is not None:
        config["inputs"] = inputs
    return job_spec(dataset, stage, config, command=settings.command, stall_after=settings.stall_after,
                    log_limit=settings.log_limit, source=entry["source"], kind=entry["kind"],
                    **placement(inventory, stage))


def eval_spec(inventory: Inventory) -> JobSpec:
    """`inv eval`'s ``draft/eval`` job (remote/stages/eval.py), every default resolved here (the host's settings
    have no defaults of their own)."""
    settings = inventory.stages.eval
    root = inventory.host.root
    model = settings.model or inventory.target.model
    if not model:
        raise AerieError(f"{inventory.path}: inv eval needs the target: set target.model or stages.eval.model")
    # The offline route's draft: the weights (`draft`) in draft/train's output on the host.
    trained = layout.output_dir(PurePosixPath(root), DRAFT, "train") / "draft"
    resolved = on_host({"model": model, "drafts": settings.drafts or {DEFAULT_DRAFT: str(trained)}}, root)
    resolved["server_env"] = secret_values.seal_env("stages.eval.server_env", settings.server_env)  # never in clear
    config = {"stage": stage_settings(settings, root) | resolved, "inventory": shared_config(inventory)}
    return job_spec(DRAFT, "eval", config, command=settings.command, stall_after=settings.stall_after,
                    log_limit=settings.log_limit)


def settings_of(stage: str) -> str:
    """The stage whose settings a stage runs with: tokenize is prep over the target's answers."""
    return "prep" if stage == "tokenize" else stage


def stage_config(inventory: Inventory, stage: str) -> dict[str, Any]:
    """The stage's settings and the target, `{root}` made the host's: the part of `config` every job has."""
    name = settings_of(stage)
    values = stage_settings(inventory.stage(name), inventory.host.root)
    for field in secret_values.SEALED_ENVS:  # infer's server, extract's SpecForge: never a secret in clear
        if field in values:
            values[field] = secret_values.seal_env(f"stages.{name}.{field}", values[field])
    return {"stage": values, "inventory": shared_config(inventory)}


def sent_settings(inventory: Inventory, stage: str) -> dict[str, Any]:
    """`stage`'s settings as its job's spec carries them (``config.stage``): `inv plan` and `inv check` read a
    stage's settings from here too, so that each reaches the host built one way."""
    return stage_config(inventory, stage)["stage"]


def shared_config(inventory: Inventory) -> dict[str, Any]:
    """``config.inventory``: what every stage reads of the inventory besides its own settings (the target)."""
    return {"target": dumped(inventory.target, inventory.host.root)}


def stage_settings(settings: Any, root: str | None, keep_command: bool = False) -> dict[str, Any]:
    """A stage's settings as a job's config holds them: all but `SPEC_ONLY`'s, `{root}` made the host's (None:
    as written). `keep_command`: for the stages draft/chunked runs itself, which need their `command` to decide
    whether they run in its process (the built-in stage) or as the command named (remote/orchestration/chunked.py)."""
    return dumped(settings, root, SPEC_ONLY - {"command"} if keep_command else SPEC_ONLY)


def dataset_entry(inventory: Inventory, name: str) -> dict[str, Any]:
    """A dataset's inventory entry, as written (``config.dataset``)."""
    return dumped(inventory.datasets[name], None)


def dumped(values_of: Any, root: str | None, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
    """An inventory record's values less `exclude`, `{root}` made `root` (None: as written): the one dump of them."""
    values = dump(values_of, exclude=exclude)
    return values if root is None else on_host(values, root)


def placement(inventory: Inventory, stage: str) -> dict[str, Any]:
    """The executor that runs the job (named once, by the inventory) and, for one that queues jobs on a
    cluster, the resources of its stage (ignored where there is no such queue)."""
    return {"executor": inventory.executor, "slurm": inventory.slurm.for_stage(settings_of(stage))}


def specs(inventory: Inventory, stage: str, datasets: list[str] | None) -> list[JobSpec]:
    return [spec(inventory, name, stage) for name in inventory.select(datasets)]


def all_specs(inventory: Inventory) -> dict[str, JobSpec]:
    """Every (dataset, stage) spec, keyed as the host names job directories, for `rerun`."""
    return {
        layout.job_key(name, stage): spec(inventory, name, stage)
        for name in inventory.datasets
        for stage in inventory.stage_names()  # every stage the schema declares, in its order
    }


def inventory_key(dataset: str, stage: str, path: list[str]) -> str:
    """The inventory's name of the setting at `path` in the spec of `dataset`'s `stage` (as `spec` and
    graph's draft jobs build it), for a rerun to say what changed: ``stages.extract.layers``."""
    head, rest = (path[0], path[1:]) if path else ("", [])
    if head == "config" and rest[:1] == ["stage"]:
        inner = rest[1:]
        if stage == "chunked":  # both stages' settings under their names; the budget is extract's
            return ".".join(["stages", *(inner if inner[:1] in (["extract"], ["train"]) else ["extract", *inner])])
        return ".".join(["stages", settings_of(stage), *inner])
    if head == "config" and rest[:2] == ["inventory", "target"]:
        return ".".join(["target", *rest[2:]])
    if head == "config" and rest[:1] == ["dataset"]:
        return ".".join(["datasets", dataset, *rest[1:]])
    if head in ("command", "stall_after", "log_limit"):
        return f"stages.{settings_of(stage)}.{head}"
    if head in ("source", "kind"):
        return f"datasets.{dataset}.{head}"
    return ".".join(path)


def on_host(settings: Any, root: str) -> Any:
    """`{root}` in a setting means the host's root (e.g. assets built there by `inv demo`), at any depth."""
    if isinstance(settings, dict):
        return {k: on_host(v, root) for k, v in settings.items()}
    if isinstance(settings, list):
        return [on_host(v, root) for v in settings]
    return settings.replace("{root}", root) if isinstance(settings, str) else settings
