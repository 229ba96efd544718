"""The one exception a user can cause; tasks turn it into a one-line `Exit`."""


class AerieError(Exception):
    """A mistake the user can fix: the message names what is wrong and how to fix it."""


class NotDeployed(AerieError):
    """The host has no release yet: `inv deploy` first (`inv status` just says there are no jobs)."""
