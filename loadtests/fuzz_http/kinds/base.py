"""What every case kind starts from: the case function type and a valid object to attack."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loadtests.fuzz_http.case import Case

# --------------------------------------------------------------------------------------------------------
# Case kinds. Each sends hostile requests mixed with valid ones and checks that nothing was lost.

CaseFn = Callable[[Case], Awaitable[None]]


async def seed_object(c: Case, key: str | None = None) -> tuple[str, bytes]:
    """A valid object for a case to attack (spooled, or written through to the backend)."""
    key = key or c.key()
    body = c.body(c.rng.randint(1, 3000) if c.rng.random() < 0.8 else None)
    await c.put(key, body, write_through=c.rng.random() < 0.3, step="seed")
    return key, body
