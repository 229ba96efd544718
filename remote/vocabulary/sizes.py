"""Bytes for a reader, in the two unit systems aerie speaks.

NOTE: two on purpose: disks, budgets and logs in binary units (what ``df -h`` and the settings'
``500G`` mean); a target's memory in decimal units with three significant figures (what checkpoints'
and GPUs' sizes are quoted in, so that "594 GB" reads as the model card says).
"""

from __future__ import annotations


def binary(n: float) -> str:
    """0 B, 512.0 KiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def decimal(n: float) -> str:
    """594 GB, 2.05 TB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            number = n / scale
            return f"{number:.3g} {unit}" if number < 999.5 else f"{number:,.0f} {unit}"
    return f"{n:.0f} B"
