"""The clocks the shells wait on: the real one over asyncio, the virtual one that tests run the shells on."""

from __future__ import annotations

import asyncio
import time

import pytest

from s3lanes.clock import FakeClock, SystemClock


async def test_timers_fire_in_order_with_the_clock_at_their_time_when_advanced() -> None:
    clock = FakeClock()
    t0 = clock.monotonic()
    seen: list[tuple[str, float]] = []
    clock.call_at(t0 + 2, lambda: seen.append(("b", clock.monotonic())))
    clock.call_at(t0 + 1, lambda: seen.append(("a", clock.monotonic())))
    cancelled = clock.call_at(t0 + 1.5, lambda: seen.append(("x", clock.monotonic())))
    cancelled.cancel()
    # A timer armed by a timer, inside the span advanced over, fires in the same advance.
    clock.call_at(t0 + 0.5, lambda: clock.call_at(clock.monotonic() + 1, lambda: seen.append(("c", 0.0))))
    clock.advance(1.9)
    assert seen == [("a", t0 + 1), ("c", 0.0)]
    assert clock.monotonic() == t0 + 1.9 and clock.next_timer_at() == t0 + 2
    clock.advance(0.1)
    assert seen[-1] == ("b", t0 + 2)
    assert clock.next_timer_at() is None
    with pytest.raises(ValueError):
        clock.advance(-1)


async def test_a_timer_already_due_runs_on_the_next_loop_iteration() -> None:
    clock = FakeClock()
    fired: list[float] = []
    clock.call_at(clock.monotonic() - 5, lambda: fired.append(clock.monotonic()))
    assert fired == []
    await asyncio.sleep(0)
    assert fired == [clock.monotonic()]


async def test_without_autojump_a_sleep_waits_for_the_test_to_advance() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(30))
    await asyncio.sleep(0)
    clock.advance(29.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    await asyncio.wait_for(task, 5)


async def test_autojump_moves_to_the_next_timer_once_every_task_is_blocked_on_the_clock() -> None:
    clock = FakeClock(autojump=True)
    t0 = clock.monotonic()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic() - t0))

    started = time.monotonic()
    sleepers = (sleeper("long", 3600), sleeper("short", 60), sleeper("mid", 600))
    await asyncio.wait_for(asyncio.gather(*sleepers), 5)
    assert time.monotonic() - started < 2  # an hour of virtual time, in far less on the wall clock
    assert woke == [("short", 60), ("mid", 600), ("long", 3600)]
    assert clock.jumps == 3
    assert clock.next_timer_at() is None


async def test_autojump_does_not_jump_while_a_task_is_still_running() -> None:
    clock = FakeClock(autojump=True)
    t0 = clock.monotonic()
    steps = 0

    async def busy() -> None:
        nonlocal steps
        for _ in range(200):  # runnable at every iteration: the loop is never idle meanwhile
            steps += 1
            await asyncio.sleep(0)
        assert clock.monotonic() == t0, "time jumped while a task could still run"

    sleeper = asyncio.create_task(clock.sleep(10))
    await busy()
    await asyncio.wait_for(sleeper, 5)
    assert clock.monotonic() == t0 + 10 and steps == 200


async def test_fake_wait_for_returns_the_result_in_time_and_cancels_on_timeout() -> None:
    clock = FakeClock(autojump=True)
    t0 = clock.monotonic()

    async def answer(after_s: float) -> str:
        await clock.sleep(after_s)
        return "done"

    assert await clock.wait_for(answer(5), 10) == "done"
    assert clock.monotonic() == t0 + 5
    slow = asyncio.ensure_future(answer(50))
    with pytest.raises(TimeoutError):
        await clock.wait_for(slow, 10)
    assert slow.cancelled() and clock.monotonic() == t0 + 15
    assert await clock.wait_for(answer(1), None) == "done"
    with pytest.raises(TimeoutError):
        await clock.wait_for(answer(1), 0)
    assert clock.next_timer_at() is None


async def test_the_system_clock_sleeps_arms_timers_and_bounds_waits_on_real_time() -> None:
    clock = SystemClock()
    loop = asyncio.get_running_loop()
    fired = loop.create_future()
    started = clock.monotonic()
    clock.call_at(started + 0.02, lambda: fired.set_result(clock.monotonic()))
    assert await asyncio.wait_for(fired, 5) >= started + 0.02
    await clock.sleep(0.001)
    with pytest.raises(TimeoutError):
        await clock.wait_for(asyncio.Event().wait(), 0.01)
    assert await clock.wait_for(asyncio.sleep(0, "ok"), 5) == "ok"
