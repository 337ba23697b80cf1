"""Disk faults inside the spool: fsync and fdatasync failing with EIO, the journal running out of space.

Such faults cannot be produced on demand on a real disk without a fault-injecting block device, so they are
injected here, in-process, by replacing the ``os`` function the spool's I/O thread calls, for the one file
descriptor the fault is about (a data file, the data directory, the journal). The spool itself is real: a
:class:`~s3lanes.runtime.spool.Spool` on ``tmp_path`` driven by the test's event loop, reopened to see what a
restart finds. Writes go through ``test_spool_shell.put``, which does what ``s3lanes.http.spool_front``
does for a PUT: stream into a writer, commit its record, and discard the data file if either step fails
(except after a failed journal append; the client is answered 503 and nothing is acknowledged).

The contract (docs/spool.md, "When the spool is full" and "Crash safety"): the write that hit the fault is not
acknowledged and leaves nothing; a data file's failure is that write's problem only; a journal failure takes
the spool out of service for new writes (``degraded``); nothing acknowledged is ever lost, across a restart
included. ``tests/runtime/test_spool_shell.py`` covers ENOSPC on a data file and a failed journal fdatasync
of a new key; these add the fsync of a data file, the fsync of the data directory, an ENOSPC that tears the
journal mid-frame, and a failed fdatasync under an overwrite of an acknowledged key.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import s3lanes.runtime.spool.disk as spool_module
from s3lanes.clock import FakeClock, SystemClock
from s3lanes.runtime.spool import HEAL_INTERVAL_S, Spool, SpoolWriteFailed
from tests.runtime.test_spool_shell import CFG, opened, put


def stored(spool: Spool, key: str) -> bytes | None:
    """The bytes the spool holds for ``key`` (None if it holds no entry)."""
    entry = spool.state.lookup("b", key)
    if entry is None:
        return None
    return b"".join(spool.file_path(f).read_bytes() for f in entry.files)


async def finished_as(spool: Spool, writer: Any, data: bytes) -> None:
    """``writer`` finishes with the MD5 of ``data``, and its file holds exactly ``data``."""
    assert await writer.finish() == hashlib.md5(data).hexdigest()
    assert writer.size == len(data)
    assert spool.file_path(writer.file_id).read_bytes() == data


def file_size(path: str) -> int:
    return os.stat(path).st_size


def failing_for(path_test: Callable[[str], bool], real: Callable[[int], None]) -> Callable[[int], None]:
    """An ``os.fsync``/``os.fdatasync`` failing with EIO for descriptors whose path passes ``path_test``."""

    def fake(fd: int) -> None:
        if path_test(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    return fake


async def test_a_failed_fsync_of_a_data_file_fails_that_write_only_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    data_dir = str(tmp_path / "data")
    try:
        before = os.urandom(3000)
        await put(spool, "before", before)
        monkeypatch.setattr(os, "fsync", failing_for(lambda p: p.startswith(data_dir + "/"), os.fsync))
        with pytest.raises(SpoolWriteFailed) as exc:
            await put(spool, "hit", os.urandom(300_000))
        assert exc.value.status == 503
        monkeypatch.undo()
        assert spool.degraded is None  # the data file was dropped; the journal is fine
        assert spool.state.lookup("b", "hit") is None
        assert len(os.listdir(data_dir)) == 1  # only "before": the failed file is gone
        after = os.urandom(2000)
        await put(spool, "after", after)
    finally:
        await spool.close()
    again = await opened(tmp_path)
    try:
        assert (stored(again, "before"), stored(again, "hit"), stored(again, "after")) == (
            before,
            None,
            after,
        )
        assert again.recovery is not None and again.recovery.lost_entries == []
    finally:
        await again.close()


async def test_a_failed_fsync_of_the_data_directory_takes_the_spool_out_of_service_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    data_dir = str(tmp_path / "data")
    try:
        before = os.urandom(3000)
        await put(spool, "before", before)
        monkeypatch.setattr(os, "fsync", failing_for(lambda p: p == data_dir, os.fsync))
        with pytest.raises(SpoolWriteFailed):
            await put(spool, "hit", os.urandom(5000))
        monkeypatch.undo()
        assert spool.degraded is not None and "journal" in spool.degraded
        assert spool.state.lookup("b", "hit") is None
        with pytest.raises(SpoolWriteFailed):  # out of service: the front sends writes to the backend
            await put(spool, "later", b"x")
        assert stored(spool, "before") == before
    finally:
        await spool.close()
    again = await opened(tmp_path)
    try:
        assert again.degraded is None  # a restart puts it back in service
        assert (stored(again, "before"), stored(again, "hit"), stored(again, "later")) == (before, None, None)
        assert again.recovery is not None and again.recovery.lost_entries == []
        await put(again, "after-restart", b"ok")
    finally:
        await again.close()


async def test_a_journal_append_cut_by_enospc_is_truncated_back_and_the_spool_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk during the journal append: the kernel takes part of the frame, then ENOSPC. The spool
    truncates the journal back to its last good length at once (no half frame is left for a restart to
    find), goes out of service, and, once the disk takes writes again, rewrites its journal and is back in
    service by itself."""
    clock = FakeClock()
    spool = await opened(tmp_path, clock=clock)
    journal = str(tmp_path / "journal")
    real_write = os.write

    def short_then_full(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != journal:
            return real_write(fd, data)
        if len(data) > 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        before = os.urandom(3000)
        await put(spool, "before", before)
        size_before = file_size(journal)
        monkeypatch.setattr(os, "write", short_then_full)
        with pytest.raises(SpoolWriteFailed):
            await put(spool, "hit", os.urandom(5000))
        monkeypatch.undo()
        assert spool.degraded is not None and "No space left" in spool.degraded
        assert file_size(journal) == size_before  # the half frame was cut off again
        with pytest.raises(SpoolWriteFailed):
            await put(spool, "while-out", b"x")
        # The heal loop tries again every HEAL_INTERVAL_S on the spool's clock; the rewrite is thread work.
        assert clock.next_timer_at() == clock.monotonic() + HEAL_INTERVAL_S
        clock.advance(HEAL_INTERVAL_S)
        for _ in range(500):
            if spool.degraded is None:
                break
            await asyncio.sleep(0.01)
        assert spool.degraded is None, "the spool did not come back into service by itself"
        after = os.urandom(2000)
        await put(spool, "after", after)
    finally:
        await spool.close()
    again = await opened(tmp_path)
    try:
        assert again.recovery is not None and again.recovery.torn_bytes == 0
        assert stored(again, "after") == after
        assert (stored(again, "before"), stored(again, "hit")) == (before, None)
        assert again.recovery.lost_entries == []
    finally:
        await again.close()


async def test_a_failed_journal_fdatasync_under_an_overwrite_never_costs_the_acknowledged_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 of a key is acknowledged (and not yet drained). The append of v2's record reaches the file, but
    its fdatasync fails: v2 is answered 503 (not acknowledged). What a restart finds must still include v1,
    byte for byte: the client was told v1 is durable and was never told v2 replaced it. (The spool cuts
    v2's record off the journal; were that to fail, v2's data file is kept, so a surviving record would
    find its data rather than replace v1 with nothing.)"""
    spool = await opened(tmp_path)
    v1 = os.urandom(4000)
    try:
        await put(spool, "k", v1)
        monkeypatch.setattr(os, "fdatasync", failing_for(lambda p: True, os.fdatasync))
        with pytest.raises(SpoolWriteFailed):
            await put(spool, "k", os.urandom(4000))
        monkeypatch.undo()
        assert spool.degraded is not None
        assert stored(spool, "k") == v1  # what the running gateway serves and drains
    finally:
        await spool.close()
    again = await opened(tmp_path)
    try:
        assert again.recovery is not None
        got = stored(again, "k")
        assert got is not None and hashlib.sha256(got).digest() == hashlib.sha256(v1).digest(), (
            f"the acknowledged v1 is gone after the restart: {again.recovery.summary()}"
        )
        assert again.recovery.lost_entries == [], again.recovery.summary()
    finally:
        await again.close()


async def test_pieces_written_while_the_next_arrive_keep_their_order_and_md5(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    try:
        data = os.urandom(3 * 1024 * 1024 + 4321)
        writer = spool.writer(len(data))
        await writer.open()
        offset, step = 0, 1
        while offset < len(data):  # pieces of every size from 1 byte to ~100 KiB
            await writer.write(data[offset : offset + step])
            offset += step
            step = step * 3 % 100_003 + 1
        await finished_as(spool, writer, data)
    finally:
        await spool.close()


async def test_discarding_a_writer_waits_for_its_piece_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = spool_module._write_piece
    events: list[str] = []

    def slow_write(fd: int, piece: Any, nbytes: int, offset: int) -> None:
        events.append("write started")
        time.sleep(0.2)
        real(fd, piece, nbytes, offset)
        events.append("write done")

    real_close = os.close

    def watched_close(fd: int) -> None:
        events.append("close")
        real_close(fd)

    monkeypatch.setattr(spool_module, "_write_piece", slow_write)
    spool = await opened(tmp_path)
    try:
        writer = spool.writer(4 * spool_module.PIECE_BYTES)
        await writer.open()
        await writer.write(os.urandom(spool_module.PIECE_BYTES))  # handed over, not waited for
        assert events == ["write started"] or events == []
        monkeypatch.setattr(os, "close", watched_close)
        await writer.discard()
        monkeypatch.setattr(os, "close", real_close)
        # The file descriptor was closed only after the I/O thread had finished with it.
        assert events == ["write started", "write done", "close"]
        assert not spool.file_path(writer.file_id).exists()
    finally:
        monkeypatch.setattr(os, "close", real_close)
        await spool.close()


@pytest.mark.parametrize("pieces", [1, 3])
async def test_each_piece_is_hashed_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pieces: int
) -> None:
    """The two trips of a piece run at once: the write of each piece and its hash meet at a barrier inside
    their threads. Run one after the other (or in one thread), in either order, the barrier times out and
    the write fails. One piece: the file is created, written and fsynced in one trip; several: streamed."""
    import threading

    meet = threading.Barrier(2, timeout=10)
    met: list[int] = []
    real_pwrite_all, real_hash = spool_module._pwrite_all, spool_module._hash_piece

    def write_meeting_the_hash(fd: int, view: memoryview, offset: int) -> None:
        meet.wait()
        real_pwrite_all(fd, view, offset)

    def hash_meeting_the_write(
        piece: Any, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0
    ) -> None:
        meet.wait()
        met.append(nbytes - start)
        real_hash(piece, nbytes, md5, extra, start)

    spool = await opened(tmp_path)
    try:
        monkeypatch.setattr(spool_module, "HASH_AHEAD_MIN_BYTES", 2 * spool_module.PIECE_BYTES)  # off
        # One piece in flight, so that each piece's two trips are the only ones that can meet.
        monkeypatch.setattr(spool_module, "MAX_PIECES_IN_FLIGHT", 1)
        monkeypatch.setattr(spool_module, "_pwrite_all", write_meeting_the_hash)
        monkeypatch.setattr(spool_module, "_hash_piece", hash_meeting_the_write)
        data = os.urandom(pieces * spool_module.PIECE_BYTES)
        await put(spool, "k", data)
        assert met == [spool_module.PIECE_BYTES] * pieces
        assert stored(spool, "k") == data
        entry = spool.state.lookup("b", "k")
        assert entry is not None and entry.etag == f'"{hashlib.md5(data).hexdigest()}"'
    finally:
        monkeypatch.undo()
        await spool.close()


@pytest.mark.parametrize("pieces", [1, 3])
async def test_a_failed_write_gives_its_piece_back_only_after_the_hash_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pieces: int
) -> None:
    """The piece buffer is shared by the two trips; the one that fails first must not hand it to the next
    writer while the other still reads it."""
    events: list[str] = []
    real_hash = spool_module._hash_piece

    def slow_hash(piece: Any, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0) -> None:
        time.sleep(0.2)
        real_hash(piece, nbytes, md5, extra, start)
        events.append("hash done")

    def failing_write(fd: int, view: memoryview, offset: int) -> None:
        events.append("write failed")
        raise OSError(errno.ENOSPC, "No space left on device")

    spool = await opened(tmp_path)
    real_give = spool.pieces.give

    def watched_give(buf: Any) -> None:
        events.append("piece given back")
        real_give(buf)

    try:
        monkeypatch.setattr(spool_module, "HASH_AHEAD_MIN_BYTES", 2 * spool_module.PIECE_BYTES)  # off
        monkeypatch.setattr(spool_module, "MAX_PIECES_IN_FLIGHT", 1)  # one piece's trips in the events
        monkeypatch.setattr(spool_module, "_hash_piece", slow_hash)
        monkeypatch.setattr(spool_module, "_pwrite_all", failing_write)
        monkeypatch.setattr(spool.pieces, "give", watched_give)
        with pytest.raises(SpoolWriteFailed) as exc:
            await put(spool, "k", os.urandom(pieces * spool_module.PIECE_BYTES))
        assert "full" in exc.value.message
        # Streamed, the next piece was filling meanwhile; the discard gives it back too.
        assert events == ["write failed", "hash done"] + ["piece given back"] * min(pieces, 2)
        assert spool.state.lookup("b", "k") is None
        assert os.listdir(tmp_path / "data") == []
    finally:
        monkeypatch.undo()
        await spool.close()


async def test_a_body_that_fits_one_piece_is_hashed_ahead_as_it_arrives_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a one-piece body arrives, what has arrived is hashed (in order, each byte once), so that only
    the tail is left to hash after its last byte."""
    ranges: list[tuple[int, int]] = []
    real_hash = spool_module._hash_piece

    def recorded(piece: Any, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0) -> None:
        ranges.append((start, nbytes))
        real_hash(piece, nbytes, md5, extra, start)

    monkeypatch.setattr(spool_module, "_hash_piece", recorded)
    spool = await opened(tmp_path)
    try:
        data = os.urandom(spool_module.PIECE_BYTES)
        writer = spool.writer(len(data))
        await writer.open()
        half = len(data) // 2
        for i in range(0, half, 65_536):
            await writer.write(data[i : i + 65_536])
        for _ in range(500):  # the first half is being hashed before the second half arrives
            if ranges:
                break
            await asyncio.sleep(0.01)
        assert ranges and ranges[0][0] == 0 and ranges[0][1] <= half
        for i in range(half, len(data), 65_536):
            await writer.write(data[i : i + 65_536])
        await finished_as(spool, writer, data)
        # Contiguous, in order, every byte once.
        assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    finally:
        await spool.close()


async def test_a_failed_hash_ahead_fails_the_write_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trip hashing a body's head fails: the write is refused, and its file and piece do not linger."""
    real_hash = spool_module._hash_piece

    def failing_first(piece: Any, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0) -> None:
        if start == 0:
            raise OSError(errno.EIO, "Input/output error")
        real_hash(piece, nbytes, md5, extra, start)

    monkeypatch.setattr(spool_module, "_hash_piece", failing_first)
    spool = await opened(tmp_path)
    try:
        with pytest.raises(SpoolWriteFailed):
            await put(spool, "k", os.urandom(spool_module.PIECE_BYTES))
        assert spool.state.lookup("b", "k") is None
        assert os.listdir(tmp_path / "data") == []
        assert spool.pieces.idle >= 1  # the piece came back
    finally:
        monkeypatch.undo()
        await spool.close()


async def test_a_stream_keeps_two_pieces_in_flight_and_hashes_them_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a slow hash, the next piece is written while the one before it is still being hashed (the
    pipeline), never more than MAX_PIECES_IN_FLIGHT pieces are out, and the hashes still take the pieces in
    order: the MD5 comes out right."""
    events: list[tuple[str, int]] = []
    real_hash, real_write = spool_module._hash_piece, spool_module._write_piece
    writers: list[Any] = []
    most_in_flight = 0

    def slow_hash(piece: Any, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0) -> None:
        nonlocal most_in_flight
        most_in_flight = max(most_in_flight, len(writers[0]._flights))
        events.append(("hash started", id(piece)))
        time.sleep(0.05)
        real_hash(piece, nbytes, md5, extra, start)
        events.append(("hash done", id(piece)))

    def recorded_write(fd: int, piece: Any, nbytes: int, offset: int) -> None:
        events.append(("write started", offset))
        real_write(fd, piece, nbytes, offset)

    monkeypatch.setattr(spool_module, "_hash_piece", slow_hash)
    monkeypatch.setattr(spool_module, "_write_piece", recorded_write)
    spool = await opened(tmp_path)
    try:
        data = os.urandom(6 * spool_module.PIECE_BYTES + 12_345)
        writer = spool.writer(len(data))
        writers.append(writer)
        await writer.open()
        for i in range(0, len(data), 100_000):
            await writer.write(data[i : i + 100_000])
        await finished_as(spool, writer, data)
        kinds = [k for k, _ in events]
        # The second piece's write started before the first piece's hash was done.
        assert kinds.index("write started", 1) < kinds.index("hash done")
        # Hashes one at a time: started and done alternate.
        hashes = [k for k in kinds if k.startswith("hash")]
        assert hashes == ["hash started", "hash done"] * 7
        assert most_in_flight <= spool_module.MAX_PIECES_IN_FLIGHT
        assert sorted(o for k, o in events if k == "write started") == [
            i * spool_module.PIECE_BYTES for i in range(7)
        ]
    finally:
        await spool.close()


async def test_a_hash_waiting_for_the_one_before_it_holds_no_io_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A's second piece must be hashed after its first; that wait must not sit on an I/O thread. With
    two threads, one busy hashing A's first piece, writer B's body is still written and fsynced meanwhile."""
    import threading

    a_hashing = threading.Event()
    release_a = threading.Event()
    real_hash = spool_module._hash_piece
    a_pieces: set[int] = set()

    def hash_holding_a(
        piece: Any, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0
    ) -> None:
        if id(md5) in a_pieces and not release_a.is_set():
            a_hashing.set()
            release_a.wait(timeout=10)
        real_hash(piece, nbytes, md5, extra, start)

    monkeypatch.setattr(spool_module, "_hash_piece", hash_holding_a)
    spool = Spool(CFG, tmp_path, SystemClock(), io_threads=2)
    await spool.open()
    try:
        a_data = os.urandom(3 * spool_module.PIECE_BYTES)
        a = spool.writer(len(a_data))
        a_pieces.add(id(a._md5))
        await a.open()
        await a.write(a_data[: 2 * spool_module.PIECE_BYTES])  # two pieces in flight, the first one held
        assert await asyncio.to_thread(a_hashing.wait, 10)
        b_data = os.urandom(spool_module.PIECE_BYTES)
        b = spool.writer(len(b_data))
        await b.open()
        await b.write(b_data)
        # B finishes while A's first hash is still held: the second thread was free.
        await asyncio.wait_for(finished_as(spool, b, b_data), timeout=5)
        assert not release_a.is_set()
        release_a.set()
        await a.write(a_data[2 * spool_module.PIECE_BYTES :])
        await finished_as(spool, a, a_data)
    finally:
        release_a.set()
        await spool.close()
