"""A training run's TensorBoard events, read back by TensorBoard's own loader."""

from __future__ import annotations

from pathlib import Path


def read_events(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for `logdir`, as (step, value) per tag, read by TensorBoard's own loader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
