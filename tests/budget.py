"""How many examples a property test tries.

The suite runs every budget as written. ``S3LANES_TEST_FAST=1`` (``make test-fast``) divides each by ten (at
least ten examples) and loads the ``fast`` hypothesis profile (``tests/conftest.py``: ten examples where a
test names none, derandomized), so the pure layers run in seconds and cover the same lines every run.
"""

from __future__ import annotations

import os

FAST = os.environ.get("S3LANES_TEST_FAST") == "1"


def examples(n: int) -> int:
    """``n`` examples, or a tenth of them (at least ten) under ``S3LANES_TEST_FAST=1``."""
    return max(10, n // 10) if FAST else n
