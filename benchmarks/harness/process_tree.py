"""Processes seen through /proc, for the test servers that must leave nothing running."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used by `root` and everything under it, the ended included: each live process's own
    time and that of the children it has waited for (an ended child's time is in its parent's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in [root, *descendants(root)]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile: its time is in its parent's now, or soon
        total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / tick
