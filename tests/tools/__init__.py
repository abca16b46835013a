"""Development tools, checked by the tests (tests/unit/test_sdk_unasync.py runs unasync.py)."""
