"""Glue between Invoke and aerie: a `task` decorator that turns user mistakes into one line and Ctrl-C into
exit 130 with one line, flags that mean one thing across the tasks, an executor that refuses a command line
whose tasks would run on different inventories, and the flags' parsing (a typo is one line, never Invoke's
traceback)."""

from __future__ import annotations

import atexit
import functools
import gc
import shlex
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import invoke
from invoke import Context, Exit

from local.exceptions import AerieError
from local.paths import resolve_path
from local.visible import visible

#: The shell's exit status for a command ended by SIGINT (128 + 2): a script that checks `$?` reads no success.
INTERRUPTED = 130


class Task(invoke.Task):
    """Invoke's task, with `long_only`: flags given no automatic short flag, so that a short flag means one
    thing in every task (`-d` is --dataset, `-f` --follow); and `inventory`: the one a task without -i runs on."""

    def __init__(self, body: Callable[..., Any], long_only: Iterable[str] = (), inventory: str | None = None,
                 **kwargs: Any) -> None:
        self.long_only, self.inventory = frozenset(long_only), inventory
        super().__init__(body, **kwargs)

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in self.long_only:
            opts["names"] = opts["names"][:1]
        return opts


def task(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], invoke.Task]:
    """`invoke.task` (as `Task`), but an `AerieError` ends the run as `aerie: message` with exit code 2, and
    Ctrl-C anywhere no live view says more as one line with exit code 130."""

    def decorate(body: Callable[..., Any]) -> invoke.Task:
        @functools.wraps(body)
        def run(c: Context, *a: Any, **kw: Any) -> Any:
            try:
                return body(c, *a, **kw)
            except AerieError as exc:  # its text may quote the host or the data: shown, never obeyed
                raise Exit(f"aerie: {visible(str(exc))}", code=2) from None
            except KeyboardInterrupt:
                raise Exit(f"aerie: interrupted (Ctrl-C); `inv status{_given(kw.get('inventory'))}` shows what the host "
                           f"runs", code=INTERRUPTED) from None

        return invoke.task(klass=Task, **kwargs)(run)

    if len(args) == 1 and callable(args[0]) and not kwargs:  # bare @task
        return decorate(args[0])
    return decorate


@contextmanager
def on_interrupt(said: str | None) -> Iterator[None]:
    """Ctrl-C in the block ends the command with exit code 130 and `said` (None: the `task`'s line), one line
    on stderr, once whatever the block had on the screen (a live table) has put the terminal back as it was."""
    try:
        yield
    except KeyboardInterrupt:
        if said is None:
            raise
        raise Exit(f"aerie: {said}", code=INTERRUPTED) from None


def goes_on(inventory: str | None, jobs: bool = False) -> str:
    """The line for Ctrl-C on a live view: the run (or the jobs) go on on the host, and the commands that
    follow and stop them (with the -i the command had, so that they reach the same host)."""
    what, goes, it = ("the jobs", "go", "them") if jobs else ("the run", "goes", "it")
    i = _given(inventory)
    return (f"stopped watching; {what} {goes} on on the host: `inv status --watch{i}` follows {it}, "
            f"`inv stop --all{i}` stops {it}")


def log_goes_on(dataset: str, inventory: str | None) -> str:
    """The line for Ctrl-C on `inv logs --follow`: the job goes on; how to follow it again, how to stop it."""
    job, i = shlex.quote(dataset), _given(inventory)
    return (f"stopped following the log; the job goes on on the host: `inv logs {job} --follow{i}` follows it, "
            f"`inv stop -d {job}{i}` stops it")


def _given(inventory: str | None) -> str:
    return f" -i {shlex.quote(inventory)}" if inventory else ""


class Executor(invoke.Executor):
    """Invoke's executor, refusing before any task runs a command line whose tasks would run on different
    inventories (`inv deploy rerun -i seed`: Invoke gives -i to `rerun` alone; deploy would go elsewhere)."""

    def execute(self, *tasks: Any) -> dict[invoke.Task, Any]:
        calls = self.normalize(tasks)
        if len(calls) > 1:
            self.config.load_collection(self.collection.configuration())  # as Invoke does before each task
            self.config.load_shell_env()
            contexts = tasks if len(tasks) == len(calls) else [None] * len(calls)
            typed = [(_spelled(call, context), *_inventory(call, self.config.get("inventory")), _bare(context))
                     for call, context in zip(calls, contexts) if _takes_inventory(call)]
            one_inventory([t[:3] for t in typed], open_ended=any(t[3] for t in typed[:-1]))
        return super().execute(*tasks)


def one_inventory(chosen: list[tuple[str, str, str]], open_ended: bool = False) -> None:
    """Refuse, in one line, tasks (as typed, their inventory, and what chose it: `-i`, `the default`, or `always`
    for a task that takes no -i) that would run on two inventories. `open_ended`: a task but the last ends with
    a flag of optional value given none (`--watch`), which would take the next task's name as its value."""
    if len({resolve_path(inventory).resolve() for _, inventory, _ in chosen}) <= 1:
        return
    runs = ", ".join(f"`{typed}` on {inventory}{'' if why == '-i' else f' ({why})'}" for typed, inventory, why in chosen)
    named = next((inventory for _, inventory, why in chosen if why == "always"), None) or \
        next((inventory for _, inventory, why in chosen if why == "-i"), chosen[0][1])
    each = " ".join(typed if why == "always" else f"{typed} -i {shlex.quote(named)}" for typed, _, why in chosen)
    once = "" if open_ended else \
        f" or set it once (`INVOKE_INVENTORY={shlex.quote(named)} inv {' '.join(typed for typed, _, _ in chosen)}`)"
    raise Exit(f"aerie: one command line runs on one inventory, not {runs}: give -i to each task (`inv {each}`){once}",
               code=2)


def _takes_inventory(call: Any) -> bool:
    return "inventory" in call.kwargs or getattr(call.task, "inventory", None) is not None


def _inventory(call: Any, default: str | None) -> tuple[str, str]:
    """The inventory a task will run on, and what chose it."""
    fixed, given = getattr(call.task, "inventory", None), call.kwargs.get("inventory")
    return (fixed, "always") if fixed else (given, "-i") if given else (default or "local", "the default")


def _given_args(context: Any) -> list[Any]:
    """The flags Invoke parsed for a task, but -i; a flag of optional value given none last."""
    args = [a for a in getattr(context, "args", {}).values() if a.name != "inventory" and a.got_value]
    return sorted(args, key=lambda a: a.optional and a.value is True)


def _bare(context: Any) -> bool:
    args = _given_args(context)
    return bool(args) and args[-1].optional and args[-1].value is True


def _spelled(call: Any, context: Any) -> str:
    """The task as typed, but its -i: its name and the flags Invoke parsed for it."""
    words = [call.called_as or call.task.name]
    for arg in _given_args(context):
        flag = f"-{arg.name}" if len(arg.name) == 1 else f"--{arg.name}"  # `-n`
        if arg.value is True or arg.value is False:
            words.append(flag if arg.value else f"--no-{arg.name}")
        else:
            words += [flag, shlex.quote(str(arg.value))]
    return " ".join(words)


def exit_without_collecting() -> None:
    """Let the process end without Python's last garbage collections.

    At exit the interpreter collects garbage several times over, each time walking every
    object the imports made (Invoke, rich, paramiko): a share of every short command large
    enough to feel (docs/benchmarks.md, "Exit"). Frozen objects are not walked. Frozen cyclic garbage is
    then left for the OS to reclaim with the process. Nothing of aerie's waits on a
    collector: files are closed by `with`, connections by `local.transport.shared` at exit,
    and the standard streams are flushed by the interpreter itself. The exit code is
    kept, because the interpreter still exits normally.
    """
    atexit.register(gc.freeze)


def inventory_name(c: Context, given: str | None) -> str:
    """`-i NAME|PATH`, else Invoke's config key `inventory` (so INVOKE_INVENTORY=gpu works)."""
    return given or c.config.get("inventory") or "local"


def split(names: str | None) -> list[str] | None:
    """`A1,B5` (or repeated flags joined by Invoke) as a list; None for all."""
    return [n for n in names.replace(" ", ",").split(",") if n] if names else None


def number(text: str | bool, flag: str, kind: type[int] | type[float], bare: Any = None) -> Any:
    """A flag's number, parsed here so that a typo is one line, not Invoke's traceback; `bare` for a flag of
    optional value given without one (Invoke then passes True)."""
    if text is True and bare is not None:
        return bare
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if value < 0 or text is True or text is False:
        raise AerieError(f"{flag} takes a {'whole ' if kind is int else ''}number of at least 0, not {text!r}")
    return value
