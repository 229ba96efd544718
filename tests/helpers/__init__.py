"""What several test modules share: helpers imported from here, never from another `tests/test_*` module."""
