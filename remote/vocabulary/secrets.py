"""Secrets on the host: held in the environment of aerie's processes, never in a file.

The workstation sends a command that starts jobs (launch, run, rerun) the inventory's secrets on its
stdin (local/inventory/secret_values.py); `hold` puts them in that command's environment, and every process it
starts inherits them: each job's supervisor and stage, the pipeline runner and so every job the runner
starts later, after the workstation has gone, and the inference server. A spec names a secret as
``${NAME}``; `expand` fills it in from the environment where the value is used (the server's environment,
the webhook of `notify:`).

NOTE: the environment, not a 0600 file beside the job: the kernel shows a process's environment to its
own user only (and root), as it would such a file, but nothing that reads the root (status, logs, a copy
or backup of the root, a grep) can come upon it, and nothing is left to remove when the run ends. A job
started after a reboot is started by a command from the workstation, which sends them again.

Standard library only, and cheap: every verb imports it.
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False  # typing's, without importing typing: see remote/__init__.py
if TYPE_CHECKING:
    from typing import Any, Mapping

#: A reference to a secret, ``${NAME}``, as both sides spell it (the workstation imports it), and a value shown masked.
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MASK = "***"


class MissingSecret(Exception):
    """A spec names a secret this process was not given: the message names it, never a value."""


def hold(args: dict[str, Any]) -> None:
    """Take the secrets out of a verb's arguments (nothing after this sees them there) into this process's environment."""
    given = args.pop("secrets", None) or {}
    for name, value in given.items():
        if isinstance(name, str) and isinstance(value, str) and REFERENCE.fullmatch("${" + name + "}"):
            os.environ[name] = value


def expand(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with each ``${NAME}`` replaced by NAME's value in `environ` (this process's by default)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in REFERENCE.findall(text) if name not in environ]
    if missing:
        raise MissingSecret(f"the secret {missing[0]} was not given to this run: run the command again from a "
                            f"shell where {missing[0]} is set (`inv rerun --failed`)")
    return REFERENCE.sub(lambda match: environ[match.group(1)], text)


def expand_env(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    return {key: expand(value, environ) for key, value in env.items()}


def mask(text: str, values: list[str]) -> str:
    """`text` (a message about to be shown or logged) with each of `values` shown as `MASK`."""
    for value in sorted(filter(None, values), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
