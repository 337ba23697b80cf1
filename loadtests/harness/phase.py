"""A benchmark phase's progress lines and time limit."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable
from typing import TypeVar

from loadtests.harness.errors import BenchError

T = TypeVar("T")


def progress(text: str) -> None:
    """A progress line on stderr, after the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def time_limited(what: str, aw: Awaitable[T], timeout_s: float) -> T:
    """``aw``'s result, or a :class:`BenchError` naming ``what`` once it has taken ``timeout_s``
    (the ``--phase-timeout-s`` of the benchmarks)."""

    async def inner() -> T:  # awaiting the gather here retrieves its result, even a cancellation
        return await aw

    try:
        return await asyncio.wait_for(inner(), timeout_s)
    except TimeoutError:
        raise BenchError(f"{what} took longer than --phase-timeout-s={timeout_s}") from None
