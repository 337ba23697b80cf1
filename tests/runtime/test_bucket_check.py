"""The write spool's bucket check before an ack (s3lanes.runtime.bucket_check): cached for
BUCKET_CHECK_TTL_S, and shared by the requests that arrive while one is on its way (four writers starting a
checkpoint make one HEAD, not four).

The check's one backend call (a HEAD of the bucket, the spool front's ``_head_status``) is replaced by a
stand-in whose answer the test holds back until every request has arrived; what is under test is the
check's own bookkeeping. The HEAD against a real SeaweedFS is exercised by every spooled write in
``tests/e2e/test_spool.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from s3lanes.clock import FakeClock
from s3lanes.errors import NoSuchBucket, ServiceUnavailable
from s3lanes.runtime.bucket_check import BUCKET_CHECK_TTL_S, BucketCheck


class HeldHead:
    """Answers HEAD bucket with ``status`` once ``release`` is set; counts the calls."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self, ctx: Any, bucket: str) -> int:
        self.calls += 1
        await self.release.wait()
        return self.status


def front(head: HeldHead, clock: FakeClock) -> BucketCheck[Any]:
    spool: Any = SimpleNamespace(has_bucket_prefix=lambda bucket, prefix: False)
    return BucketCheck(spool, clock, head)


def ctx(access_key: str = "AK") -> Any:
    return SimpleNamespace(credential=SimpleNamespace(backend_access_key=access_key))


async def test_requests_arriving_during_a_check_share_it_and_the_answer_is_cached() -> None:
    clock, head = FakeClock(), HeldHead()
    f = front(head, clock)
    waiters = [asyncio.ensure_future(f.check(ctx(), "b")) for _ in range(8)]
    await asyncio.sleep(0.01)
    assert head.calls == 1 and not any(w.done() for w in waiters)
    head.release.set()
    await asyncio.gather(*waiters)
    await f.check(ctx(), "b")  # cached
    assert head.calls == 1
    await f.check(ctx("OTHER"), "b")  # another backend identity checks for itself
    assert head.calls == 2
    clock.advance(BUCKET_CHECK_TTL_S + 1)
    await asyncio.gather(*(f.check(ctx(), "b") for _ in range(4)))
    assert head.calls == 3
    assert f._bucket_checks == {}


async def test_a_missing_bucket_fails_every_waiter_and_is_asked_again_next_time() -> None:
    clock, head = FakeClock(), HeldHead(status=404)
    f = front(head, clock)
    waiters = [asyncio.ensure_future(f.check(ctx(), "gone")) for _ in range(5)]
    await asyncio.sleep(0.01)
    head.release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, NoSuchBucket) for r in results)
    assert head.calls == 1
    with pytest.raises(NoSuchBucket):
        await f.check(ctx(), "gone")
    assert head.calls == 2  # a refusal is not cached


async def test_a_waiter_that_gives_up_does_not_cancel_the_check_for_the_others() -> None:
    clock, head = FakeClock(), HeldHead()
    f = front(head, clock)
    first = asyncio.ensure_future(f.check(ctx(), "b"))
    second = asyncio.ensure_future(f.check(ctx(), "b"))
    await asyncio.sleep(0.01)
    first.cancel()  # its client went away
    await asyncio.sleep(0.01)
    head.release.set()
    await second
    assert first.cancelled() and head.calls == 1
    await f.check(ctx(), "b")
    assert head.calls == 1  # the shared check finished and was cached


async def test_a_remembered_bucket_absorbs_writes_while_the_store_cannot_be_asked() -> None:
    async def unreachable(ctx: Any, bucket: str) -> int:
        raise ServiceUnavailable("down")

    spool: Any = SimpleNamespace(has_bucket_prefix=lambda bucket, prefix: False)
    check: BucketCheck[Any] = BucketCheck(spool, FakeClock(), unreachable)
    with pytest.raises(ServiceUnavailable):
        await check.check(ctx(), "b")  # never seen: refused promptly
    check.remember("AK", "b")  # spooled data acknowledged before a restart
    await check.check(ctx(), "b")
    with pytest.raises(ServiceUnavailable):
        await check.check(ctx("OTHER"), "b")  # another backend identity was never checked
