"""The async shell around the pure lane scheduler: one timer, futures for waiters, cleanup on cancel.

Theory of operation: :class:`~s3lanes.core.scheduler.Scheduler` decides, this class carries out. A request
asks for budget with :meth:`LaneDispatcher.acquire` (a *ticket* for ``cost_bytes`` on its lane). The ticket is
submitted to the scheduler, which grants it in the same call when nothing is queued anywhere and the lane has
budget (:meth:`~s3lanes.core.scheduler.Scheduler.submit_fast`, the common case when the backend has room): the
caller then neither suspends nor gets a future. Otherwise the scheduler is pulled at once, and the caller
waits on a future that a later pull resolves. Pulls happen after every submit/complete/cancel and when the
single timer fires: the scheduler answers ``WaitUntil(t)`` and the dispatcher arms one ``clock.call_at`` for
the earliest such time (never one timer per waiter: aiolimiter #73's thundering herd).

A waiter that is cancelled (timeout, shutdown) or whose client went away (the ``gone`` check: aiohttp does
not cancel a handler whose client disconnects, and the gateway does not ask it to, since a cancellation
could land anywhere in a spool commit) removes its ticket; a granted ticket is always completed in a
``finally``, so in-flight accounting returns to zero whatever happens to the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from s3lanes.clock import Clock, Timer
from s3lanes.core.scheduler import Grant, Scheduler, WaitUntil

# How often a queued request checks that its client is still there.
ABANDON_POLL_S = 0.1


class LaneDispatcher:
    """Owns the scheduler on the event loop. Not thread-safe."""

    def __init__(self, scheduler: Scheduler, clock: Clock) -> None:
        self.scheduler = scheduler
        self._clock = clock
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._granted: set[int] = set()
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        self.fast_grants = 0  # tickets granted without a waiter (Scheduler.submit_fast)

    # -- budget -------------------------------------------------------------------------------------------

    async def acquire(self, lane: str, cost_bytes: int, *, gone: Callable[[], bool] | None = None) -> int:
        """Wait until ``cost_bytes`` of ``lane`` budget is granted; return the ticket to :meth:`release`.

        ``gone``: asked every :data:`ABANDON_POLL_S` while the ticket waits; once it says the client has gone
        away, the ticket leaves the queue at once and :class:`ConnectionResetError` is raised (a request
        nobody waits for must not hold its place in the lane, nor be granted budget later)."""
        now = self._clock.monotonic()
        ticket, granted = self.scheduler.submit_fast(lane, cost_bytes, now)
        if granted:
            # The fast path of an uncontended lane: nothing queued anywhere, budget at hand.
            self.fast_grants += 1
            self._granted.add(ticket)
            return ticket
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = fut
        self._pump()
        if not fut.done():
            try:
                if gone is None:
                    await fut
                else:
                    while not fut.done():
                        await self._poll(fut)
                        if not fut.done() and gone():
                            raise ConnectionResetError("the client went away while its request was queued")
            except BaseException:
                # Cancelled while waiting (or granted in the same instant): give everything back.
                self._waiters.pop(ticket, None)
                self._granted.discard(ticket)
                self.scheduler.cancel(ticket, self._clock.monotonic())
                self._pump()
                raise
        return ticket

    async def _poll(self, fut: asyncio.Future[None]) -> None:
        """Wait until ``fut`` is done or :data:`ABANDON_POLL_S` has passed on the clock, whichever is first.
        (``asyncio.wait``, not ``wait_for``: a cancellation that comes as ``fut`` completes is not lost.)"""
        tick: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def ring() -> None:
            if not tick.done():
                tick.set_result(None)

        timer = self._clock.call_at(self._clock.monotonic() + ABANDON_POLL_S, ring)
        try:
            await asyncio.wait((fut, tick), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()

    def release(self, ticket: int, bytes_done: int | None = None) -> None:
        """The granted work finished (or was abandoned): free its in-flight share."""
        if ticket in self._granted:
            self._granted.discard(ticket)
            self.scheduler.complete(ticket, self._clock.monotonic(), bytes_done=bytes_done)
            self._pump_for_waiters()

    @asynccontextmanager
    async def hold(self, lane: str, cost_bytes: int) -> AsyncIterator[int]:
        ticket = await self.acquire(lane, cost_bytes)
        try:
            yield ticket
        finally:
            self.release(ticket)

    # -- feedback -----------------------------------------------------------------------------------------

    def observe_read(self, lane: str, wait_s: float, ttfb_s: float) -> None:
        self.scheduler.observe_read(lane, wait_s, ttfb_s, self._clock.monotonic())

    def observe_backend(self, lane: str, status: int) -> None:
        self.scheduler.observe_backend(lane, status, self._clock.monotonic())
        self._pump_for_waiters()

    def observe_delivered(self, lane: str, nbytes: int) -> None:
        self.scheduler.observe_delivered(lane, nbytes, self._clock.monotonic())

    def wake(self) -> None:
        """Grant what the scheduler now allows, after a change made to it directly (a cluster allowance)."""
        self._pump()

    # -- the one timer ------------------------------------------------------------------------------------

    def _pump_for_waiters(self) -> None:
        """Pump after a completion or a backend answer, which can only grant a waiting ticket: with none
        waiting the scheduler has nothing queued (every submit has its waiter until granted or cancelled),
        its pull would answer Idle, and the per-request cost of two such pulls is saved. A timer armed
        earlier may still fire; it pumps then, which is harmless."""
        if self._waiters:
            self._pump()

    def _pump(self) -> None:
        now = self._clock.monotonic()
        while True:
            decision = self.scheduler.pull(now)
            if isinstance(decision, Grant):
                fut = self._waiters.pop(decision.ticket, None)
                if fut is None or fut.done():
                    # The waiter is gone (cancelled in the same tick): hand the budget straight back.
                    self.scheduler.cancel(decision.ticket, now)
                    continue
                self._granted.add(decision.ticket)
                fut.set_result(None)
                if not self._waiters:
                    # Nothing left queued (see _pump_for_waiters): the next pull would answer Idle.
                    self._disarm()
                    return
                continue
            if isinstance(decision, WaitUntil):
                self._arm(decision.at)
            else:
                self._disarm()
            return

    def _arm(self, at: float) -> None:
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            return
        self._disarm()
        self._timer_at = at
        self._timer = self._clock.call_at(at, self._on_timer)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._pump()

    def close(self) -> None:
        self._disarm()
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def in_flight(self) -> int:
        return len(self._granted)


# A paced upload's client connection keeps at most this many of its pieces in the gateway's kernel receive
# buffer (the kernel doubles the SO_RCVBUF asked for, for its bookkeeping): the body then waits on the
# client's side, where its socket shows it, instead of being taken in whole and paced out while the client
# waits for an answer (8 MiB parts at a progress floor of 192 KiB per 2 s kept botocore writers waiting 40
# s for an answer, with nothing moving on their connection).
PACED_RECEIVE_BUFFER_PIECES = 1
# What a connection's receive buffer is set back to once the paced body is in (autotuning stays off on a
# socket whose SO_RCVBUF was set; the kernel caps this at net.core.rmem_max).
RESTORED_RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024


class StreamBudget:
    """Charges one body stream to its lane, ``chunk_bytes`` at a time.

    ``take(n)`` returns once ``n`` more bytes are covered by granted budget. Grants are requested in chunks
    (the last one trimmed to what the stream still has to move when its length is known), so the
    scheduler sees about one ticket per MiB, not one per socket read. At most one chunk's ticket is held at
    a time: taking the next chunk completes the previous one, which keeps the backend in-flight accounting
    to what is really on the wire. :meth:`close` must run in a ``finally``.
    """

    __slots__ = (
        "_charged",
        "_chunk",
        "_credit",
        "_dispatcher",
        "_lane",
        "_paced",
        "_restore_rcvbuf",
        "_ticket",
        "_ticket_used",
        "_total",
    )

    def __init__(
        self, dispatcher: LaneDispatcher, lane: str, chunk_bytes: int, total_bytes: int | None
    ) -> None:
        self._dispatcher = dispatcher
        self._lane = lane
        self._chunk = dispatcher.scheduler.piece_bytes(lane, chunk_bytes)
        self._paced = self._chunk < chunk_bytes
        self._restore_rcvbuf: socket.socket | None = None
        self._total = total_bytes
        self._charged = 0
        self._credit = 0
        self._ticket: int | None = None
        self._ticket_used = 0

    @property
    def piece_bytes(self) -> int:
        """The size of the tickets this stream asks for: ``chunk_bytes``, or less on a paced lane in front
        of a slow store (:meth:`Scheduler.piece_bytes`). A body sent in pieces of at most this size is on
        the wire no sooner than granted, and no piece is more than the lane's latency allowance."""
        return self._chunk

    def narrow_receive_buffer(self, transport: asyncio.BaseTransport | None) -> None:
        """On a paced lane (pieces cut smaller than the chunk), shrink the receive buffer of the client
        connection whose body this stream moves to :data:`PACED_RECEIVE_BUFFER_PIECES` pieces, until
        :meth:`close`: the client's body then moves as the lane is granted, in short pauses, and its answer
        comes soon after its last byte. Anything else (a fast store, no socket): nothing."""
        if not self._paced or transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is None:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PACED_RECEIVE_BUFFER_PIECES * self._chunk)
        except OSError:  # pragma: no cover - a socket type without the option
            return
        self._restore_rcvbuf = sock

    async def take(self, nbytes: int) -> None:
        while self._credit < nbytes:
            size = self._chunk
            if self._total is not None:
                size = min(size, max(self._total - self._charged, nbytes - self._credit))
            size = max(size, 1)
            self._finish_ticket()
            self._ticket = await self._dispatcher.acquire(self._lane, size)
            # The credit left from earlier tickets is spent first: only the rest comes out of this one.
            self._ticket_used = -self._credit
            self._charged += size
            self._credit += size
        self._credit -= nbytes
        self._ticket_used += nbytes
        self._dispatcher.observe_delivered(self._lane, nbytes)

    def _finish_ticket(self) -> None:
        if self._ticket is not None:
            self._dispatcher.release(self._ticket)
            self._ticket = None

    def close(self) -> None:
        if self._ticket is not None:
            # Report what the last chunk really moved so unused budget is not counted as sent.
            self._dispatcher.release(self._ticket, bytes_done=self._ticket_used)
            self._ticket = None
        sock, self._restore_rcvbuf = self._restore_rcvbuf, None
        if sock is not None:
            with contextlib.suppress(OSError):  # the connection may be gone
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RESTORED_RECEIVE_BUFFER_BYTES)
