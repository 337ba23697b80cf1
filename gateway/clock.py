"""Time as a parameter.

Cores never read the clock: their time-dependent methods take ``now``. The async shell owns one
:class:`Clock`; tests use :class:`FakeClock` and advance it explicitly instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale, for deadlines and rates."""

    def wall(self) -> float:
        """Seconds since the Unix epoch, for SigV4 dates and expiry."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock that only moves when told to. Not thread-safe; meant for tests and simulations."""

    def __init__(self, start_monotonic: float = 1000.0, start_wall: float = 1_700_000_000.0) -> None:
        self._mono = start_monotonic
        self._wall = start_wall

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not run backwards")
        self._mono += seconds
        self._wall += seconds
