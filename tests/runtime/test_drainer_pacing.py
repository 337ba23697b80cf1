"""The drainer hands a spool file to the backend connection in pieces no larger than one scheduler chunk.

A paced lane's burst at the backend's bottleneck is what one piece puts into the socket at once, so a
``[scheduler] chunk_bytes`` of 256 KiB must give 256 KiB pieces, each granted before it is read. The spool
and the lane dispatcher here are real (a :class:`~gateway.runtime.spool.Spool` on ``tmp_path`` and a
:class:`~gateway.runtime.dispatcher.LaneDispatcher` over a real scheduler); only the pool lookup is a stand-in
that returns that dispatcher, since no backend request is made.
"""

from __future__ import annotations

import asyncio
import os
import types
from pathlib import Path

import pytest

from gateway.clock import SystemClock
from gateway.config import SpoolConfig
from gateway.core.spool_state import Entry
from gateway.metrics import Metrics
from gateway.runtime.dispatcher import LaneDispatcher
from gateway.runtime.drainer import READ_CHUNK_BYTES, Drainer, close_body
from gateway.runtime.spool import Spool
from tests.runtime.test_dispatcher import LANES, make_dispatcher
from tests.runtime.test_spool_shell import opened, put

KiB = 1024
MiB = 1024 * KiB


class OnePool:
    """What the drainer asks of :class:`~gateway.runtime.pools.Pools` when it only reads a file body."""

    def __init__(self, dispatcher: LaneDispatcher) -> None:
        self._dispatcher = dispatcher

    def dispatcher_for(self, bucket: str | None) -> LaneDispatcher:
        return self._dispatcher


def _drainer(spool: Spool, dispatcher: LaneDispatcher, chunk_bytes: int = MiB) -> Drainer:
    return Drainer(
        spool,
        OnePool(dispatcher),  # type: ignore[arg-type]
        {},
        SpoolConfig(),
        SystemClock(),
        Metrics(),
        chunk_bytes=chunk_bytes,
        request_cost_bytes=0,
        lane_names=frozenset(LANES),
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
            lane = dispatcher.scheduler.snapshot(asyncio.get_running_loop().time()).lane("checkpoint")
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
