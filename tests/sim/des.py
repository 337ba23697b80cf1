"""A discrete-event simulator in virtual time: a heap of (t, seq, event), no sleeps, no threads.

Every run is a pure function of its seed: random streams are derived from (seed, name), events at equal
times run in scheduling order (the sequence number breaks ties), and everything interesting is folded into
a trace hash, so "same seed, same trace" is one equality.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from typing import Any


class Timer:
    """A scheduled callback; :meth:`cancel` makes it a no-op (it stays in the heap until popped)."""

    __slots__ = ("args", "at", "cancelled", "fn")

    def __init__(self, at: float, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.at = at
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Simulator:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.now = 0.0
        self.events = 0
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = 0
        self._hash = hashlib.blake2b(digest_size=16)

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> Timer:
        if t < self.now:
            raise ValueError(f"cannot schedule in the past ({t} < {self.now})")
        timer = Timer(t, fn, args)
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, timer))
        return timer

    def after(self, dt: float, fn: Callable[..., None], *args: Any) -> Timer:
        return self.at(self.now + max(0.0, dt), fn, *args)

    def run(self, until: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, timer = heapq.heappop(heap)
            if timer.cancelled:
                continue
            self.now = t
            self.events += 1
            timer.fn(*timer.args)
        self.now = max(self.now, until)

    def rng(self, name: str) -> random.Random:
        """An independent, reproducible random stream for one component."""
        digest = hashlib.blake2b(f"{self.seed}/{name}".encode(), digest_size=8).digest()
        return random.Random(int.from_bytes(digest, "big"))

    def trace(self, *fields: object) -> None:
        self._hash.update(repr((round(self.now, 9), *fields)).encode())

    def trace_hash(self) -> str:
        return self._hash.hexdigest()
