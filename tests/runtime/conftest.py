"""Fixtures of the shell tests.

``no_clock_left_running`` (autouse): a test that leaves a timer armed on an autojumping
:class:`~s3lanes.clock.FakeClock` (a periodic task it did not stop) fails, since the clock's helper would
otherwise keep jumping it, and keep the shared event loop busy, for the rest of the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from s3lanes import clock as clock_module


@pytest.fixture(autouse=True)
async def no_clock_left_running() -> AsyncIterator[None]:
    yield
    loop = asyncio.get_running_loop()
    for _ in range(5):
        await asyncio.sleep(0)
    left = [c for c in clock_module._AUTOJUMP_CLOCKS.get(loop, ()) if c.next_timer_at() is not None]
    helper = clock_module._AUTOJUMP_HELPERS.get(loop)
    if left and helper is not None:
        helper.cancel()
        await asyncio.gather(helper, return_exceptions=True)
        clock_module._AUTOJUMP_CLOCKS.pop(loop, None)
        pytest.fail(f"the test left {len(left)} autojumping clock(s) with a timer armed: stop what arms it")
