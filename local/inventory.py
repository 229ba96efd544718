"""Inventories: YAML files that say where the host is and what runs there.

Validated on load; a mistake is reported as ``file: key: what was expected``,
never as a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from local.errors import AerieError

REPO = Path(__file__).resolve().parent.parent
INVENTORIES = REPO / "inventories"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class Dataset(Strict):
    source: str
    kind: Literal["native", "prompts"]
    config: str | None = None
    split: str = "train"
    limit: int | None = Field(None, ge=1)
    streaming: bool = False
    sample: str | None = Field(None, description="a small local sample for `inv validate`, relative to inventories/")


class Stage(Strict):
    """Settings every stage has; each stage adds its own below."""

    command: str | None = None
    stall_after: float = Field(600.0, gt=0, description="seconds without progress before a live job is `stalled`")


class Prep(Stage):
    max_length: int = Field(4096, ge=8)
    overlong: Literal["truncate", "drop"] = "truncate"
    min_kept_ratio: float = Field(0.0, ge=0, le=1)
    num_proc: int = Field(1, ge=1)
    shard_size: int = Field(10_000, ge=1)


class Infer(Stage):
    server_url: str = "http://127.0.0.1:30000/v1"
    model: str = "default"
    concurrency: int = Field(8, ge=1)
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


class Extract(Stage):
    layers: list[int] = Field(default_factory=lambda: [2, 30, 58])
    batch_size: int = Field(1, ge=1)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    shard_size: int = Field(1000, ge=1)
    draft_config: str | None = Field(None, description="the draft's config.json, to check widths against")


class Train(Stage):
    engine: Literal["aerie", "specforge"] = "aerie"
    draft_vocab_size: int = Field(32000, ge=1)
    epochs: int = Field(1, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    batch_size: int = Field(1, ge=1)
    ttt_steps: int = Field(7, ge=1)
    max_length: int = Field(2048, ge=8)
    draft_config: str | None = None
    specforge_dir: str | None = None
    specforge_train_data: str | None = None
    chat_template: str = "kimi_k2"
    nproc: int = Field(1, ge=1)


class Stages(Strict):
    prep: Prep = Field(default_factory=Prep)
    infer: Infer = Field(default_factory=Infer)
    extract: Extract = Field(default_factory=Extract)
    train: Train = Field(default_factory=Train)


class Target(Strict):
    """The target model: its tokenizer (prep) and weights (extract)."""

    tokenizer: str | None = None
    model: str | None = None
    trust_remote_code: bool = False


class Inventory(Strict):
    backend: Literal["ssh", "local"]
    host: Host
    target: Target = Field(default_factory=Target)
    stages: Stages = Field(default_factory=Stages)
    datasets: dict[str, Dataset] = Field(default_factory=dict)
    #: Where the file was read from, for messages (not a YAML key).
    path: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _address_for_ssh(self) -> "Inventory":
        if self.backend == "ssh" and not self.host.address:
            raise ValueError("host.address is required when backend is ssh")
        return self

    def stage(self, name: str) -> Stage:
        if name not in Stages.model_fields:
            raise AerieError(f"unknown stage {name!r}: expected one of {', '.join(Stages.model_fields)}")
        return getattr(self.stages, name)

    def select(self, names: list[str] | None) -> list[str]:
        """The named datasets in inventory order, or all of them; an unknown name is an error."""
        if not names:
            return list(self.datasets)
        unknown = [n for n in names if n not in self.datasets]
        if unknown:
            raise AerieError(
                f"unknown dataset {', '.join(unknown)} in {self.path}: expected one of {', '.join(self.datasets) or '(none)'}"
            )
        return [n for n in self.datasets if n in names]


def resolve_path(name_or_path: str) -> Path:
    """`local` means inventories/local.yaml; anything with a slash or .yaml is a path."""
    if "/" in name_or_path or name_or_path.endswith((".yaml", ".yml")):
        return Path(name_or_path).expanduser()
    return INVENTORIES / f"{name_or_path}.yaml"


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
    if inventory.backend == "local":
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
    for part in location:
        field = model.model_fields.get(str(part))
        if field is None:  # a name inside a dict, such as a dataset's
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        elif str(part) == "datasets":
            model = Dataset
    return model
