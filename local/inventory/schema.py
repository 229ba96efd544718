"""Inventories: YAML files that say where the host is and what runs there.

Validated on load; a mistake is reported as ``file: key: what was expected``,
never as a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from local.exceptions import AerieError
from local.inventory.queries import InventoryQueries
from local.paths import ENV_NAME, INVENTORIES, REPO, resolve_path  # noqa: F401 (also this module's API)
from remote.control_plane.states import DRAFT, RUNNER


#: A dataset name becomes a directory on the host and a word in its commands: a safe identifier only.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DATASET_NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit, at most 64"
RESERVED_NAMES = (RUNNER, DRAFT)  # the pseudo datasets of `inv run` (its runner, the one training job)


class Strict(BaseModel):
    # NOTE: schemas built on first use: at import, each model would be built once alone and again inside
    # Inventory, which doubled the start-up of every `inv` command.
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Host(Strict):
    """Where the jobs run. `address` is needed for the ssh backend only."""

    address: str | None = None
    port: int | None = Field(None, description="default: ~/.ssh/config's Port, else 22")
    user: str | None = None
    identity: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = Field(None, description="an ssh_config file, or 'none'; default ~/.ssh/config")
    root: str
    python: str = "python3"
    connect_timeout: float = 10.0
    keepalive: int = 15
    control_persist: float = Field(600.0, ge=0, description="seconds an idle shared OpenSSH connection stays "
                                   "open for the next command (local/transport/openssh.py); 0: every command connects anew")
    env: dict[str, str] = Field(default_factory=dict, description="set for aerie's commands there, e.g. SLURM_CONF")

    @model_validator(mode="after")
    def _env_names(self) -> "Host":
        for key in self.env:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"env key {key!r} is not an environment variable name (letters, digits, '_'; not first a digit)")
        return self


class Dataset(Strict):
    source: str
    host: str | None = Field(None, description="which of `hosts` runs it; default: spread evenly")
    kind: Literal["native", "prompts"]
    config: str | None = None
    split: str = "train"
    limit: int | None = Field(None, ge=1)
    streaming: bool = False
    sample: str | None = Field(None, description="a small local sample for `inv validate`, relative to inventories/")
    rows: int | None = Field(None, ge=1, description="the source's row count, for `inv plan` before prep has run")


class Stage(Strict):
    """Settings every stage has; each stage adds its own below."""

    command: str | None = None
    stall_after: float = Field(600.0, gt=0, description="seconds without progress before a live job is `stalled`")
    log_limit: int = Field(64 * 2**20, ge=64 * 2**10, description="the most bytes of a job's log kept while it runs "
                           "(bytes, or e.g. 64M, 1G): past it the oldest part is cut, behind a marker line")

    @field_validator("log_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        """`256M`, `2G`, `512K`, `1T` (powers of 1024) as bytes; a number as it is."""
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", value, re.IGNORECASE)
            if not match:
                raise ValueError("expected bytes or a size such as 256M or 2G")
            return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))
        return value


class Prep(Stage):
    max_length: int = Field(4096, ge=8)
    overlong: Literal["truncate", "drop"] = "truncate"
    min_kept_ratio: float = Field(0.0, ge=0, le=1)
    num_proc: int = Field(1, ge=1)
    shard_size: int = Field(10_000, ge=1)
    batch_size: int = Field(256, ge=1, description="rows handed to one tokenizer call (and one worker task)")
    reasoning: Literal["expand", "preserve"] = Field(
        "expand", description="expand: each turn after the context its server rendered, nothing lost; "
                              "preserve: one record per row, earlier reasoning kept in context")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="what the target's server passes its chat template, e.g. {thinking: false}")


class Infer(Stage):
    server_url: str = "http://127.0.0.1:30000/v1"
    model: str = "default"
    concurrency: Literal["auto"] | int = Field(
        "auto", description="requests in flight; auto: the level with the most output tokens/s")
    max_concurrency: int = Field(256, ge=1, description="the most requests in flight that auto may try")
    timeout: float = Field(600.0, gt=0)
    retries: int = Field(3, ge=0)
    max_tokens: int = Field(2048, ge=1)
    temperature: float = 0.7
    top_p: float = 1.0
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    backoff: float = Field(1.0, ge=0, description="first retry delay in seconds; doubles, with jitter")
    server_command: str | None = Field(None, description="starts the inference server; None: managed outside aerie")
    server_start_timeout: float = Field(1800.0, gt=0)
    server_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("concurrency", mode="before")
    @classmethod
    def _auto_or_count(cls, value: Any) -> Any:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError("expected auto or a whole number of requests >= 1")


class Extract(Stage):
    engine: Literal["hf", "sglang"] = Field(
        "hf", description="what computes the states: hf (transformers, in this process) or sglang (the serving "
                          "engine, SpecForge's offline capture under torchrun; docs/hidden-states.md)")
    tp_size: int | None = Field(None, ge=1, description="engine sglang: GPUs the target is split over (tensor "
                                "parallel, one torchrun process each); default: every GPU on the host")
    specforge_python: str = Field("python3", description="engine sglang: the command that runs Python in the host's "
                                  "SpecForge environment (SpecForge 0.2.0 with its SGLang 0.5.14), split like shell words")
    specforge_env: dict[str, str] = Field(default_factory=dict, description="engine sglang: environment variables of "
                                          "the capture, e.g. PYTHONPATH or CUDA_VISIBLE_DEVICES")
    sglang_args: dict[str, Any] = Field(default_factory=dict, description="engine sglang: more fields of SGLang's "
                                        "ServerArgs for the target, e.g. {mem_fraction_static: 0.8}")
    layers: list[int] = Field(default_factory=lambda: [2, 30, 58])
    batch_size: int = Field(1, ge=1)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    shard_size: int = Field(1000, ge=1)
    draft_config: str | None = Field(None, description="the draft's config.json, to check widths against")
    disk_budget: int | str | None = Field(None, description="disk the hidden states may take: bytes or e.g. 500G; default: the free space")
    route: Literal["auto", "offline", "chunked", "online"] = Field("auto", description="see `inv plan`; auto: the first that fits")
    passes: int | None = Field(None, ge=1, description="the chunked route: forward passes of the target over the records; "
                               "each chunk on disk is trained stages.train.epochs / passes epochs; default: epochs "
                               "(re-extracted every epoch); 1: each record read once (docs/chunked.md)")


class Mooncake(Strict):
    """SpecForge's Mooncake endpoints on the online route (its ``deployment.disaggregated.mooncake_*``):
    the capture servers put the target's states there and the trainer reads them."""

    metadata_server: str = Field(description="Mooncake's metadata server, e.g. http://10.0.0.1:8080/metadata")
    master_server_addr: str = Field(description="Mooncake's master, host:port, e.g. 10.0.0.1:50051")
    local_hostname: str | None = Field(None, description="this host's address as Mooncake's peers reach it")
    protocol: Literal["tcp", "rdma"] | None = None
    rdma_devices: str | None = None


class Train(Stage):
    engine: Literal["aerie", "specforge"] = "aerie"
    draft_vocab_size: int = Field(32000, ge=1)
    epochs: int = Field(1, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    batch_size: int = Field(1, ge=1)
    ttt_steps: int = Field(7, ge=1)
    max_length: int = Field(2048, ge=8)
    draft_config: str | None = None
    init_draft: str | None = Field(None, description="a draft directory on the host in SGLang's EAGLE-3 format "
                                   "(LlamaForCausalLMEagle3: a previous run's draft, SpecForge's export or a published "
                                   "one) to continue training from; default: a new draft from the target's lm_head")
    specforge_dir: str | None = None
    specforge_train_data: str | None = None
    chat_template: str = Field("kimi_k2", description="legacy SpecForge only (train_eagle3.py renders conversations); "
                               "SpecForge 0.2.0 gets prep's tokens or states, never a template")
    nproc: int = Field(1, ge=1)
    eval_records: int | None = Field(None, ge=0, description="records held out of training (0: none); default: eval_fraction")
    eval_fraction: float = Field(0.05, ge=0, lt=1, description="share of records held out when eval_records is unset")
    eval_steps: int = Field(3, ge=1, description="draft steps of the held-out acceptance length (top-k 1)")
    checkpoint_every: int = Field(200, ge=1, description="optimizer steps between resume checkpoints")
    specforge_server_urls: list[str] = Field(default_factory=list, description="online SpecForge: the SGLang capture "
                                             "servers' URLs (required on the online route)")
    specforge_mooncake: Mooncake | None = Field(None, description="online SpecForge: the Mooncake endpoints (required on the online route)")
    specforge_deployment: dict[str, Any] = Field(default_factory=dict, description="merged into SpecForge's `deployment:`")
    report_to: Literal["none", "tensorboard", "wandb"] = Field(
        "none", description="where training's curves go besides training.png: TensorBoard event files or a W&B run "
        "(offline unless the host has a W&B key) beside the draft, for either engine")

    def specforge_refusal(self, extract: Extract, route: str) -> str | None:
        """What SpecForge 0.2.0 would refuse in these settings, in one line naming each setting; None when
        it would not (or the engine is aerie's). Checked before anything starts, at load and by `inv run`."""
        if self.engine != "specforge":
            return None
        problems = []
        if len(extract.layers) != 3 or len(set(extract.layers)) != 3:
            problems.append(f"stages.extract.layers: SpecForge trains on exactly three distinct layers, not {extract.layers}")
        if route != "online" and extract.dtype != "bfloat16":
            problems.append(f"stages.extract.dtype: SpecForge trains on bfloat16 states (its target head is bfloat16), "
                            f"not {extract.dtype}")
        if route == "online":
            missing = [] if self.specforge_server_urls else ["stages.train.specforge_server_urls (the SGLang capture servers' URLs)"]
            if self.specforge_mooncake is None:
                missing.append("stages.train.specforge_mooncake: {metadata_server, master_server_addr} (the Mooncake endpoints)")
            if missing:
                problems.append("engine specforge on the online route needs " + " and ".join(missing))
        return "; ".join(problems) or None


class GridPoint(Strict):
    """One speculative setting `inv eval` tries: SGLang's --speculative-num-steps/-eagle-topk/-num-draft-tokens."""

    num_steps: int = Field(ge=1)
    topk: int = Field(1, ge=1)
    num_draft_tokens: int = Field(ge=2)

    @model_validator(mode="after")
    def _tokens(self) -> "GridPoint":
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError(f"with topk 1 SGLang verifies num_steps + 1 = {self.num_steps + 1} draft tokens, "
                             f"not {self.num_draft_tokens}")
        if self.num_draft_tokens > self.num_steps * self.topk + 1:
            raise ValueError(f"num_draft_tokens {self.num_draft_tokens} is more than the "
                             f"num_steps * topk + 1 = {self.num_steps * self.topk + 1} tokens the draft proposes")
        return self


def default_grid() -> list[GridPoint]:
    return [GridPoint(num_steps=3, topk=1, num_draft_tokens=4), GridPoint(num_steps=5, topk=1, num_draft_tokens=6),
            GridPoint(num_steps=3, topk=4, num_draft_tokens=8)]


#: The key of one draft that `stages.eval.drafts` replaced; an inventory that gives it is told so.
REPLACED_BY_DRAFTS = "draft"


class Eval(Stage):
    """`inv eval`: the target served by SGLang without and with the draft, per grid setting."""

    stall_after: float = Field(3600.0, gt=0, description="seconds without progress before the job is `stalled`")
    launcher: str = Field("{python} -m sglang.launch_server", description="aerie appends --model-path, --host, --port, ...")
    model: str | None = Field(None, description="--model-path; default: target.model")
    port: int = Field(30100, ge=1, le=65535)
    server_args: list[str] = Field(default_factory=list, description="more launch flags, e.g. ['--tp-size', '8']")
    server_env: dict[str, str] = Field(default_factory=dict)
    server_start_timeout: float = Field(1800.0, gt=0)
    drafts: dict[str, str] | None = Field(None, description="the drafts compared, by name: "
                                          "{name: --speculative-draft-model-path on the host}; default: train's "
                                          "output, named `draft`")
    grid: list[GridPoint] = Field(default_factory=default_grid, min_length=1)
    prompts: str | None = Field(None, description="JSONL of {text} or {input_ids} on the host; default: train's held-out records")
    num_prompts: int = Field(32, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    concurrency: int = Field(1, ge=1)
    request_timeout: float = Field(600.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _one_way_to_name_a_draft(cls, data: Any) -> Any:
        if isinstance(data, dict) and REPLACED_BY_DRAFTS in data:
            raise ValueError("`draft` is now `drafts`, by name: write `drafts: {draft: PATH}` instead "
                             "(and name more drafts there to compare them)")
        return data

    @field_validator("drafts")
    @classmethod
    def _draft_names(cls, drafts: dict[str, str] | None) -> dict[str, str] | None:
        # A name becomes a key of the report and part of a log's file name, as a dataset's does.
        if drafts == {}:
            raise ValueError("name at least one draft, or leave `drafts` unset to compare train's own")
        for name, path in (drafts or {}).items():
            if not DATASET_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a draft name: use {DATASET_NAME_RULE} characters")
            if not path.strip():
                raise ValueError(f"{name}: the draft's path is empty")
        return drafts


class Stages(Strict):
    prep: Prep = Field(default_factory=Prep)
    infer: Infer = Field(default_factory=Infer)
    extract: Extract = Field(default_factory=Extract)
    train: Train = Field(default_factory=Train)
    eval: Eval = Field(default_factory=Eval)


class Target(Strict):
    """The target model: its tokenizer (prep) and weights (extract)."""

    tokenizer: str | None = None
    model: str | None = None
    trust_remote_code: bool = False


class Deploy(Strict):
    """What `inv deploy` sends to the host and keeps there (local/host/releases.py, remote/control_plane/release.py)."""

    ship: list[str] = Field(default_factory=list, description="more of this checkout to send beside remote/ and "
                            "inventories/samples/: files or folders relative to the checkout, e.g. [scripts]")
    keep: int = Field(5, ge=1, description="releases kept under <root>/releases/ by each deploy, newest first; older "
                      "ones are removed, never the live one nor one a job still runs from")

    @field_validator("ship")
    @classmethod
    def _inside(cls, paths: list[str]) -> list[str]:
        for path in paths:
            parts = Path(path).parts
            if not parts or Path(path).is_absolute() or ".." in parts or parts[0] in (".git", ".venv", ".aerie"):
                raise ValueError(f"{path!r} is not a path inside the checkout: give it relative to the checkout, "
                                 "without '..', not the whole checkout nor .git, .venv or .aerie (e.g. scripts)")
        return paths


class Resources(Strict):
    """What `sbatch` asks for (backend slurm); None leaves Slurm's default."""

    partition: str | None = None
    account: str | None = None
    gpus: int | None = Field(None, ge=0)
    cpus: int | None = Field(None, ge=1)
    mem: str | None = None
    time: str | None = None
    extra: list[str] = Field(default_factory=list, description="more sbatch options, e.g. ['--qos=high']")


class Slurm(Resources):
    """Defaults for every job, and per-stage resources on top (e.g. `stages: {extract: {gpus: 8}}`)."""

    stages: dict[str, Resources] = Field(default_factory=dict)

    def for_stage(self, stage: str) -> dict[str, Any]:
        base = self.model_dump(exclude={"stages"})
        override = self.stages[stage].model_dump(exclude_unset=True) if stage in self.stages else {}
        return {**base, **override}


class Inventory(InventoryQueries, Strict):
    backend: Literal["ssh", "local", "slurm"]
    host: Host | None = Field(None, description="the one host (for slurm: the login node; no address: this machine)")
    hosts: dict[str, Host] = Field(default_factory=dict, description="several SSH hosts, by name, instead of `host`")
    slurm: Slurm = Field(default_factory=Slurm)
    target: Target = Field(default_factory=Target)
    stages: Stages = Field(default_factory=Stages)
    datasets: dict[str, Dataset] = Field(default_factory=dict)
    deploy: Deploy = Field(default_factory=Deploy)
    #: Where the file was read from, for messages (not a YAML key).
    path: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _hosts(self) -> "Inventory":
        if (self.host is None) == (not self.hosts):
            raise ValueError("give either `host` (one host) or `hosts` (several, by name)")
        if self.hosts and self.backend != "ssh":
            raise ValueError(f"several `hosts` need backend ssh, not {self.backend}")
        for name, host in ({"host": self.host} if self.host else self.hosts).items():
            if self.backend == "ssh" and not host.address:
                raise ValueError(f"{name if name == 'host' else 'hosts.' + name}.address is required when backend is ssh")
        for name in self.datasets:
            if not DATASET_NAME.fullmatch(name) or name in RESERVED_NAMES:
                raise ValueError(f"datasets: {name!r} is not a dataset name: use {DATASET_NAME_RULE} characters"
                                 f"{', and not ' + ' or '.join(RESERVED_NAMES) if name in RESERVED_NAMES else ''}")
        for name, dataset in self.datasets.items():
            if dataset.host is not None and dataset.host not in self.hosts:
                raise ValueError(f"datasets.{name}.host {dataset.host!r} is not one of hosts: {', '.join(self.hosts) or '(none)'}")
        refusal = self.stages.train.specforge_refusal(self.stages.extract, self.stages.extract.route)
        if refusal:
            raise ValueError(refusal)
        return self

    def assignment(self) -> dict[str, str]:
        """Which host runs each dataset: its `host`, else spread evenly in inventory order."""
        names = sorted(self.hosts)
        load = {name: 0 for name in names}
        placed = {ds: d.host for ds, d in self.datasets.items() if d.host}
        for ds in placed.values():
            load[ds] += 1
        for ds in self.datasets:
            if ds not in placed:
                placed[ds] = min(names, key=lambda name: (load[name], names.index(name)))
                load[placed[ds]] += 1
        return {ds: placed[ds] for ds in self.datasets}

    def stage_names(self) -> list[str]:
        return list(Stages.model_fields)

    def per_host_views(self) -> dict[str, "Inventory"]:
        assignment = self.assignment()
        return {
            name: self.model_copy(update={"host": host, "hosts": {}, "datasets": {
                ds: d for ds, d in self.datasets.items() if assignment[ds] == name}})
            for name, host in sorted(self.hosts.items())
        }


def load(name_or_path: str) -> Inventory:
    path = resolve_path(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        known = ", ".join(sorted(p.stem for p in INVENTORIES.glob("*.yaml")))
        raise AerieError(f"no inventory {name_or_path!r} ({path}): use one of {known} or a path to a YAML file")
    except yaml.YAMLError as exc:
        raise AerieError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}")
    if not isinstance(raw, dict):
        raise AerieError(f"{path}: expected a mapping of keys (backend, host, datasets, ...)")
    try:
        inventory = Inventory.model_validate(raw)
    except ValidationError as exc:
        raise AerieError(f"{path}: " + "; ".join(_describe(e) for e in exc.errors()))
    inventory.path = path
    if inventory.host is not None and not inventory.host.address:
        # Relative paths of this machine are the checkout's: the root (git-ignored), the venv.
        inventory.host.root = str((REPO / inventory.host.root).resolve())
        if "/" in inventory.host.python and not Path(inventory.host.python).is_absolute():
            inventory.host.python = str(REPO / inventory.host.python)
    return inventory


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key (expected one of: {', '.join(_model_at(error['loc'][:-1]).model_fields)})"
    if error["type"] == "missing":
        return f"{key}: missing (required)"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message} (got {error['input']!r})" if error["loc"] else message


def _model_at(location: tuple[Any, ...]) -> type[BaseModel]:
    """The model that validates the mapping at `location`, to list the keys it knows."""
    model: type[BaseModel] = Inventory
    parts = iter(location)
    for part in parts:
        field = model.model_fields.get(str(part))
        if field is None:
            break
        inner = [a for a in (field.annotation, *get_args(field.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if get_origin(field.annotation) is dict:  # e.g. datasets.<name>: the next part is a name
            model = get_args(field.annotation)[1]
            next(parts, None)
        elif inner:
            model = inner[0]
    return model
