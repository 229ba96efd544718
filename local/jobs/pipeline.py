"""`inv run`: the whole pipeline as a graph of jobs, which the host's runner (remote/orchestration/runner.py) executes.

Per dataset: ``prep``; for a prompts dataset then ``infer`` (the target answers
the prompts) and ``tokenize`` (prep over those answers). Then, by the route the
run takes (`stages.extract.route`; for ``auto``, the one `inv plan` finds fits):

- ``offline``: every dataset's ``extract``, then one ``draft/train`` over every dataset's states;
- ``chunked``: one ``draft/chunked`` job (`remote/orchestration/chunked.py`) in place of the extracts
  and the train, needing every dataset's prep (tokenize for a prompts dataset);
- ``online``: no extract; ``draft/train`` (SpecForge with the target alongside) needs the prep outputs.

Each job's spec is built whole, once, by `local.jobs.specs.job_spec` (through `spec` for a dataset's stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Callable

from local.inventory import secret_values
from local.jobs.specs import (JobSpec, dataset_entry, job_spec, placement, shared_config, spec, stage_config,
                              stage_settings)
from remote.vocabulary import layout
from remote.vocabulary.states import DRAFT, RUNNER, RUNNER_STAGE

if TYPE_CHECKING:
    from local.inventory.values import Inventory

GPU_STAGES = {"infer", "extract", "train"}


@dataclass(frozen=True)
class Step:
    """One job of the run and what it needs; its spec is built only when asked (`inv status` builds those of the
    jobs that ran alone, not every job of a large inventory's plan)."""

    dataset: str
    stage: str
    needs: list[str]
    build: Callable[[], JobSpec]
    gpu: bool = False
    as_launched: bool = False
    """Its spec is that of the job launched alone (`spec`, as is): `inv status` need not build it twice."""

    @property
    def key(self) -> str:
        return layout.job_key(self.dataset, self.stage)

    def node(self) -> dict[str, Any]:
        # NOTE: every node carries its executor; the host picks how the plan runs from it (remote.orchestration.runner.start).
        return {"key": self.key, "needs": self.needs, "gpu": self.gpu or self.stage in GPU_STAGES,
                "server": self.stage == "infer", "spec": self.build()}


def tokens_of(inventory: Inventory, name: str) -> str:
    """The stage whose output holds a dataset's tokenised records: tokenize for a prompts dataset."""
    return "tokenize" if inventory.datasets[name].kind == "prompts" else "prep"


def host_output(inventory: Inventory, name: str, stage: str) -> str:
    """Where a dataset's stage writes on the host (`remote.vocabulary.layout`: the host's paths are POSIX)."""
    return str(layout.output_dir(PurePosixPath(inventory.host.root), name, stage))


def dataset_steps(inventory: Inventory, name: str, extract: bool) -> list[Step]:
    chain = [Step(name, "prep", [], lambda: spec(inventory, name, "prep"), as_launched=True)]
    if inventory.datasets[name].kind == "prompts":
        answers = f"{host_output(inventory, name, 'infer')}/conversations.jsonl"
        chain.append(Step(name, "infer", [layout.job_key(name, "prep")], lambda: spec(inventory, name, "infer"),
                          as_launched=True))
        chain.append(Step(name, "tokenize", [layout.job_key(name, "infer")],
                          lambda: spec(inventory, name, "tokenize", source=answers)))
    if extract:
        tokens = tokens_of(inventory, name)
        chain.append(Step(name, "extract", [layout.job_key(name, tokens)],
                          lambda: spec(inventory, name, "extract", inputs=[host_output(inventory, name, tokens)])))
    return chain


def steps(inventory: Inventory, datasets: list[str] | None, route: str) -> list[Step]:
    """Every job of the run and what each needs, for `route` (auto: not resolved, so offline)."""
    names = inventory.select(datasets)
    offline = route in ("auto", "offline")
    each = [s for name in names for s in dataset_steps(inventory, name, extract=offline)]
    if offline:
        extracts = [host_output(inventory, name, "extract") for name in names]
        return each + [Step(DRAFT, "train", [layout.job_key(name, "extract") for name in names],
                            lambda: draft_train(inventory, names[0], {"inputs": extracts}))]
    prepped = [layout.job_key(name, tokens_of(inventory, name)) for name in names]  # each dataset's prep or tokenize
    preps = {name: host_output(inventory, name, tokens_of(inventory, name)) for name in names}
    if route == "online":
        return each + [Step(DRAFT, "train", prepped, lambda: draft_train(inventory, names[0], {"prep_inputs": preps}))]
    return each + [Step(DRAFT, "chunked", prepped, lambda: draft_chunked(inventory, preps), gpu=True)]


def graph(inventory: Inventory, datasets: list[str] | None, route: str) -> list[dict[str, Any]]:
    """The run's plan, as the host's runner reads it: `steps` with their specs."""
    return [step.node() for step in steps(inventory, datasets, route)]


def draft_train(inventory: Inventory, first: str, inputs: dict[str, Any]) -> JobSpec:
    """`draft/train` over every dataset: its extracted states (`inputs`), or their prep's output (`prep_inputs`,
    online: SGLang captures the states of `stages.extract.layers` as SpecForge trains)."""
    settings = inventory.stages.train
    config = {"dataset": dataset_entry(inventory, first), **stage_config(inventory, "train"), **inputs}
    if "prep_inputs" in inputs:  # no extract job: SGLang captures what extract's settings name (typed on the host)
        config["extract"] = stage_config(inventory, "extract")["stage"]
    return job_spec(DRAFT, "train", config, command=settings.command, stall_after=settings.stall_after,
                    log_limit=settings.log_limit, **placement(inventory, "train"))


def draft_chunked(inventory: Inventory, preps: dict[str, str]) -> JobSpec:
    """`draft/chunked`: extract and train chunk by chunk (`remote/orchestration/chunked.py`), with both stages' settings."""
    extract, training = inventory.stages.extract, inventory.stages.train
    root = inventory.host.root
    # NOTE: it runs both stages itself, so their settings keep `command` (see `stage_settings`).
    both = {"extract": stage_settings(extract, root, keep_command=True),
            "train": stage_settings(training, root, keep_command=True)}
    config = {"dataset": {}, "inventory": shared_config(inventory), "prep_inputs": preps,
              "stage": {"disk_budget": extract.disk_budget, **both}}
    return job_spec(DRAFT, "chunked", config, command=None, log_limit=extract.log_limit,
                    stall_after=max(extract.stall_after, training.stall_after), **placement(inventory, "extract"))


def server_settings(inventory: Inventory) -> dict[str, Any]:
    infer = inventory.stages.infer
    return {"command": infer.server_command and infer.server_command.replace("{root}", inventory.host.root),
            "url": infer.server_url, "start_timeout": infer.server_start_timeout,
            "env": secret_values.seal_env("stages.infer.server_env", infer.server_env)}


def notify_settings(inventory: Inventory) -> dict[str, Any] | None:
    """`notify:` as the runner reads it (remote/control_plane/notify.py): the webhook sealed, never in clear."""
    notify = inventory.notify
    if notify is None:
        return None
    return {"url": notify.url and secret_values.seal("notify.url", notify.url), "command": notify.command,
            "jobs": notify.jobs, "timeout": notify.timeout}


def runner_spec(inventory: Inventory, datasets: list[str] | None, route: str) -> JobSpec:
    """The `pipeline/run` job: the runner, with the graph for `route` and the inference server it manages."""
    server = server_settings(inventory)
    # NOTE: what the plan was built from: `inv rerun` rebuilds the plan from the inventory as it is then.
    built_from = {"datasets": inventory.select(datasets), "route": route}
    stage = {"plan": graph(inventory, datasets, route), "server": server, "fresh": True, "built_from": built_from,
             "notify": notify_settings(inventory)}
    # NOTE: stall_after: it beats every tick; waiting on a long job is not a stall.
    return job_spec(RUNNER, RUNNER_STAGE, {"stage": stage}, command=None, stall_after=10 ** 9, executor="process")


def loads(inventory: Inventory, plan: dict[str, Any]) -> dict[str, Any]:
    """What a run loads onto the GPUs (`inv plan`), from the host's `plan`: the inference server's starts (one
    for every infer job, where aerie starts it) and the target's loads on the route that run takes."""
    prompts = [name for name, d in inventory.datasets.items() if d.kind == "prompts"]
    route = inventory.stages.extract.route if inventory.stages.extract.route != "auto" else plan.get("route")
    cost = (plan.get("costs") or {}).get(route or "offline") or {}
    return {"server_starts": int(bool(prompts and inventory.stages.infer.server_command)), "infer_jobs": len(prompts),
            "target_loads": cost.get("target_loads"), "route": route or "offline"}
