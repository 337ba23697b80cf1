"""The spool front's bucket check before an ack: cached for BUCKET_CHECK_TTL_S, and shared by the requests
that arrive while one is on its way (four writers starting a checkpoint make one HEAD, not four).

The check's one backend call (``_backend_call``, a HEAD of the bucket) is replaced by a stand-in whose answer
the test holds back until every request has arrived; what is under test is the front's own bookkeeping. The
HEAD against a real SeaweedFS is exercised by every spooled write in ``tests/e2e/test_spool.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.clock import FakeClock
from gateway.errors import NoSuchBucket
from gateway.http.spool_front import BUCKET_CHECK_TTL_S, SpoolFront


class HeldHead:
    """Answers HEAD bucket with ``status`` once ``release`` is set; counts the calls."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self, ctx: Any, lane: str, method: str, bucket: str, key: Any, query: str) -> Any:
        assert (lane, method, key) == ("metadata", "HEAD", None)
        self.calls += 1
        await self.release.wait()
        return SimpleNamespace(status=self.status, release=lambda: None)


def front(head: HeldHead, clock: FakeClock) -> SpoolFront:
    f = SpoolFront.__new__(SpoolFront)
    f._clock = clock
    f._bucket_ok = {}
    f._bucket_checks = {}
    f.spool = SimpleNamespace(state=SimpleNamespace(has_bucket_prefix=lambda bucket, prefix: False))  # type: ignore[assignment]
    f._backend_call = head  # type: ignore[method-assign, assignment]
    return f


def ctx(access_key: str = "AK") -> Any:
    return SimpleNamespace(credential=SimpleNamespace(backend_access_key=access_key))


async def test_requests_arriving_during_a_check_share_it_and_the_answer_is_cached() -> None:
    clock, head = FakeClock(), HeldHead()
    f = front(head, clock)
    waiters = [asyncio.ensure_future(f._check_bucket(ctx(), "b")) for _ in range(8)]
    await asyncio.sleep(0.01)
    assert head.calls == 1 and not any(w.done() for w in waiters)
    head.release.set()
    await asyncio.gather(*waiters)
    await f._check_bucket(ctx(), "b")  # cached
    assert head.calls == 1
    await f._check_bucket(ctx("OTHER"), "b")  # another backend identity checks for itself
    assert head.calls == 2
    clock.advance(BUCKET_CHECK_TTL_S + 1)
    await asyncio.gather(*(f._check_bucket(ctx(), "b") for _ in range(4)))
    assert head.calls == 3
    assert f._bucket_checks == {}


async def test_a_missing_bucket_fails_every_waiter_and_is_asked_again_next_time() -> None:
    clock, head = FakeClock(), HeldHead(status=404)
    f = front(head, clock)
    waiters = [asyncio.ensure_future(f._check_bucket(ctx(), "gone")) for _ in range(5)]
    await asyncio.sleep(0.01)
    head.release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, NoSuchBucket) for r in results)
    assert head.calls == 1
    with pytest.raises(NoSuchBucket):
        await f._check_bucket(ctx(), "gone")
    assert head.calls == 2  # a refusal is not cached


async def test_a_waiter_that_gives_up_does_not_cancel_the_check_for_the_others() -> None:
    clock, head = FakeClock(), HeldHead()
    f = front(head, clock)
    first = asyncio.ensure_future(f._check_bucket(ctx(), "b"))
    second = asyncio.ensure_future(f._check_bucket(ctx(), "b"))
    await asyncio.sleep(0.01)
    first.cancel()  # its client went away
    await asyncio.sleep(0.01)
    head.release.set()
    await second
    assert first.cancelled() and head.calls == 1
    await f._check_bucket(ctx(), "b")
    assert head.calls == 1  # the shared check finished and was cached
