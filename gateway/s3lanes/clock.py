"""Time as a parameter.

Cores never read the clock: their time-dependent methods take ``now``. The async shells own one
:class:`Clock` and wait on it too: they sleep, arm timers and bound waits through it (never through
``asyncio.sleep``, ``loop.call_at`` or ``asyncio.wait_for`` directly), so that a test can run them on virtual
time. Waits bounded by I/O (a socket's read timeout, a Redis call) are not the gateway's own timers and stay
on the event loop's clock.

:class:`SystemClock` is the real thing: asyncio's own sleep, timers and ``wait_for``. :class:`FakeClock` is
virtual time for tests and simulations. It moves when told to (:meth:`FakeClock.advance`, which fires the
timers that fall due on the way, in order) or, with ``autojump=True``, by itself: when the event loop has
nothing left to run, it jumps to its earliest pending timer, as trio's ``MockClock(autojump_threshold=0)``
does. A test of a 30 s retry hold then takes milliseconds and no bound on the wall clock is involved.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    """A callback armed with :meth:`Clock.call_at`; ``asyncio.TimerHandle`` is one."""

    def cancel(self) -> None:
        """Disarm: the callback will not run (a no-op once it has run)."""


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale, for deadlines and rates."""

    def wall(self) -> float:
        """Seconds since the Unix epoch, for SigV4 dates and expiry."""

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` on this clock."""

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` on the event loop once :meth:`monotonic` reaches ``when`` (at once if it has)."""

    async def wait_for(self, aw: Awaitable[T], timeout_s: float | None) -> T:
        """``asyncio.wait_for`` on this clock: ``aw``'s result, or ``TimeoutError`` (``aw`` cancelled) once
        ``timeout_s`` has passed; ``None`` waits without a bound."""


class SystemClock:
    """The real clock: ``time.monotonic``/``time.time`` and the running event loop's own timers."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        # The loop's time is not necessarily time.monotonic() (uvloop keeps its own): arm by the delay.
        return asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), callback)

    async def wait_for(self, aw: Awaitable[T], timeout_s: float | None) -> T:
        return await asyncio.wait_for(aw, timeout_s)


class _FakeTimer:
    __slots__ = ("callback", "cancelled", "seq", "when")

    def __init__(self, when: float, seq: int, callback: Callable[[], object]) -> None:
        self.when = when
        self.seq = seq
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _FakeTimer) -> bool:
        return (self.when, self.seq) < (other.when, other.seq)


# How many event-loop iterations in a row must find nothing ready to run before an autojump. Two would do
# on asyncio's own loop (the second one follows a poll of the selector); one more for good measure.
_IDLE_ITERATIONS = 3
# On a loop whose ready queue cannot be seen (uvloop), the number of iterations to let pass instead.
_BLIND_ITERATIONS = 20


class FakeClock:
    """Virtual time: moves only when told to (:meth:`advance`) or, with ``autojump``, when the event loop is
    idle. Not thread-safe; meant for tests and simulations.

    Timers (:meth:`call_at`, and the :meth:`sleep` and :meth:`wait_for` built on them) fire inside
    :meth:`advance`, in the order of their times, with the clock reading each one's time as it runs.

    ``autojump``: a helper task on the running loop watches for idleness, meaning nothing runnable for a few
    loop iterations in a row (asyncio's ready queue is looked at; on a loop that hides it, a fixed number of
    iterations passes instead), and then advances to the earliest pending timer. The helper runs only while
    a timer is pending. It is *not* a wait for threads or sockets: a task blocked on a thread or on I/O
    counts as idle, so time may jump past a virtual timeout meanwhile. Bound such waits on the event loop's
    own clock (``asyncio.wait_for``), which this class does not touch. A test must stop the periodic tasks it
    starts (a loop that re-arms a timer forever keeps the helper jumping).
    """

    def __init__(
        self, start_monotonic: float = 1000.0, start_wall: float = 1_700_000_000.0, *, autojump: bool = False
    ) -> None:
        self._mono = start_monotonic
        self._wall = start_wall
        self._timers: list[_FakeTimer] = []
        self._seq = itertools.count()
        self._autojump = autojump
        self.jumps = 0  # how many times autojump moved the clock

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that falls due on the way."""
        if seconds < 0:
            raise ValueError("a clock does not run backwards")
        target = self._mono + seconds
        while self._timers and self._timers[0].when <= target:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._move_to(max(self._mono, timer.when))
            timer.cancelled = True  # fired: a later cancel() is a no-op
            timer.callback()
        self._move_to(target)

    def _move_to(self, mono: float) -> None:
        self._wall += mono - self._mono
        self._mono = mono

    def next_timer_at(self) -> float | None:
        """When the earliest pending timer is due; None if none is."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None

    # -- waiting on virtual time --------------------------------------------------------------------------

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        timer = _FakeTimer(when, next(self._seq), callback)
        if when <= self._mono:
            # Due already: run it on the loop's next iteration, as asyncio does with a past deadline.
            asyncio.get_running_loop().call_soon(self._fire, timer)
            return timer
        heapq.heappush(self._timers, timer)
        if self._autojump:
            _watch(asyncio.get_running_loop(), self)
        return timer

    @staticmethod
    def _fire(timer: _FakeTimer) -> None:
        if not timer.cancelled:
            timer.cancelled = True
            timer.callback()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_at(self._mono + seconds, wake)
        try:
            await fut
        finally:
            timer.cancel()

    async def wait_for(self, aw: Awaitable[T], timeout_s: float | None) -> T:
        if timeout_s is None:
            return await aw
        inner = asyncio.ensure_future(aw)
        if timeout_s <= 0 and not inner.done():
            return await _cancel_for_timeout(inner)
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not settled.done():
                settled.set_result(None)

        inner.add_done_callback(wake)
        timer = self.call_at(self._mono + timeout_s, wake)
        try:
            await settled
        except BaseException:
            # Cancelled from outside: cancel what we wait for, let it unwind, and pass the cancel on.
            timer.cancel()
            inner.remove_done_callback(wake)
            inner.cancel()
            await asyncio.gather(inner, return_exceptions=True)
            raise
        timer.cancel()
        if inner.done():
            return inner.result()
        return await _cancel_for_timeout(inner)

    def _jump(self) -> None:
        """Advance to the earliest pending timer (autojump, on an idle loop)."""
        at = self.next_timer_at()
        if at is None:
            return
        if at > self._mono:
            self.jumps += 1
        self.advance(max(0.0, at - self._mono))


# The autojump clocks of each event loop, and the one helper task per loop that watches for idleness: one,
# not one per clock, since each helper would keep the loop busy in the eyes of the others.
_AUTOJUMP_CLOCKS: dict[asyncio.AbstractEventLoop, set[FakeClock]] = {}
_AUTOJUMP_HELPERS: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}


def _watch(loop: asyncio.AbstractEventLoop, clock: FakeClock) -> None:
    _AUTOJUMP_CLOCKS.setdefault(loop, set()).add(clock)
    helper = _AUTOJUMP_HELPERS.get(loop)
    if helper is None or helper.done():
        _AUTOJUMP_HELPERS[loop] = loop.create_task(_autojump(loop), name="fake-clock-autojump")


async def _autojump(loop: asyncio.AbstractEventLoop) -> None:
    """While any autojump clock of ``loop`` has a timer pending: wait for the loop to be idle, then move
    each such clock to its earliest timer."""
    clocks = _AUTOJUMP_CLOCKS.setdefault(loop, set())
    try:
        while True:
            for clock in [c for c in clocks if c.next_timer_at() is None]:
                clocks.discard(clock)
            if not clocks:
                return
            await _loop_idle()
            for clock in list(clocks):
                try:
                    clock._jump()
                except Exception as exc:  # a timer's callback failed: report it as the loop does its own
                    loop.call_exception_handler(
                        {"message": "exception in a FakeClock timer callback", "exception": exc}
                    )
    finally:
        if _AUTOJUMP_HELPERS.get(loop) is asyncio.current_task():
            del _AUTOJUMP_HELPERS[loop]
            if not clocks:
                _AUTOJUMP_CLOCKS.pop(loop, None)


async def _cancel_for_timeout(inner: asyncio.Future[T]) -> T:
    inner.cancel()
    try:
        return await inner  # what it does once cancelled: a result that came in time stands
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the caller itself was cancelled meanwhile: that is not a timeout
        raise TimeoutError() from exc


async def _loop_idle() -> None:
    """Return once the running loop has had nothing ready to run (but this task) for a few iterations."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)  # asyncio's ready queue; uvloop hides its own
    if ready is None:
        for _ in range(_BLIND_ITERATIONS):
            await asyncio.sleep(0)
        return
    quiet = 0
    while quiet < _IDLE_ITERATIONS:
        await asyncio.sleep(0)
        quiet = quiet + 1 if not ready else 0
