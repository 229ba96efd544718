"""The two errors prep raises: one the user must fix, and one that skips a row with a reason."""

class PrepError(Exception):
    """Something the user must fix (a missing file, a bad setting, a tokenizer without a template)."""


class Skip(Exception):
    """A row that cannot become a record; `reason` is what the counts are keyed by."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
