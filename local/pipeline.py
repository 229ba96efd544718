"""`inv run`: the whole pipeline as a plan of jobs, which the host's runner (remote/pipeline.py) executes.

Per dataset: ``prep``; for a prompts dataset then ``infer`` (the target answers
the prompts) and ``tokenize`` (prep over those answers); then ``extract``.
Finally one ``draft/train`` over every dataset's extracted states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from local import job_specs, routes

if TYPE_CHECKING:
    from local.inventory import Inventory

DRAFT = "draft"  # the pseudo dataset of the one training job over all datasets
RUNNER = "pipeline"  # the pseudo dataset of the runner job, `pipeline/run`
GPU_STAGES = {"infer", "extract", "train"}


def node(spec: dict[str, Any], needs: list[str]) -> dict[str, Any]:
    stage = spec["stage"]
    # NOTE: every node carries its executor; the host picks how the plan runs from it (remote.pipeline.start).
    return {"key": f"{spec['dataset']}/{stage}", "needs": needs, "gpu": stage in GPU_STAGES,
            "server": stage == "infer", "spec": spec}


def dataset_nodes(inventory: Inventory, name: str) -> list[dict[str, Any]]:
    data = f"{inventory.host.root}/data/{name}"
    nodes = [node(job_specs.placed(inventory, job_specs.spec(inventory, name, "prep")), [])]
    tokens = "prep"
    if inventory.datasets[name].kind == "prompts":
        nodes.append(node(job_specs.placed(inventory, job_specs.spec(inventory, name, "infer")), [f"{name}/prep"]))
        tokenize = job_specs.placed(inventory, job_specs.spec(inventory, name, "prep")) | {"stage": "tokenize",
                                                         "source": f"{data}/infer/conversations.jsonl", "kind": "native"}
        tokenize["config"] = tokenize["config"] | {"dataset": {**tokenize["config"]["dataset"], "kind": "native",
                                                               "source": tokenize["source"]}}
        nodes.append(node(tokenize, [f"{name}/infer"]))
        tokens = "tokenize"
    extract = job_specs.placed(inventory, job_specs.spec(inventory, name, "extract"))
    extract["config"]["inputs"] = [f"{data}/{tokens}"]
    nodes.append(node(extract, [f"{name}/{tokens}"]))
    return nodes


def plan(inventory: Inventory, datasets: list[str] | None) -> list[dict[str, Any]]:
    names = inventory.select(datasets)
    nodes = [n for name in names for n in dataset_nodes(inventory, name)]
    train = job_specs.placed(inventory, job_specs.spec(inventory, names[0], "train")) | {"dataset": DRAFT, "source": "", "kind": "native"}
    train["config"]["inputs"] = [f"{inventory.host.root}/data/{name}/extract" for name in names]
    nodes.append(node(train, [f"{name}/extract" for name in names]))
    return routes.apply(inventory, nodes)


def server_settings(inventory: Inventory) -> dict[str, Any]:
    infer = inventory.stages.infer
    return {"command": infer.server_command and infer.server_command.replace("{root}", inventory.host.root),
            "url": infer.server_url, "start_timeout": infer.server_start_timeout, "env": infer.server_env}


def runner_spec(inventory: Inventory, datasets: list[str] | None) -> dict[str, Any]:
    """The `pipeline/run` job: the runner, with the plan and the inference server it manages."""
    server = server_settings(inventory)
    return {
        "dataset": RUNNER, "stage": "run", "command": None, "source": "", "kind": "native", "executor": "process",
        "stall_after": 10 ** 9,  # it beats every tick; waiting on a long job is not a stall
        "config": {"stage": {"plan": plan(inventory, datasets), "server": server, "fresh": True}},
    }
