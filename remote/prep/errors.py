"""The one error prep raises for bad input: its message is a whole sentence for the user."""


class PrepError(Exception):
    """Something the user must fix (a missing file, a bad setting, a tokenizer without a template)."""
