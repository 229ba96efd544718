"""Secrets: what the host's jobs get from an inventory without the host ever storing it.

Two ways to give one: `secrets: [HF_TOKEN]` names variables of this machine's environment, and
``${NAME}`` in `stages.infer.server_env`, `stages.eval.server_env` or `notify.url` names one the same
way. Their values are read here, at each command that starts jobs, and sent on the command's stdin
(`local.host.verbs`); the host keeps them in its processes' environment only (remote/vocabulary/secrets.py).
A literal value in those three places (older inventories) is sealed: sent the same way, under a name
of its own, while the spec holds only ``${AERIE_SECRET_...}``. Wherever aerie shows a value of an
environment mapping (a refusal of the inventory), it shows `MASK`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from local.exceptions import AerieError
# The host expands what the workstation writes: one spelling of a reference and of a masked value.
from remote.vocabulary.secrets import MASK, REFERENCE

if TYPE_CHECKING:
    from local.inventory.values import Inventory

#: The prefix of a sealed literal's name (the host's jobs see it as an environment variable).
SEALED_PREFIX = "AERIE_SECRET_"
#: The environment mappings of a stage's settings that reach the host sealed (`seal_env`).
SEALED_ENVS = ("server_env", "specforge_env")
#: Keys whose values (a mapping's, or the value itself) are never shown: they may hold a secret.
SECRET_KEYS = frozenset({"env", "server_env", "specforge_env", "url"})


def references(text: str) -> list[str]:
    """The secrets `text` names (``${NAME}``), in order."""
    return REFERENCE.findall(text)


def sealed_name(location: str) -> str:
    """The variable that carries the literal at `location` (``stages.infer.server_env.HF_TOKEN``) to the host."""
    return SEALED_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", location).upper()


def seal(location: str, value: str) -> str:
    """A value as a spec holds it: as written when it names its secrets (``${NAME}``), else a reference
    to the sealed literal (`values` sends it)."""
    return value if REFERENCE.search(value) else "${" + sealed_name(location) + "}"


def seal_env(location: str, env: Mapping[str, str]) -> dict[str, str]:
    """An environment mapping of the inventory as a spec holds it: no value in clear."""
    return {key: seal(f"{location}.{key}", value) for key, value in env.items()}


def sealable(inventory: Inventory) -> dict[str, str]:
    """Every value of the inventory that may hold a secret, by location."""
    found = {f"stages.{stage}.{field}.{key}": value
             for stage, field, env in (("infer", "server_env", inventory.stages.infer.server_env),
                                       ("eval", "server_env", inventory.stages.eval.server_env),
                                       ("extract", "specforge_env", inventory.stages.extract.specforge_env))
             for key, value in env.items()}
    if inventory.notify is not None and inventory.notify.url:
        found["notify.url"] = inventory.notify.url
    return found


def names(inventory: Inventory) -> list[str]:
    """Every secret the inventory names: `secrets:`, then each ``${NAME}``, once each."""
    named = [*inventory.secrets, *(name for value in sealable(inventory).values() for name in references(value))]
    return list(dict.fromkeys(named))


def values(inventory: Inventory, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the host's jobs get, by variable: each named secret from `environ` (this machine's), each sealed
    literal under its own name. One line naming every one unset, before anything starts."""
    wanted = names(inventory)
    missing = [name for name in wanted if name not in environ]
    if missing:
        several = len(missing) > 1
        raise AerieError(f"{inventory.path}: secret{'s' if several else ''} {', '.join(missing)} named in the inventory "
                         f"{'are' if several else 'is'} not set here: `export {missing[0]}=...` in this shell first "
                         "(its value is read at each command and never stored on the host)")
    found = {name: environ[name] for name in wanted}
    found.update({sealed_name(where): value for where, value in sealable(inventory).items() if not REFERENCE.search(value)})
    return found


def masked(value: Any, key: str | None = None) -> Any:
    """`value` (a part of an inventory, as a refusal quotes it) with the value of every `SECRET_KEYS` key shown as `MASK`."""
    if key in SECRET_KEYS:
        return {k: MASK for k in value} if isinstance(value, dict) else MASK
    if isinstance(value, dict):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value
