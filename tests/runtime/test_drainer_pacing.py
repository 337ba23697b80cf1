"""The drainer hands a spool file to the backend connection in pieces no larger than one scheduler chunk.

A paced lane's burst at the backend's bottleneck is what one piece puts into the socket at once, so a
``[scheduler] chunk_bytes`` of 256 KiB must give 256 KiB pieces, each granted before it is read. The spool
and the lane dispatcher here are real (a :class:`~s3lanes.runtime.spool.Spool` on ``tmp_path`` and a
:class:`~s3lanes.runtime.dispatcher.LaneDispatcher` over a real scheduler); only the pool lookup is a stand-in
that returns that dispatcher, since no backend request is made. The drainer and the dispatcher share one
virtual clock (:class:`~s3lanes.clock.FakeClock`): the tests of a race move it by hand, so that no grant comes
while a socket is still being read; waits for sockets and threads are on the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import types
from pathlib import Path

import aiohttp
import pytest

from s3lanes.clock import FakeClock, SystemClock
from s3lanes.config import BackendConfig, SpoolConfig
from s3lanes.core.spool_state import Entry, Origin
from s3lanes.metrics import Metrics
from s3lanes.runtime.backend import TCP_NOTSENT_LOWAT
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.drainer import (
    READ_CHUNK_BYTES,
    Drainer,
    DrainError,
    SpoolFileBody,
    Superseded,
    close_body,
)
from s3lanes.runtime.spool import Spool
from tests.runtime.test_dispatcher import LANES, make_dispatcher
from tests.runtime.test_spool_shell import opened, put

KiB = 1024
MiB = 1024 * KiB
LOWAT = 64 * KiB  # [backend] notsent_lowat_bytes of the stand-in store


class OnePool:
    """What the drainer asks of :class:`~s3lanes.runtime.pools.Pools` when it only reads a file body."""

    def __init__(self, dispatcher: LaneDispatcher) -> None:
        self._dispatcher = dispatcher

    def dispatcher_for(self, bucket: str | None) -> LaneDispatcher:
        return self._dispatcher

    def backend_for(self, bucket: str | None) -> types.SimpleNamespace:
        return types.SimpleNamespace(cfg=BackendConfig(notsent_lowat_bytes=LOWAT))


def _drainer(
    spool: Spool,
    dispatcher: LaneDispatcher,
    chunk_bytes: int = MiB,
    *,
    zero_copy: bool = False,
    in_doubt_hold_s: float = 60.0,
) -> Drainer:
    return Drainer(
        spool,
        OnePool(dispatcher),  # type: ignore[arg-type]
        {},
        SpoolConfig(),
        dispatcher._clock,
        Metrics(),
        chunk_bytes=chunk_bytes,
        request_cost_bytes=0,
        lane_names=frozenset(LANES),
        zero_copy=zero_copy,
        in_doubt_hold_s=in_doubt_hold_s,
    )


@pytest.mark.parametrize("chunk_bytes", [64 * KiB, 256 * KiB, 4 * MiB])
async def test_a_spool_file_is_read_one_granted_chunk_at_a_time(tmp_path: Path, chunk_bytes: int) -> None:
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(capacity_bps=1e9, burst_bytes=max(chunk_bytes, MiB))
    data = os.urandom(3 * MiB + 12_345)
    try:
        await put(spool, "ckpt/shard-0", data)
        entry = spool.state.lookup("b", "ckpt/shard-0")
        assert entry is not None
        drainer = _drainer(spool, dispatcher, chunk_bytes)
        granted_before: list[int] = []
        pieces: list[bytes] = []
        async for piece in drainer._file_body(entry, entry.files[0], entry.size):
            # Every piece was granted before it was read: the lane has been charged at least this far.
            lane = dispatcher.scheduler.snapshot(dispatcher._clock.monotonic()).lane("checkpoint")
            granted_before.append(lane.granted_bytes_total)
            pieces.append(piece)
        assert b"".join(pieces) == data
        expected = min(chunk_bytes, READ_CHUNK_BYTES)
        assert max(len(p) for p in pieces) == expected
        assert all(len(p) == expected for p in pieces[:-1])
        charged = 0
        for piece, granted in zip(pieces, granted_before, strict=True):
            charged += len(piece)
            assert granted >= charged
    finally:
        dispatcher.close()
        await spool.close()


async def _spooled(spool: Spool, size: int) -> Entry:
    """One object of ``size`` random bytes put into the spool as key "k"; its entry."""
    await put(spool, "k", os.urandom(size))
    entry = spool.state.lookup("b", "k")
    assert entry is not None
    return entry


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_a_body_cut_short_closes_its_file_at_once(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(capacity_bps=1e9, burst_bytes=MiB)
    try:
        entry = await _spooled(spool, 3 * MiB)
        before = _open_fds()
        body = _drainer(spool, dispatcher)._file_body(entry, entry.files[0], entry.size)
        await body.__anext__()  # suspended at its first yield, the file open
        assert len(_open_fds() - before) == 1
        await close_body(body)
        assert _open_fds() - before == set()
    finally:
        dispatcher.close()
        await spool.close()


async def test_closing_a_body_that_another_task_is_running_is_left_to_that_task(tmp_path: Path) -> None:
    # The writer task of the HTTP client is inside the generator (here: waiting for its next grant, which
    # the exhausted window holds back) when the request ends; aclose() would raise "already running".
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(capacity_bps=1e9, burst_bytes=MiB, inflight_requests_max=1)
    try:
        entry = await _spooled(spool, 3 * MiB)
        before = _open_fds()
        body = _drainer(spool, dispatcher)._file_body(entry, entry.files[0], entry.size)
        await body.__anext__()  # holds the only in-flight ticket of the window
        blocker = asyncio.create_task(dispatcher.acquire("metadata", 1))  # queued behind it
        for _ in range(5):
            await asyncio.sleep(0)
        # The next piece completes the first ticket, which lets the queued one in; its own ticket waits.
        writer: asyncio.Future[bytes] = asyncio.ensure_future(body.__anext__())
        for _ in range(5):
            await asyncio.sleep(0)
        assert isinstance(body, types.AsyncGeneratorType)
        assert blocker.done() and body.ag_running and not writer.done()
        await close_body(body)  # no RuntimeError, and nothing closed under the running task
        assert len(_open_fds() - before) == 1
        writer.cancel()  # the request's end cancels the writer: its finally closes the file
        with pytest.raises(asyncio.CancelledError):
            await writer
        assert _open_fds() - before == set()
        dispatcher.release(blocker.result())
    finally:
        dispatcher.close()
        await spool.close()


class BodySink:
    """A loopback HTTP server that takes request bodies one after the other on a connection and answers 200
    to each. At every read it compares the body bytes received so far (all requests) with what the
    checkpoint lane had granted by then."""

    def __init__(self, dispatcher: LaneDispatcher) -> None:
        self._dispatcher = dispatcher
        self.bodies: list[bytes] = []
        self.cut_short = 0  # requests whose body ended before its Content-Length
        self.received = 0
        self.connections = 0
        self.ahead_of_grants = 0  # reads at which more had arrived than the lane had granted
        self.server: asyncio.Server | None = None

    def _granted(self) -> int:
        snap = self._dispatcher.scheduler.snapshot(self._dispatcher._clock.monotonic())
        return snap.lane("checkpoint").granted_bytes_total

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length: *(\d+)", head)
                assert match is not None, head
                length, body = int(match.group(1)), bytearray()
                while len(body) < length:
                    piece = await reader.read(min(65536, length - len(body)))
                    if not piece:
                        self.cut_short += 1
                        return
                    body += piece
                    self.received += len(piece)
                    self.ahead_of_grants += self.received > self._granted()
                self.bodies.append(bytes(body))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/b/k"


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "copied"])
async def test_a_file_body_reaches_the_connection_exactly_and_never_ahead_of_its_grants(
    tmp_path: Path, zero_copy: bool
) -> None:
    """Two bodies on one keep-alive connection, sent with sendfile or copied: the bytes are exact, the
    connection stays in step for the second request, no byte arrives before the lane granted it, and the
    zero-copy counter says which way they went."""
    spool = await opened(tmp_path)
    # The grants are waited for while bodies are on a socket: on the real clock (an autojumping one would
    # change how the writer and the answer interleave, and the connection's reuse depends on it).
    dispatcher = make_dispatcher(SystemClock(), capacity_bps=1e9, burst_bytes=256 * KiB)
    sink = BodySink(dispatcher)
    url = await sink.start()
    metrics = Metrics()
    try:
        data = os.urandom(3 * MiB + 777)
        await put(spool, "k", data)
        entry = spool.state.lookup("b", "k")
        assert entry is not None
        drainer = _drainer(spool, dispatcher, 256 * KiB, zero_copy=zero_copy)
        drainer._metrics = metrics
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            for _ in range(2):
                body = SpoolFileBody(drainer, entry, entry.files[0], entry.size, commits=False)
                async with session.put(url, data=body, headers={"content-length": str(entry.size)}) as resp:
                    assert resp.status == 200
        assert sink.bodies == [data, data]
        # The connection is reused when the body writer was done before the answer came; under load the
        # answer can come first (aiohttp then cancels the writer and closes the connection): at most one
        # new connection per body, never a body sent twice or short (checked above).
        assert sink.connections in (1, 2), sink.connections
        assert sink.ahead_of_grants == 0
        assert metrics.zero_copy_bytes.labels("checkpoint")._value.get() == (
            2 * len(data) if zero_copy else 0
        )
        assert metrics.bytes.labels("checkpoint", "up")._value.get() == 2 * len(data)
    finally:
        assert sink.server is not None
        sink.server.close()
        dispatcher.close()
        await spool.close()


async def test_sendfile_bytes_are_counted_when_the_answer_cancels_the_writer_after_the_last_call(
    tmp_path: Path,
) -> None:
    """The HTTP client cancels a request's body writer as soon as the store's answer is in, which may come
    while the writer waits for the thread of its last ``sendfile`` call. Those bytes went out (the store
    answered because it had them all): the counters say so, and the file is closed as wholly sent."""
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(SystemClock(), capacity_bps=1e9, burst_bytes=256 * KiB)
    data = os.urandom(MiB + 777)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    received = bytearray()
    try:
        await put(spool, "k", data)
        entry = spool.state.lookup("b", "k")
        assert entry is not None
        drainer = _drainer(spool, dispatcher, 256 * KiB, zero_copy=True)
        real_run_read_io = spool.run_read_io
        writer: asyncio.Task[None] | None = None

        loop = asyncio.get_running_loop()

        def sendfile_then_the_answer(out_fd: int, in_fd: int, offset: int, count: int) -> int:
            sent = os.sendfile(out_fd, in_fd, offset, count)
            if offset + sent >= len(data):  # all out: the answer is in before the writer resumes
                assert writer is not None
                loop.call_soon_threadsafe(writer.cancel)
            return sent

        async def answer_arrives_during_the_last_call(fn: object, *args: object) -> object:
            if fn is os.sendfile:
                fn = sendfile_then_the_answer
            return await real_run_read_io(fn, *args)  # type: ignore[arg-type]

        spool.run_read_io = answer_arrives_during_the_last_call  # type: ignore[assignment,method-assign]

        def read_all() -> None:
            while len(received) < len(data) and (chunk := theirs.recv(MiB)):
                received.extend(chunk)

        reader = asyncio.ensure_future(asyncio.to_thread(read_all))
        writer = asyncio.ensure_future(
            drainer._send_file_body(ours.fileno(), entry, entry.files[0], entry.size, False)
        )
        with pytest.raises(asyncio.CancelledError):
            await writer
        await asyncio.wait_for(reader, 10)
        assert bytes(received) == data
        metrics = drainer._metrics
        assert metrics.zero_copy_bytes.labels("checkpoint")._value.get() == len(data)
        assert metrics.bytes.labels("checkpoint", "up")._value.get() == len(data)
    finally:
        ours.close()
        theirs.close()
        dispatcher.close()
        await spool.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "copied"])
async def test_a_superseded_put_whose_last_piece_is_granted_as_it_is_cancelled_never_completes(
    tmp_path: Path, zero_copy: bool
) -> None:
    """The race the HTTP fuzzer found: a drain PUT waits for the grant of its last piece; in one event-loop
    step the grant comes in and a DELETE of the key supersedes the entry (the drain task is cancelled). The
    body is written by the HTTP client's own writer task, which is runnable before the cancelled request
    has unwound: it must stop by itself, or the store gets the whole PUT and applies it after the DELETE.
    The store must see a body cut short, never a complete one."""
    spool = await opened(tmp_path)
    # A slow lane: the first piece drives the bucket into debt, the second waits for it to refill. Time
    # moves when the test says so.
    clock = FakeClock()
    dispatcher = make_dispatcher(clock, capacity_bps=2e6, burst_bytes=16 * KiB)
    sink = BodySink(dispatcher)
    url = await sink.start()
    try:
        drainer = _drainer(spool, dispatcher, 256 * KiB, zero_copy=zero_copy)
        step = min(READ_CHUNK_BYTES, dispatcher.scheduler.piece_bytes("checkpoint", 256 * KiB))
        data = os.urandom(step + 777)  # two pieces
        await put(spool, "k", data)
        entry = spool.state.lookup("b", "k")
        assert entry is not None
        before = _open_fds()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:

            async def drain_put() -> None:
                body = SpoolFileBody(drainer, entry, entry.files[0], entry.size, commits=True)
                async with session.put(url, data=body, headers={"content-length": str(entry.size)}) as r:
                    await r.read()

            spool.state.start_upload(entry)
            drainer._abortable.add(entry.seq)
            task = asyncio.create_task(drain_put())
            drainer._tasks[entry.seq] = task
            for _ in range(400):
                if sink.received >= step and dispatcher.waiting == 1:
                    break
                await asyncio.sleep(0.001)
            # The first piece is out; the writer waits for the grant of the second.
            assert sink.received == step and dispatcher.waiting == 1
            dispatcher._disarm()  # the grant comes when the test says so, not on the dispatcher's timer
            clock.advance(2 * step / 2e6 + 0.05)  # the bucket has refilled
            await asyncio.sleep(0.01)
            assert sink.received == step and dispatcher.waiting == 1
            dispatcher._pump()  # the grant: the writer is runnable ...
            assert dispatcher.waiting == 0
            applied = spool.state.apply(
                spool.state.delete_record(bucket="b", key="k", origin=Origin("AK", "checkpoint", 0.0))
            )
            assert applied.cancel == (entry.seq,) and entry.superseded
            drainer._cancel(entry.seq)  # ... and, in the same step, the DELETE supersedes the entry
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
            for _ in range(100):
                if sink.cut_short or sink.bodies:
                    break
                await asyncio.sleep(0.01)
        assert sink.bodies == []  # the store never got a whole PUT
        assert sink.cut_short == 1
        assert sink.received < len(data)
        for _ in range(100):
            if _open_fds() - before == set():
                break
            await asyncio.sleep(0.01)
        assert _open_fds() - before == set()  # the spool file was closed
    finally:
        assert sink.server is not None
        sink.server.close()
        dispatcher.close()
        await spool.close()


async def _superseded(spool: Spool, entry: Entry) -> None:
    """A DELETE of the entry's key is acknowledged while its upload is in flight."""
    applied = spool.state.apply(
        spool.state.delete_record(bucket="b", key="k", origin=Origin("AK", "checkpoint", 0.0))
    )
    assert applied.cancel == (entry.seq,) and entry.superseded


async def test_a_copied_put_body_never_hands_over_its_last_piece_once_superseded(tmp_path: Path) -> None:
    """The body itself refuses: whatever order the event loop runs the HTTP client's writer and the
    cancelled drain task in, the last piece of a superseded single PUT does not leave the spool."""
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(capacity_bps=1e9, burst_bytes=MiB)
    try:
        entry = await _spooled(spool, READ_CHUNK_BYTES + 777)
        drainer = _drainer(spool, dispatcher)
        spool.state.start_upload(entry)
        drainer._abortable.add(entry.seq)
        body = drainer._file_body(entry, entry.files[0], entry.size, commits=True)
        first = await body.__anext__()
        assert len(first) == READ_CHUNK_BYTES
        await _superseded(spool, entry)
        with pytest.raises(Superseded):
            await body.__anext__()
        assert entry.seq not in drainer._in_doubt  # cut short: the store cannot apply it
        # Once the last piece is handed over the upload is no longer cut: the store will apply it, and
        # the key stays blocked until it answers.
        entry2 = await _spooled(spool, 777)
        spool.state.start_upload(entry2)
        drainer._abortable.add(entry2.seq)
        body2 = drainer._file_body(entry2, entry2.files[0], entry2.size, commits=True)
        assert len(await body2.__anext__()) == 777
        assert entry2.seq not in drainer._abortable
        assert entry2.seq in drainer._in_doubt  # out whole, no answer yet
        await close_body(body2)
    finally:
        dispatcher.close()
        await spool.close()


async def test_a_sendfile_put_body_never_sends_its_last_piece_once_superseded(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    # A slow lane: the first piece drives the bucket into debt, the second waits for it to refill, which
    # comes when the test moves the clock.
    clock = FakeClock()
    dispatcher = make_dispatcher(clock, capacity_bps=4e6, burst_bytes=16 * KiB)
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        drainer = _drainer(spool, dispatcher, 256 * KiB, zero_copy=True)
        step = min(READ_CHUNK_BYTES, dispatcher.scheduler.piece_bytes("checkpoint", 256 * KiB))
        entry = await _spooled(spool, step + 777)
        spool.state.start_upload(entry)
        drainer._abortable.add(entry.seq)
        send = asyncio.create_task(
            drainer._send_file_body(a.fileno(), entry, entry.files[0], entry.size, commits=True)
        )
        got = bytearray()
        b.setblocking(False)
        for _ in range(400):
            with contextlib.suppress(BlockingIOError):
                got += b.recv(1 << 20)
            if len(got) >= step and dispatcher.waiting == 1:
                break
            await asyncio.sleep(0.001)
        assert len(got) == step and dispatcher.waiting == 1  # the second piece waits for its grant
        await _superseded(spool, entry)  # the drain task's cancel has not landed yet
        refilled_at = clock.next_timer_at()
        assert refilled_at is not None
        clock.advance(refilled_at - clock.monotonic())  # the grant of the second piece comes
        with pytest.raises(Superseded):
            await send
        with contextlib.suppress(BlockingIOError):
            got += b.recv(1 << 20)
        assert len(got) == step
    finally:
        a.close()
        b.close()
        dispatcher.close()
        await spool.close()


@pytest.mark.parametrize("in_doubt", [True, False], ids=["unanswered", "answered-or-never-sent"])
async def test_an_unanswered_completing_request_keeps_the_key_blocked_before_a_newer_write_drains(
    tmp_path: Path, in_doubt: bool
) -> None:
    """A drain whose completing request went out whole and got no answer may still be applied by the store:
    a DELETE acknowledged meanwhile must not be sent until the hold is over. A failure the store answered
    (or a request that never went out whole) releases the key at once."""
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(capacity_bps=1e9, burst_bytes=MiB)
    hold_s = 0.5
    try:
        entry = await _spooled(spool, 1000)
        drainer = _drainer(spool, dispatcher, in_doubt_hold_s=hold_s)

        clock = dispatcher._clock
        failed_at: list[float] = []

        async def upload(e: Entry) -> None:
            await clock.sleep(0.2)  # on the wire when the DELETE comes
            failed_at.append(clock.monotonic())
            if in_doubt:
                drainer._in_doubt.add(e.seq)  # the last byte went out ...
            raise DrainError("connection reset by the store")  # ... and no answer came

        drainer._upload = upload  # type: ignore[method-assign, assignment]
        spool.state.start_upload(entry)
        task = asyncio.create_task(drainer._drain(entry))
        await clock.sleep(0.05)
        await _superseded(spool, entry)  # a DELETE of the key is acknowledged
        tombstone = spool.state.lookup("b", "k")
        assert tombstone is not None and tombstone.kind == "del"
        started = clock.monotonic()
        while tombstone not in spool.state.drainable(clock.monotonic(), 10):
            assert clock.monotonic() - started < 5 * hold_s, "the key was never released"
            await clock.sleep(0.01)
        released_after = clock.monotonic() - failed_at[0]
        await task
        if in_doubt:
            assert hold_s <= released_after <= hold_s + 0.01 + 1e-9  # held exactly as long as said
        else:
            assert released_after <= 0.01 + 1e-9  # released at once (seen at the next look)
        assert entry.seq not in spool.state.entries  # the superseded entry is gone either way
    finally:
        dispatcher.close()
        await spool.close()


async def test_a_failed_drain_is_retried_when_its_hold_is_over_on_the_drainers_clock(tmp_path: Path) -> None:
    """The drain loop sleeps until the earliest retry is due (never a fixed poll): each retry of a failing
    upload starts when its backoff hold ends, on virtual time, and the data is drained once the store takes
    it. Thirty seconds of backoff take no wall-clock time."""
    clock = FakeClock(autojump=True)
    spool = await opened(tmp_path, clock=clock)
    dispatcher = make_dispatcher(clock, capacity_bps=1e9, burst_bytes=MiB)
    drainer = _drainer(spool, dispatcher)
    attempts_at: list[float] = []
    holds: list[float] = []
    real_backoff = drainer._backoff

    def backoff(attempts: int) -> float:
        holds.append(real_backoff(attempts))
        return holds[-1]

    async def upload(e: Entry) -> None:
        attempts_at.append(clock.monotonic())
        if len(attempts_at) < 6:
            raise DrainError("the store is down")

    drainer._backoff = backoff  # type: ignore[method-assign]
    drainer._upload = upload  # type: ignore[method-assign, assignment]
    try:
        await put(spool, "k", b"data")
        running = asyncio.create_task(drainer.run())
        spool.drain_wakeup.set()
        assert await asyncio.wait_for(spool.wait_empty(120.0), 10), "never drained"
        assert len(attempts_at) == 6 and drainer.uploads_failed == 5 and drainer.uploads_ok == 1
        for before, after, hold in zip(attempts_at, attempts_at[1:], holds, strict=False):
            assert hold <= after - before <= hold + 0.01  # retried as the hold ends, not a poll later
        assert attempts_at[-1] - attempts_at[0] >= 0.25 + 0.5 + 1 + 2 + 4  # at least half of each backoff cap
    finally:
        await drainer.close()
        await asyncio.gather(running, return_exceptions=True)
        dispatcher.close()
        await spool.close()


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "copied"])
@pytest.mark.parametrize("capped", [True, False], ids=["capped-for-reads", "uncapped"])
async def test_a_drain_body_bounds_its_connections_unsent_bytes_while_its_lane_is_capped_for_reads(
    tmp_path: Path, zero_copy: bool, capped: bool
) -> None:
    """On a real TCP connection: while the lane is capped for the reads' sake (here by a cluster allowance
    that is a share of the reads' cap) the socket holds at most ``notsent_lowat_bytes`` of the body unsent;
    the bound is lifted once the body is out, before the connection could serve anything else."""
    spool = await opened(tmp_path)
    dispatcher = make_dispatcher(SystemClock(), capacity_bps=1e9, burst_bytes=256 * KiB)
    if capped:
        dispatcher.scheduler.set_external_limit("checkpoint", 5e8, SystemClock().monotonic(), for_reads=True)
    data = os.urandom(2 * MiB + 777)
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    ours = socket.create_connection(lst.getsockname())
    theirs, _ = lst.accept()
    lst.close()
    ours.setblocking(False)
    received = bytearray()
    seen: list[int] = []  # the sender's bound, as the peer saw it while the body arrived
    try:
        await put(spool, "k", data)
        entry = spool.state.lookup("b", "k")
        assert entry is not None
        drainer = _drainer(spool, dispatcher, 256 * KiB, zero_copy=zero_copy)

        def read_all() -> None:
            while len(received) < len(data) and (chunk := theirs.recv(64 * KiB)):
                received.extend(chunk)
                seen.append(ours.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT))

        reader = asyncio.ensure_future(asyncio.to_thread(read_all))
        if zero_copy:
            await drainer._send_file_body(ours.fileno(), entry, entry.files[0], entry.size, False, sock=ours)
        else:
            loop = asyncio.get_running_loop()
            body = drainer._file_body(entry, entry.files[0], entry.size, sock=ours)
            async with contextlib.aclosing(body):
                async for piece in body:
                    await loop.sock_sendall(ours, piece)
        await asyncio.wait_for(reader, 10)
        assert bytes(received) == data
        if capped:
            assert LOWAT in seen, seen
        else:
            assert LOWAT not in seen, seen
        assert ours.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT) != LOWAT  # lifted once out
    finally:
        ours.close()
        theirs.close()
        dispatcher.close()
        await spool.close()
