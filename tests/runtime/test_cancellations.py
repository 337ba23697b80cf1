"""Every wait cleans up when it is cancelled: what a cancellation (a client gone, a timeout, shutdown, a
superseded drain) leaves behind, in every shell that waits.

The lane dispatcher's tests run on virtual time (see ``test_dispatcher.py``); the thread-work tests wait on
threads, which no clock can move.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from s3lanes.clock import FakeClock
from s3lanes.runtime import splice
from s3lanes.runtime.dispatcher import ABANDON_POLL_S, StreamBudget
from tests.runtime.test_dispatcher import (
    CHUNK,
    LANES,
    REFILL_S,
    KiB,
    acquire_now,
    assert_all_clear,
    clock_of,
    counters,
    exhaust,
    lane,
    make_dispatcher,
    settle,
)
from tests.runtime.test_spool_shell import opened

# -- the lane dispatcher -------------------------------------------------------------------------------------


async def test_cancelling_a_waiting_acquire_removes_its_ticket() -> None:
    d = make_dispatcher()
    blockers = exhaust(d)
    task = asyncio.create_task(d.acquire("metadata", 64 * KiB))
    await settle()
    assert counters(d)["queued_tickets"] == 1 and d.waiting == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    c = counters(d)
    assert (c["queued_tickets"], c["queued_bytes"], c["waiting"]) == (0, 0, 0)
    assert c["in_flight"] == 2  # the blockers only
    assert d._timer is None, "nothing queued: nothing to wake up for"
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


async def test_a_waiter_whose_client_went_away_leaves_the_queue_within_a_poll() -> None:
    # The window (two requests) is held by the blockers until the end: only ``gone`` can end the wait.
    d = make_dispatcher(inflight_requests_max=2)
    blockers = exhaust(d)
    clock = clock_of(d)
    asked: list[float] = []
    client_left_at = clock.monotonic() + 0.25

    def gone() -> bool:
        asked.append(clock.monotonic())
        return clock.monotonic() >= client_left_at

    staying = asyncio.create_task(d.acquire("metadata", 64 * KiB, gone=lambda: False))
    leaving = asyncio.create_task(d.acquire("metadata", 64 * KiB, gone=gone))
    await settle()
    assert counters(d)["queued_tickets"] == 2 and d.waiting == 2
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(leaving, 5.0)
    assert 0 <= clock.monotonic() - client_left_at <= ABANDON_POLL_S  # noticed at the next poll
    assert len(asked) == 3 and asked == sorted(asked)  # asked every poll while waiting, not only once
    assert asked[1] - asked[0] == pytest.approx(ABANDON_POLL_S)
    c = counters(d)
    assert (c["queued_tickets"], c["waiting"], c["in_flight"]) == (1, 1, 2)  # the other waiter is untouched
    d.release(blockers[0])
    ticket = await asyncio.wait_for(staying, 5.0)
    d.release(ticket)
    d.release(blockers[1])
    assert_all_clear(d)


async def test_a_timed_out_acquire_cleans_up_and_the_next_waiter_is_still_served() -> None:
    d = make_dispatcher()
    blockers = exhaust(d)
    clock = clock_of(d)
    started = clock.monotonic()
    with pytest.raises(TimeoutError):
        await clock.wait_for(d.acquire("metadata", 64 * KiB), REFILL_S / 4)
    assert clock.monotonic() == pytest.approx(started + REFILL_S / 4)
    assert counters(d)["queued_tickets"] == 0 and d.waiting == 0
    # A cancelled ticket ahead in the lane's queue does not stall the one behind it.
    first = asyncio.create_task(d.acquire("metadata", 64 * KiB))
    second = asyncio.create_task(d.acquire("metadata", 64 * KiB))
    await settle()
    first.cancel()
    ticket = await asyncio.wait_for(second, 5.0)
    assert first.cancelled()
    d.release(ticket)
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


async def test_cancel_in_the_same_iteration_as_the_grant_gives_the_budget_back() -> None:
    # One ticket in flight at a time: the waiter is held by the window, and a release grants it synchronously.
    d = make_dispatcher(inflight_requests_max=1)
    first = acquire_now(d, "restore", 64 * KiB)
    task = asyncio.create_task(d.acquire("restore", 128 * KiB))
    await settle()
    assert d.waiting == 1 and counters(d)["queued_tickets"] == 1
    d.release(first)
    # Granted (its future is resolved, the ticket is in flight) but the task has not run yet ...
    assert d.waiting == 0 and d.in_flight == 1 and counters(d)["inflight_bytes"] == 128 * KiB
    task.cancel()  # ... and is cancelled before it can see the grant.
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_all_clear(d)
    snap = lane(d, "restore")
    assert snap.granted_tickets_total == 2
    assert snap.done_bytes_total == 64 * KiB, "the cancelled grant counts as 0 bytes done"
    # The window is free again.
    d.release(acquire_now(d, "restore", 64 * KiB))
    assert_all_clear(d)


async def test_hold_releases_on_exception_and_on_cancellation() -> None:
    d = make_dispatcher()
    with pytest.raises(ValueError, match="boom"):
        async with d.hold("checkpoint", 100 * KiB):
            assert d.in_flight == 1
            raise ValueError("boom")
    assert_all_clear(d)

    entered = asyncio.Event()

    async def holder() -> None:
        async with d.hold("checkpoint", 100 * KiB):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(holder())
    await entered.wait()
    assert d.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_all_clear(d)
    assert lane(d, "checkpoint").done_bytes_total == 200 * KiB


async def test_close_cancels_every_waiter() -> None:
    d = make_dispatcher()
    blockers = exhaust(d)
    tasks = [asyncio.create_task(d.acquire("metadata", 64 * KiB)) for _ in range(6)]
    await settle()
    assert d.waiting == 6
    d.close()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    c = counters(d)
    assert (c["queued_tickets"], c["waiting"], c["in_flight"]) == (0, 0, 2)
    assert d._timer is None
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


async def test_stream_budget_cancelled_while_waiting_for_its_next_chunk() -> None:
    d = make_dispatcher()
    blockers = exhaust(d, "checkpoint")
    budget = StreamBudget(d, "checkpoint", CHUNK, None)
    task = asyncio.create_task(budget.take(CHUNK))
    await settle()
    assert d.waiting == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    budget.close()
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


# -- the lane dispatcher, everything at once -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "overrides"),
    [
        (1, {}),
        (2, {"inflight_requests_max": 4, "inflight_bytes_max": 512 * KiB}),
        (3, {"inflight_requests_max": 2}),
    ],
    ids=["paced", "windowed", "narrow-window"],
)
async def test_random_cancellations_leave_every_counter_at_zero(seed: int, overrides: dict[str, Any]) -> None:
    d = make_dispatcher(**overrides)
    clock = clock_of(d)
    rng = random.Random(seed)
    # What each task is doing, for the canceller: "waiting" is set just before an await that may suspend
    # on budget, "holding" once budget is granted and held across a suspension.
    phase: dict[int, str] = {}

    async def plain(i: int, name: str, cost: int) -> None:
        phase[i] = "waiting"
        ticket = await d.acquire(name, cost)
        try:
            phase[i] = "holding"
            await clock.sleep(rng.choice([0, 0.001, 0.002]))
        finally:
            d.release(ticket, bytes_done=rng.choice([None, cost // 2]))

    async def held(i: int, name: str, cost: int) -> None:
        phase[i] = "waiting"
        async with d.hold(name, cost):
            phase[i] = "holding"
            await clock.sleep(rng.choice([0, 0.001, 0.002]))

    async def stream(i: int, name: str, cost: int) -> None:
        total = rng.randint(1, 4 * cost + 1)
        budget = StreamBudget(d, name, 16 * KiB, rng.choice([total, None]))
        try:
            left = total
            while left:
                n = min(left, rng.randint(1, 24 * KiB))
                phase[i] = "waiting"
                await budget.take(n)
                phase[i] = "holding"
                left -= n
                await asyncio.sleep(0)
        finally:
            budget.close()

    async def run(i: int) -> None:
        kind = rng.choice((plain, held, stream))
        try:
            await kind(i, rng.choice(LANES), rng.randint(0, 64 * KiB))
        finally:
            phase[i] = "done"

    tasks = {i: asyncio.create_task(run(i)) for i in range(150)}
    cancelled_in: list[str] = []
    while len(cancelled_in) < 60 and not all(t.done() for t in tasks.values()):
        # Cancel at assorted moments: mid-wait, mid-hold, right after a grant the task has not seen yet.
        await clock.sleep(rng.choice([0, 0, 0.0005, 0.002]))
        for want in ("waiting", "holding"):
            candidates = sorted(i for i, p in phase.items() if p == want and not tasks[i].cancelling())
            if candidates:
                victim = rng.choice(candidates)
                tasks[victim].cancel()
                cancelled_in.append(want)
    results = await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 8.0)
    unexpected = [
        r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
    ]
    assert unexpected == []
    assert {"waiting", "holding"} <= set(cancelled_in), cancelled_in
    assert_all_clear(d)


# -- the clock's own wait ------------------------------------------------------------------------------------


async def test_cancelling_a_fake_wait_for_cancels_what_it_waits_for_and_is_not_a_timeout() -> None:
    clock = FakeClock()
    inner = asyncio.ensure_future(asyncio.Event().wait())
    outer = asyncio.create_task(clock.wait_for(inner, 10))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert inner.cancelled()
    assert clock.next_timer_at() is None, "its timer is disarmed"


# -- thread work ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["run_io_owned", "run_read_io_owned"])
async def test_a_descriptor_opened_for_a_cancelled_caller_is_closed_not_leaked(
    tmp_path: Path, pool: str
) -> None:
    """A drain cut short (or a writer) cancelled while its thread opens a spool file: the thread cannot be
    stopped, so the descriptor it returns is closed on arrival; without that it stayed open on a file the
    spool deletes later (found by the soak's idle-descriptor check)."""
    spool = await opened(tmp_path)
    target = tmp_path / "victim"
    target.write_bytes(b"x")
    opening, release_thread = threading.Event(), threading.Event()
    got: list[int] = []

    def slow_open() -> int:
        opening.set()
        release_thread.wait(10)
        fd = os.open(target, os.O_RDONLY)
        got.append(fd)
        return fd

    closed: list[int] = []

    def close(fd: int) -> None:
        closed.append(fd)
        os.close(fd)

    try:
        task = asyncio.create_task(getattr(spool, pool)(slow_open, release=close))
        await asyncio.to_thread(opening.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release_thread.set()
        for _ in range(200):
            if closed:
                break
            await asyncio.sleep(0.01)
        assert closed == got and len(got) == 1
        with pytest.raises(OSError):
            os.fstat(got[0])  # really closed
        # Not cancelled: the caller gets the descriptor and nothing is released.
        fd = await getattr(spool, pool)(os.open, target, os.O_RDONLY, release=close)
        assert closed == got
        os.close(fd)
    finally:
        release_thread.set()
        await spool.close()


async def test_a_cancelled_caller_of_thread_work_is_released_only_once_the_thread_is_done() -> None:
    """run_settled: the descriptors a thread call uses are closed by the caller after it returns, so a
    cancellation must not surface while the call still runs, not even a second one."""
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    done: list[float] = []

    def work() -> int:
        loop.call_soon_threadsafe(started.set)
        time.sleep(0.2)
        done.append(time.monotonic())
        return 7

    task = asyncio.create_task(splice.run_settled(loop.run_in_executor(None, work)))
    await started.wait()
    task.cancel()
    await asyncio.sleep(0.02)
    task.cancel()  # a second cancellation does not cut the wait either
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done, "the cancellation surfaced while the thread was still inside the call"

    # Not cancelled: the result comes through.
    assert await splice.run_settled(loop.run_in_executor(None, lambda: 3)) == 3
