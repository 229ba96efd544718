"""A stage's progress that also keeps the notes it says, for a test to read."""

from __future__ import annotations

from remote.control_plane.progress import Progress


class Notes(Progress):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)
        super().note(text)
