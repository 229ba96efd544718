"""The next steps aerie prints, as commands to type: one builder for every `inv ...` in a message.

A hint is built from a task's name and its flags' names as tasks.py declares them, never typed out
as free text, and tests/test_hints.py parses every hint aerie can print with Invoke's own parser
against tasks.py: a hint that names a task or a flag tasks.py does not have fails there, not in
the user's shell. Long flags only: a short one may mean another thing on another task.
Standard library only: both sides print hints (the host's stages too).
"""

from __future__ import annotations

#: The stages only a pipeline's runner starts (`inv launch --stage` takes the others): tokenize is
#: prep over infer's answers, chunked is extract and train in turns.
PIPELINE_ONLY = ("tokenize", "chunked")
#: Where every refusal of a dataset that gives zero records ends (prep's, and `inv validate`'s): how to
#: teach prep a format it does not read.
TEACH_A_FAMILY = 'README, "Teaching prep a new family", shows how to add a format prep does not read'


def words(task: str, *args: str, **flags: str | bool | None) -> str:
    """One task of a command line: `launch --stage prep --dataset A1`; a flag's `_` is typed `-`,
    True is a switch, False and None leave the flag out."""
    typed = [task, *args]
    for name, value in flags.items():
        if value is None or value is False:
            continue
        typed.append("--" + name.replace("_", "-"))
        if value is not True:
            typed.append(str(value))
    return " ".join(typed)


def inv(task: str, *args: str, **flags: str | bool | None) -> str:
    """`inv TASK ARGS --flag value`, in backticks as every message shows a command."""
    return chain(words(task, *args, **flags))


def chain(*tasks: str) -> str:
    """Several tasks on one command line (`inv deploy rerun --failed`), each from `words`."""
    return "`inv " + " ".join(tasks) + "`"
