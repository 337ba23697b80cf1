"""The dispatcher shell on a real event loop, over a real scheduler with a small configured capacity.

The dispatcher's clock is the loop's own time, so the timer it arms with ``loop.call_at`` and the times the
scheduler reasons in are one scale. Capacity is 10 MB/s with a 1 MiB bucket: budget runs out after about
two MiB and refills at one MiB per ~105 ms, so waits are real but short. Every test ends by checking that
nothing is left behind: no ticket queued or in flight in the scheduler, no waiter or grant in the
dispatcher, no timer armed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

import pytest

from gateway.config import Config
from gateway.core.scheduler import LaneSnapshot, Scheduler
from gateway.runtime.dispatcher import ABANDON_POLL_S, LaneDispatcher, StreamBudget
from gateway.runtime.wiring import scheduler_config

KiB = 1024
MiB = 1024 * KiB
CAPACITY_BPS = 10e6
REFILL_S = MiB / CAPACITY_BPS  # ~105 ms: how long the server bucket takes to refill one MiB of debt
LANES = tuple(Config().lanes)


class LoopClock:
    """A :class:`~gateway.clock.Clock` on the running loop's time (what ``loop.call_at`` schedules on)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def monotonic(self) -> float:
        return self._loop.time()

    def wall(self) -> float:
        return time.time()


def make_dispatcher(**overrides: Any) -> LaneDispatcher:
    cfg = replace(scheduler_config(Config(), CAPACITY_BPS), burst_bytes=MiB)
    clock = LoopClock(asyncio.get_running_loop())
    return LaneDispatcher(Scheduler(replace(cfg, **overrides), clock.monotonic()), clock)


def lane(d: LaneDispatcher, name: str) -> LaneSnapshot:
    return d.scheduler.snapshot(asyncio.get_running_loop().time()).lane(name)


def counters(d: LaneDispatcher) -> dict[str, int]:
    snap = d.scheduler.snapshot(asyncio.get_running_loop().time())
    return {
        "queued_tickets": sum(ln.queued_tickets for ln in snap.lanes),
        "queued_bytes": sum(ln.queued_bytes for ln in snap.lanes),
        "inflight_tickets": snap.inflight_tickets,
        "inflight_bytes": snap.inflight_bytes,
        "waiting": d.waiting,
        "in_flight": d.in_flight,
    }


def assert_all_clear(d: LaneDispatcher) -> None:
    assert counters(d) == dict.fromkeys(counters(d), 0)
    assert d._timer is None, "a timer is still armed with nothing to wait for"


def acquire_now(d: LaneDispatcher, lane_name: str, cost_bytes: int) -> int:
    """Run ``acquire`` by hand: it must finish on its first step, without ever suspending."""
    coro: Coroutine[Any, Any, int] = d.acquire(lane_name, cost_bytes)
    try:
        coro.send(None)
    except StopIteration as done:
        ticket: int = done.value
        return ticket
    coro.close()  # runs acquire's cleanup, as a cancellation would
    raise AssertionError(f"acquire({lane_name!r}, {cost_bytes}) suspended")


def exhaust(d: LaneDispatcher, lane_name: str = "metadata") -> list[int]:
    """Take the whole server bucket and one MiB of debt: the next weight-phase ticket waits ~REFILL_S."""
    return [acquire_now(d, lane_name, MiB), acquire_now(d, lane_name, MiB)]


async def settle() -> None:
    """Let every task that is ready run up to its next suspension."""
    for _ in range(3):
        await asyncio.sleep(0)


# -- grants ------------------------------------------------------------------------------------------------


async def test_acquire_is_granted_without_suspending_while_budget_lasts() -> None:
    d = make_dispatcher()
    tickets = [acquire_now(d, "metadata", 256 * KiB) for _ in range(4)]
    assert tickets == sorted(tickets) and len(set(tickets)) == 4
    assert counters(d)["in_flight"] == 4 and counters(d)["inflight_bytes"] == MiB
    assert d.waiting == 0
    for t in tickets:
        d.release(t)
    d.release(tickets[0])  # twice: no-op
    assert_all_clear(d)


async def test_waiters_of_a_lane_are_granted_in_submission_order() -> None:
    d = make_dispatcher()
    blockers = exhaust(d)
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with d.hold("metadata", 64 * KiB):
            order.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(6)]
    await settle()
    assert order == [] and d.waiting == 6 and counters(d)["queued_tickets"] == 6
    await asyncio.gather(*tasks)
    assert order == list(range(6))
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


async def test_waiters_are_woken_by_one_timer_when_the_budget_refills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    d = make_dispatcher()
    armed: list[asyncio.TimerHandle] = []
    real_call_at = loop.call_at

    def call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        handle = real_call_at(when, callback, *args, **kwargs)
        if getattr(callback, "__self__", None) is d:
            pending = [h for h in armed if not h.cancelled() and h.when() > loop.time()]
            assert pending == [], "a second dispatcher timer while one is pending"
            armed.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_at", call_at)
    blockers = exhaust(d)
    started = loop.time()
    granted_at: list[float] = []

    async def waiter() -> None:
        ticket = await d.acquire("metadata", 64 * KiB)
        granted_at.append(loop.time())
        d.release(ticket)

    tasks = [asyncio.create_task(waiter()) for _ in range(5)]
    await settle()
    assert d.waiting == 5 and granted_at == []
    assert len(armed) == 1, "five waiters, one timer"
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    # Nobody is granted before the server bucket is back out of its debt.
    assert min(granted_at) >= started + REFILL_S * 0.95
    assert granted_at == sorted(granted_at)
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


# -- cancellation ------------------------------------------------------------------------------------------


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
    asked: list[float] = []
    loop = asyncio.get_running_loop()
    client_left_at = loop.time() + 0.25

    def gone() -> bool:
        asked.append(loop.time())
        return loop.time() >= client_left_at

    staying = asyncio.create_task(d.acquire("metadata", 64 * KiB, gone=lambda: False))
    leaving = asyncio.create_task(d.acquire("metadata", 64 * KiB, gone=gone))
    await settle()
    assert counters(d)["queued_tickets"] == 2 and d.waiting == 2
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(leaving, 5.0)
    assert loop.time() - client_left_at < 3 * ABANDON_POLL_S  # noticed within a poll or so
    assert len(asked) >= 2  # it was asked while waiting, not only once
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
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(d.acquire("metadata", 64 * KiB), REFILL_S / 4)
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


async def test_a_ticket_held_by_its_lanes_window_share_is_granted_when_reads_go_idle() -> None:
    # Nothing but time releases the held ticket here: the dispatcher must have a timer armed for it.
    d = make_dispatcher(inflight_bytes_max=MiB, read_idle_s=0.05)
    # Reads become active: a read-protected lane asked for 1 % of C over read_active_s (100 kB).
    d.release(acquire_now(d, "dataset", 128 * KiB))
    assert d.scheduler.snapshot(asyncio.get_running_loop().time()).reads_active
    # While reads are active, checkpoint may hold only 30 % of the 1 MiB window beyond its first ticket
    # (say one upload's chunk in flight while another upload asks for its next).
    first = acquire_now(d, "checkpoint", 64 * KiB)
    try:
        task = asyncio.create_task(d.acquire("checkpoint", 256 * KiB))
        await settle()
        assert d.waiting == 1, "held back by the lane's window share"
        # Reads go idle 50 ms later, which lifts the share; the held ticket is then granted.
        d.release(await asyncio.wait_for(task, 1.0))
    finally:
        d.release(first)
    assert_all_clear(d)


# -- StreamBudget ------------------------------------------------------------------------------------------

CHUNK = 256 * KiB


def pieces(total: int, seed: int) -> list[int]:
    """Socket-read-like sizes summing to ``total``: mostly small, some spanning several chunks."""
    rng = random.Random(seed)
    out: list[int] = []
    left = total
    while left > 0:
        n = rng.choice([1, rng.randint(1, 64 * KiB), rng.randint(1, 64 * KiB), rng.randint(CHUNK, 3 * CHUNK)])
        n = min(n, left)
        out.append(n)
        left -= n
    return out


@pytest.mark.parametrize("known_total", [True, False], ids=["known-total", "unknown-total"])
async def test_stream_budget_charges_exactly_the_bytes_taken(known_total: bool) -> None:
    d = make_dispatcher()
    total = 5 * CHUNK + 12_345
    budget = StreamBudget(d, "restore", CHUNK, total if known_total else None)
    # A paced lane in front of a 10 MB/s store asks for 64 KiB at a time (50 KB in the 5 ms target).
    piece = budget.piece_bytes
    assert piece == 64 * KiB
    sizes = pieces(total, seed=7)
    for n in sizes:
        await budget.take(n)
        assert d.in_flight <= 1, "at most one chunk's ticket is held at a time"
    budget.close()
    budget.close()  # idempotent
    assert_all_clear(d)
    snap = lane(d, "restore")
    expected_granted = total if known_total else -(-total // piece) * piece
    assert snap.granted_bytes_total == expected_granted
    assert snap.granted_tickets_total == -(-total // piece)
    assert snap.delivered_bytes_total == total
    # What the scheduler was told was moved is what was taken; the unused tail was refunded.
    assert snap.done_bytes_total == total


@pytest.mark.parametrize("known_total", [True, False], ids=["known-total", "unknown-total"])
async def test_stream_budget_closed_mid_stream_returns_in_flight_to_zero(known_total: bool) -> None:
    d = make_dispatcher()
    budget = StreamBudget(d, "dataset", CHUNK, 8 * CHUNK if known_total else None)
    taken = 0
    for n in pieces(2 * CHUNK + 1000, seed=3):
        await budget.take(n)
        taken += n
    assert d.in_flight == 1
    budget.close()
    assert_all_clear(d)
    snap = lane(d, "dataset")
    assert snap.granted_bytes_total == 3 * CHUNK
    assert snap.done_bytes_total == taken


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


# -- everything at once ------------------------------------------------------------------------------------


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
    rng = random.Random(seed)
    # What each task is doing, for the canceller: "waiting" is set just before an await that may suspend
    # on budget, "holding" once budget is granted and held across a suspension.
    phase: dict[int, str] = {}

    async def plain(i: int, name: str, cost: int) -> None:
        phase[i] = "waiting"
        ticket = await d.acquire(name, cost)
        try:
            phase[i] = "holding"
            await asyncio.sleep(rng.choice([0, 0.001, 0.002]))
        finally:
            d.release(ticket, bytes_done=rng.choice([None, cost // 2]))

    async def held(i: int, name: str, cost: int) -> None:
        phase[i] = "waiting"
        async with d.hold(name, cost):
            phase[i] = "holding"
            await asyncio.sleep(rng.choice([0, 0.001, 0.002]))

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
        await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.002]))
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
