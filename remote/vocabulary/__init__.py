"""The words both sides share: job states, the host's layout, the payload's framing, the hints, the
secrets' pattern, specs' fingerprints, sizes and `inv plan`'s refusals.

The one part of `remote` the workstation (`local/`, `tasks.py`) imports (tests/test_layout.py holds
it): standard library only, light to import, and importing nothing of `remote` outside itself, so
that the host's control plane and the workstation read one spelling of each word.
"""
