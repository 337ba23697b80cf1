"""The dispatcher shell on a real event loop, over a real scheduler with a small configured capacity.

The dispatcher runs on virtual time: a :class:`~s3lanes.clock.FakeClock` that jumps to the dispatcher's timer
once every task waits on it, so a refill is waited for without sleeping on the wall clock, and the times the
tests check are exact. Capacity is 10 MB/s with a 1 MiB bucket: budget runs out after about two MiB and
refills at one MiB per ~105 ms. Every test ends by checking that nothing is left behind: no ticket queued or
in flight in the scheduler, no waiter or grant in the dispatcher, no timer armed. What a cancellation leaves
behind is in ``test_cancellations.py``.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import pytest

from s3lanes.clock import Clock, FakeClock, Timer
from s3lanes.config import Config
from s3lanes.core.scheduler import LaneSnapshot, Scheduler
from s3lanes.runtime.dispatcher import (
    PACED_RECEIVE_BUFFER_PIECES,
    RESTORED_RECEIVE_BUFFER_BYTES,
    LaneDispatcher,
    StreamBudget,
)
from s3lanes.runtime.wiring import scheduler_config

KiB = 1024
MiB = 1024 * KiB
CAPACITY_BPS = 10e6
REFILL_S = MiB / CAPACITY_BPS  # ~105 ms: how long the server bucket takes to refill one MiB of debt
LANES = tuple(Config().lanes)


def make_dispatcher(clock: Clock | None = None, **overrides: Any) -> LaneDispatcher:
    """A dispatcher on virtual time: by default a clock that jumps to the next timer whenever the loop is
    idle; pass a clock without ``autojump`` to move time only by hand (or the real clock for a test whose
    waits are on sockets, which an idle loop does not see)."""
    cfg = replace(scheduler_config(Config(), CAPACITY_BPS), burst_bytes=MiB)
    clock = clock or FakeClock(autojump=True)
    return LaneDispatcher(Scheduler(replace(cfg, **overrides), clock.monotonic()), clock)


def clock_of(d: LaneDispatcher) -> FakeClock:
    clock = d._clock
    assert isinstance(clock, FakeClock)
    return clock


def lane(d: LaneDispatcher, name: str) -> LaneSnapshot:
    return d.scheduler.snapshot(d._clock.monotonic()).lane(name)


def counters(d: LaneDispatcher) -> dict[str, int]:
    snap = d.scheduler.snapshot(d._clock.monotonic())
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


async def test_an_uncontended_acquire_takes_the_fast_path_and_one_behind_a_queued_lane_does_not() -> None:
    d = make_dispatcher(FakeClock())  # time moves only by hand
    blockers = exhaust(d)
    assert d.fast_grants == 2 and d._waiters == {}  # granted in the submitting call, no future made
    queued = asyncio.create_task(d.acquire("metadata", 64 * KiB))
    await settle()
    assert d.waiting == 1
    # A read-protected lane may borrow a bucket depth, so it would have budget; with a lane queued it still
    # goes through pull() (and a future), not the fast path.
    t = acquire_now(d, "dataset", 4 * KiB)
    assert d.fast_grants == 2
    d.release(t)
    clock_of(d).advance(1.0)
    for x in [*blockers, await queued]:
        d.release(x)
    assert_all_clear(d)
    d.release(acquire_now(d, "metadata", 4 * KiB))
    assert d.fast_grants == 3


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
    clock = FakeClock()  # moved by hand: the test looks at the timers before any fires
    d = make_dispatcher(clock)
    armed: list[tuple[float, Timer]] = []
    real_call_at = clock.call_at

    def call_at(when: float, callback: Callable[[], object]) -> Timer:
        handle = real_call_at(when, callback)
        pending = [t for at, t in armed if at > clock.monotonic() and not getattr(t, "cancelled", True)]
        assert pending == [], "a second dispatcher timer while one is pending"
        armed.append((when, handle))
        return handle

    monkeypatch.setattr(clock, "call_at", call_at)
    blockers = exhaust(d)
    started = clock.monotonic()
    granted_at: list[float] = []

    async def waiter() -> None:
        ticket = await d.acquire("metadata", 64 * KiB)
        granted_at.append(clock.monotonic())
        d.release(ticket)

    tasks = [asyncio.create_task(waiter()) for _ in range(5)]
    await settle()
    assert d.waiting == 5 and granted_at == []
    assert len(armed) == 1, "five waiters, one timer"
    # Nobody is granted before the server bucket is back out of its debt, and everyone once it is.
    due = armed[0][0]
    assert due >= started + REFILL_S * 0.95
    clock.advance(due - started - 1e-6)
    await settle()
    assert granted_at == []
    while not all(t.done() for t in tasks):
        next_at = clock.next_timer_at()
        assert next_at is not None, "waiters left with no timer armed for them"
        clock.advance(next_at - clock.monotonic())
        await settle()
    assert min(granted_at) >= started + REFILL_S * 0.95
    assert granted_at == sorted(granted_at)
    for t in blockers:
        d.release(t)
    assert_all_clear(d)


# -- time --------------------------------------------------------------------------------------------------


async def test_a_ticket_held_by_its_lanes_window_share_is_granted_when_reads_go_idle() -> None:
    # Nothing but time releases the held ticket here: the dispatcher must have a timer armed for it.
    d = make_dispatcher(inflight_bytes_max=MiB, read_idle_s=0.05)
    started = clock_of(d).monotonic()
    # Reads become active: a read-protected lane asked for 1 % of C over read_active_s (100 kB).
    d.release(acquire_now(d, "dataset", 128 * KiB))
    assert d.scheduler.snapshot(started).reads_active
    # While reads are active, checkpoint may hold only 30 % of the 1 MiB window beyond its first ticket
    # (say one upload's chunk in flight while another upload asks for its next).
    first = acquire_now(d, "checkpoint", 64 * KiB)
    try:
        task = asyncio.create_task(d.acquire("checkpoint", 256 * KiB))
        await settle()
        assert d.waiting == 1, "held back by the lane's window share"
        # Reads go idle 50 ms later, which lifts the share; the held ticket is then granted.
        d.release(await asyncio.wait_for(task, 5.0))
        assert clock_of(d).monotonic() - started >= 0.05 - 1e-9, "granted only once reads went idle"
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


class _RecordingSocket:
    def __init__(self) -> None:
        self.rcvbuf: list[int] = []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        assert (level, option) == (socket.SOL_SOCKET, socket.SO_RCVBUF)
        self.rcvbuf.append(value)


class _Transport(asyncio.BaseTransport):
    def __init__(self, sock: object) -> None:
        super().__init__()
        self._sock = sock

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default


async def test_a_paced_upload_narrows_its_connections_receive_buffer_until_closed() -> None:
    # In front of a 10 MB/s store the checkpoint lane moves 64 KiB pieces: the client's connection keeps
    # that much in the gateway's kernel while the body is paced, then gets a wide buffer back.
    d = make_dispatcher()
    sock = _RecordingSocket()
    budget = StreamBudget(d, "checkpoint", CHUNK, 4 * CHUNK)
    budget.narrow_receive_buffer(_Transport(sock))
    assert sock.rcvbuf == [PACED_RECEIVE_BUFFER_PIECES * budget.piece_bytes]
    assert budget.piece_bytes == 64 * KiB
    await budget.take(CHUNK)
    budget.close()
    budget.close()
    assert sock.rcvbuf == [PACED_RECEIVE_BUFFER_PIECES * 64 * KiB, RESTORED_RECEIVE_BUFFER_BYTES]
    # Whole chunks (a read-protected lane, or a store fast enough for them): the buffer is left alone.
    other = _RecordingSocket()
    fast = StreamBudget(d, "dataset", CHUNK, 4 * CHUNK)
    fast.narrow_receive_buffer(_Transport(other))
    fast.narrow_receive_buffer(None)
    fast.close()
    assert other.rcvbuf == []
    assert_all_clear(d)
