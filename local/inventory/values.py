"""An inventory's values: where the hosts are, what they run and with what.

Declared once as dataclasses; `local.inventory.schema` validates a file into them, and
`local.inventory.loader` reads the same values back from its cache without pydantic.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from local.exceptions import AerieError
from local.inventory.checks import DATASET_NAME, DATASET_NAME_RULE, Check, inside_the_checkout
from local.inventory.fields import Strict, dump, setting, value_class
from local.inventory.stages import Stages, stage_names
from local.paths import ENV_NAME
from remote.vocabulary.states import DRAFT, RUNNER

RESERVED_NAMES = (RUNNER, DRAFT)  # the pseudo datasets of `inv run` (its runner, the one training job)


@value_class
class Host(Strict):
    """Where the jobs run. `address` is needed for the ssh backend only."""

    address: str | None = None
    port: int | None = setting(None, "default: ~/.ssh/config's Port, else 22")
    user: str | None = None
    identity: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = setting(None, "an ssh_config file, or 'none'; default ~/.ssh/config")
    root: str
    python: str = "python3"
    connect_timeout: float = 10.0
    keepalive: int = 15
    control_persist: float = setting(600.0, "seconds an idle shared OpenSSH connection stays open for the next "
                                     "command (local/transport/openssh.py); 0: every command connects anew", ge=0)
    env: dict[str, str] = setting(factory=dict, description="set for aerie's commands there, e.g. SLURM_CONF")

    def __post_init__(self) -> None:
        for key in self.env:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"env key {key!r} is not an environment variable name (letters, digits, '_'; not first a digit)")
            if "${" in self.env[key]:
                raise ValueError(f"env.{key}: host.env is set as written, never expanded: to forward a variable of "
                                 "this machine, name it in `secrets:` (every job and the inference server get it)")


@value_class
class Dataset(Strict):
    """One entry of `datasets:`: where its rows come from and what they are."""

    source: str
    host: str | None = setting(None, "which of `hosts` runs it; default: spread evenly")
    kind: Literal["native", "prompts"]
    config: str | None = None
    split: str = "train"
    revision: str | None = setting(None, "a hub dataset's commit, tag or branch (pinned data is reproducible data)")
    limit: int | None = setting(None, ge=1)
    streaming: bool = False
    sample: str | None = setting(None, "a small local sample for `inv validate`, relative to inventories/")
    rows: int | None = setting(None, "the source's row count, for `inv plan` before prep has run", ge=1)


@value_class
class Target(Strict):
    """The target model: its tokenizer (prep) and weights (extract)."""

    tokenizer: str | None = None
    model: str | None = None
    trust_remote_code: bool = False


@value_class
class Deploy(Strict):
    """What `inv deploy` sends to the host and keeps there (local/host/releases.py, remote/control_plane/release.py)."""

    ship: Annotated[list[str], Check(inside_the_checkout)] = setting(
        factory=list, description="more of this checkout to send beside remote/ and inventories/samples/: files or "
        "folders relative to the checkout, e.g. [scripts]")
    keep: int = setting(5, "releases kept under <root>/releases/ by each deploy, newest first; older ones are "
                        "removed, never the live one nor one a job still runs from", ge=1)


@value_class
class Resources(Strict):
    """What `sbatch` asks for (backend slurm); None leaves Slurm's default."""

    partition: str | None = None
    account: str | None = None
    gpus: int | None = setting(None, ge=0)
    cpus: int | None = setting(None, ge=1)
    mem: str | None = None
    time: str | None = None
    extra: list[str] = setting(factory=list, description="more sbatch options, e.g. ['--qos=high']")
    #: The keys given (not a YAML key): a stage's own resources lay these, and only these, over the defaults.
    given: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Built in code: the keys set to something (not None or []); read from a file, its keys (`keys_given`).
        self.given = frozenset(key for key, value in dump(self).items() if value not in (None, []))


def keys_given(raw: Any, validate: Callable[[Any], Resources]) -> Resources:
    """A stage's resources remember the keys the file gave: `gpus: null` there clears the default."""
    resources = validate(raw)
    if isinstance(raw, dict):
        resources.given = frozenset(raw)
    return resources


@value_class
class Slurm(Resources):
    """Defaults for every job, and per-stage resources on top (e.g. `stages: {extract: {gpus: 8}}`)."""

    stages: dict[str, Annotated[Resources, Check(keys_given, "wrap")]] = setting(factory=dict)

    def for_stage(self, stage: str) -> dict[str, Any]:
        base = dump(self, exclude={"stages"})
        own = self.stages.get(stage)
        return base if own is None else {**base, **{k: v for k, v in dump(own).items() if k in own.given}}


@value_class
class Notify(Strict):
    """`notify:`: word from the host when a pipeline run ends (remote/control_plane/notify.py), the laptop closed or not."""

    url: str | None = setting(None, "a webhook (Slack's or Discord's incoming webhook; JSON with `text` and `content`); "
                              "a secret: write ${NAME} and NAME's value is read from this machine's environment")
    command: str | None = setting(None, "a shell command run on the host, the message on its stdin and in "
                                  "$AERIE_NOTIFY_MESSAGE, the end state in $AERIE_NOTIFY_STATE")
    jobs: bool = setting(False, "also when any job of the run fails, not only when the run ends")
    timeout: float = setting(5.0, "seconds one notification may take; a failed one is logged, never fails the run", gt=0)

    def __post_init__(self) -> None:
        if not (self.url or self.command):
            raise ValueError("give `url` (a webhook), `command`, or both")


@value_class
class Inventory(Strict):
    """A whole inventory file, and what tasks ask of it."""

    backend: Literal["ssh", "local", "slurm"]
    host: Host | None = setting(None, "the one host (for slurm: the login node; no address: this machine)")
    hosts: dict[str, Host] = setting(factory=dict, description="several SSH hosts, by name, instead of `host`")
    slurm: Slurm = setting(factory=Slurm)
    target: Target = setting(factory=Target)
    stages: Stages = setting(factory=Stages)
    datasets: dict[str, Dataset] = setting(factory=dict)
    deploy: Deploy = setting(factory=Deploy)
    secrets: list[str] = setting(factory=list, description="variables of this machine's environment every job and "
                                 "the inference server get on the host, e.g. [HF_TOKEN]; never stored there")
    notify: Notify | None = setting(None, "word when a pipeline run ends: a webhook and/or a command, from the host")
    #: Where the file was read from, for messages (not a YAML key).
    path: Path | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.host is None) == (not self.hosts):
            raise ValueError("give either `host` (one host) or `hosts` (several, by name)")
        if self.hosts and self.backend != "ssh":
            raise ValueError(f"several `hosts` need backend ssh, not {self.backend}")
        for name, host in ({"host": self.host} if self.host else self.hosts).items():
            if self.backend == "ssh" and not host.address:
                raise ValueError(f"{name if name == 'host' else 'hosts.' + name}.address is required when backend is ssh")
        for name in self.secrets:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"secrets: {name!r} is not an environment variable name (letters, digits, '_'; not first a digit)")
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

    @property
    def executor(self) -> str:
        """The host-side executor of every job (remote/control_plane/executors.py): the one place that maps the backend to it."""
        return "slurm" if self.backend == "slurm" else "process"

    @property
    def is_multi_host(self) -> bool:
        return bool(self.hosts)

    def views(self) -> dict[str, Inventory]:
        """One single-host inventory per host, holding the datasets it runs; {} name for one host."""
        return {"": self} if not self.is_multi_host else self.per_host_views()

    def per_host_views(self) -> dict[str, Inventory]:
        assignment = self.assignment()
        return {name: self._view(host, {ds: d for ds, d in self.datasets.items() if assignment[ds] == name})
                for name, host in sorted(self.hosts.items())}

    def _view(self, host: Host, datasets: dict[str, Dataset]) -> Inventory:
        # A copy, not a new inventory: one host's view keeps its datasets' `host`, which its own `hosts` lacks.
        view = copy.copy(self)
        view.host, view.hosts, view.datasets = host, {}, datasets
        return view

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
        return stage_names()

    def stage(self, name: str) -> Any:
        """A stage's settings; an unknown name is an error."""
        known = stage_names()
        if name not in known:
            raise AerieError(f"unknown stage {name!r}: expected one of {', '.join(known)}")
        return getattr(self.stages, name)

    def select(self, names: list[str] | None) -> list[str]:
        """The named datasets in inventory order, or all of them; an unknown name is an error."""
        datasets = list(self.datasets)
        if not names:
            return datasets
        unknown = [n for n in names if n not in datasets]
        if unknown:
            raise AerieError(f"unknown dataset {', '.join(unknown)} in {self.path}: "
                             f"expected one of {', '.join(datasets) or '(none)'}")
        return [n for n in datasets if n in names]
