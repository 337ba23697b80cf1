"""Spool data files written with O_DIRECT, and every way back to the page cache.

The spool probes its directory at start (``[spool] direct_io``): where an aligned O_DIRECT write works, data
files are opened with O_DIRECT and written from page-aligned piece buffers; the last, partial block of a file
goes through the page cache. Whatever the path, the file holds exactly the bytes sent and the writer returns
their MD5. Refusals that cannot be produced on demand (a filesystem that refuses O_DIRECT, an O_DIRECT write
answered EINVAL) are injected by replacing the ``os`` function the spool calls, for O_DIRECT calls only.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import s3lanes.runtime.spool.disk as spool_module
from s3lanes.runtime.spool import PIECE_BYTES, Spool
from tests.runtime.test_spool_shell import CFG, opened, put


def refuse_direct_open(monkeypatch: pytest.MonkeyPatch, *, create_first: bool = False) -> list[str]:
    """``os.open`` answers EINVAL to O_DIRECT (as tmpfs before Linux 6.6 does), after creating the file if
    ``create_first`` (the kernel creates it before it checks). Returns the paths refused."""
    real_open = os.open
    refused: list[str] = []

    def fake(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if flags & os.O_DIRECT:
            refused.append(str(path))
            if create_first:
                os.close(real_open(path, flags & ~os.O_DIRECT, mode))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", fake)
    return refused


def stored(spool: Spool, key: str) -> bytes:
    entry = spool.state.lookup("b", key)
    assert entry is not None
    return b"".join(spool.file_path(f).read_bytes() for f in entry.files)


def filesystem_takes_direct_io(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return spool_module.direct_io_works(path)


async def test_data_files_are_opened_with_o_direct_where_the_filesystem_takes_it(tmp_path: Path) -> None:
    takes = filesystem_takes_direct_io(tmp_path / "probe")
    spool = await opened(tmp_path / "spool")
    try:
        assert spool.direct_io is takes
        assert spool.status()["direct_io"] is takes
        assert spool.recovery is not None
        assert ("with O_DIRECT" in spool.recovery.summary()) is takes
        data = os.urandom(2 * PIECE_BYTES + 12_345)  # two whole pieces and a partial last block
        writer = spool.writer(len(data))
        await writer.open()
        await writer.write(data[: PIECE_BYTES + 7])  # the first piece is handed over: the file exists
        flags = fcntl.fcntl(writer._fd, fcntl.F_GETFL)
        assert bool(flags & os.O_DIRECT) is takes
        await writer.write(data[PIECE_BYTES + 7 :])
        assert await writer.finish() == hashlib.md5(data).hexdigest()
        assert spool.file_path(writer.file_id).read_bytes() == data
        assert not (spool.data_dir / spool_module.DIRECT_PROBE_NAME).exists()
    finally:
        await spool.close()


async def test_direct_io_off_in_the_config_writes_through_the_page_cache(tmp_path: Path) -> None:
    spool = await opened(tmp_path, replace(CFG, direct_io=False))
    try:
        assert spool.direct_io is False
        writer = spool.writer(2 * PIECE_BYTES)
        await writer.open()
        await writer.write(os.urandom(PIECE_BYTES))
        assert not fcntl.fcntl(writer._fd, fcntl.F_GETFL) & os.O_DIRECT
        await writer.discard()
        assert os.listdir(spool.data_dir) == []
        data = os.urandom(PIECE_BYTES + 1)
        await put(spool, "k", data)
        assert stored(spool, "k") == data
    finally:
        await spool.close()


async def test_a_filesystem_refusing_o_direct_is_found_at_start_and_nothing_changes_for_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = refuse_direct_open(monkeypatch, create_first=True)
    spool = await opened(tmp_path)
    try:
        assert refused and spool.direct_io is False
        assert spool.recovery is not None and "through the page cache" in spool.recovery.summary()
        assert os.listdir(spool.data_dir) == []  # the probe file is gone
        data = os.urandom(3 * PIECE_BYTES)
        await put(spool, "k", data)
        assert stored(spool, "k") == data
        assert len(refused) == 1  # only the probe tried
    finally:
        await spool.close()


async def test_a_data_file_refused_o_direct_after_the_probe_is_started_again_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    try:
        spool.direct_io = True  # as if the probe had said yes (whatever this filesystem says)
        refused = refuse_direct_open(monkeypatch, create_first=True)
        data = os.urandom(PIECE_BYTES + 999)
        await put(spool, "k", data)
        entry = spool.state.lookup("b", "k")
        assert entry is not None
        assert refused == [str(spool.file_path(entry.files[0]))]
        assert stored(spool, "k") == data
        assert os.listdir(spool.data_dir) == [entry.files[0]]
    finally:
        await spool.close()


async def test_an_o_direct_write_answered_einval_carries_on_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    real_pwrite = os.pwrite
    refused: list[int] = []

    def fake(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT and not refused:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    try:
        monkeypatch.setattr(os, "pwrite", fake)
        data = os.urandom(3 * PIECE_BYTES + 5)
        await put(spool, "k", data)
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        assert stored(spool, "k") == data
        assert refused == ([PIECE_BYTES] if spool.direct_io else [])
    finally:
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        await spool.close()


async def test_a_short_o_direct_write_finishes_the_rest_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write (the disk nearly full) leaves an unaligned rest, which O_DIRECT refuses with EINVAL."""
    spool = await opened(tmp_path)
    real_pwrite = os.pwrite
    shorts: list[int] = []

    def fake(fd: int, data: Any, offset: int) -> int:
        if not shorts and len(data) == PIECE_BYTES:
            shorts.append(fd)
            return real_pwrite(fd, memoryview(data)[:1000], offset)
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT and (len(data) % 4096 or offset % 4096):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    try:
        monkeypatch.setattr(os, "pwrite", fake)
        data = os.urandom(2 * PIECE_BYTES)
        await put(spool, "k", data)
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        assert shorts and stored(spool, "k") == data
    finally:
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        await spool.close()


async def test_piece_buffers_are_reused_and_the_idle_ones_bounded(tmp_path: Path) -> None:
    spool = await opened(tmp_path)
    try:
        writers = [spool.writer(2 * PIECE_BYTES) for _ in range(spool_module.FREE_PIECES_KEPT + 3)]
        for w in writers:
            await w.open()
            await w.write(os.urandom(PIECE_BYTES + 1))  # one piece in flight (or done), one filling
        for w in writers[:2]:
            await w.finish()
        for w in writers[2:]:
            await w.discard()
        assert spool.pieces.idle == spool_module.FREE_PIECES_KEPT
        before = spool.pieces.idle
        await put(spool, "k", os.urandom(PIECE_BYTES))
        assert spool.pieces.idle == before  # taken from the pool and given back
    finally:
        await spool.close()


async def test_a_body_that_fits_one_piece_takes_one_trip_to_the_io_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = await opened(tmp_path)
    trips: list[str] = []
    real_run, real_submit = spool.run_io, spool.submit_io

    async def counted_run(fn: Any, *args: Any) -> Any:
        trips.append(fn.__name__)
        return await real_run(fn, *args)

    def counted_submit(fn: Any, *args: Any) -> Any:
        trips.append(fn.__name__)
        return real_submit(fn, *args)

    try:
        monkeypatch.setattr(spool, "run_io", counted_run)
        monkeypatch.setattr(spool, "submit_io", counted_submit)
        for size in (
            0,
            1,
            4096,
            123_457,
            spool_module.PARALLEL_HASH_MIN_BYTES,
            spool_module.HASH_AHEAD_MIN_BYTES,
            PIECE_BYTES,
        ):
            data = os.urandom(size)
            trips.clear()
            writer = spool.writer(size)
            await writer.open()
            for i in range(0, size, 65_536):
                await writer.write(data[i : i + 65_536])
            # Nothing created before the whole body is here; what has arrived may be hashed ahead.
            assert set(trips) <= {"_hash_piece"}, size
            if size < spool_module.HASH_AHEAD_MIN_BYTES:
                assert trips == [], size
            else:
                assert trips, size
            ahead = len(trips)
            assert not spool._dir_dirty
            assert await writer.finish() == hashlib.md5(data).hexdigest()
            if size >= spool_module.PARALLEL_HASH_MIN_BYTES:
                # The rest hashed on a second thread while the first writes and fsyncs: two trips, at once.
                assert sorted(trips[ahead:]) == ["_create_whole", "_hash_piece"], size
            else:
                assert trips == ["_create_whole"], size
            assert writer.size == size
            # The directory is marked for the next journal batch's fsync after the file was created.
            assert spool._dir_dirty
            assert spool.file_path(writer.file_id).read_bytes() == data
            await spool.commit([])  # a batch: it fsyncs the directory and clears the mark
            assert not spool._dir_dirty
        trips.clear()
        writer = spool.writer(PIECE_BYTES + 1)
        await writer.open()
        await writer.write(os.urandom(PIECE_BYTES + 1))
        await writer.finish()
        # Each full piece: a write and a hash, at once (the second hash is started by the end of the first);
        # nothing hashed ahead (the body is over a piece).
        assert (trips[0], trips[-1]) == ("_open_data_file", "fsync_close")
        assert sorted(trips[1:-1]) == ["_hash_piece", "_hash_piece", "_write_piece", "_write_piece"]
    finally:
        await spool.close()


@pytest.mark.parametrize("declared", [PIECE_BYTES, 300_000])
@pytest.mark.parametrize("step", [2 * PIECE_BYTES + 3, 100_000])
async def test_a_body_longer_than_declared_is_still_written_whole(
    tmp_path: Path, declared: int, step: int
) -> None:
    """The spool writer is told the declared length; it must not lose bytes if more arrive (after hashing
    ahead, as a body that fits one piece is)."""
    spool = await opened(tmp_path)
    try:
        data = os.urandom(2 * PIECE_BYTES + 3)
        writer = spool.writer(declared)  # the first full piece is held back for a one-trip finish
        await writer.open()
        for i in range(0, len(data), step):
            await writer.write(data[i : i + step])
        assert await writer.finish() == hashlib.md5(data).hexdigest()
        assert spool.file_path(writer.file_id).read_bytes() == data
    finally:
        await spool.close()
