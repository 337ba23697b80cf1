"""Spool data files: one file per object or part under ``data/``, streamed in page-aligned pieces and written
with ``O_DIRECT`` where the filesystem takes it (see the package docstring), hashed on the way.

The writer runs on the event loop and hands pieces to the I/O threads of its host (the :class:`Spool`);
every blocking call here runs on those threads.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import logging
import mmap
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from s3lanes import durable
from s3lanes.runtime.spool.errors import SpoolWriteFailed
from s3lanes.runtime.spool.errors import write_failed as _write_failed

log = logging.getLogger("s3lanes.spool")

T = TypeVar("T")

# A body is copied into page-aligned buffers of this size; each full one goes to the I/O threads (one writes
# it, one hashes it) while the next one fills. A multiple of any disk's logical block size.
PIECE_BYTES = 1024 * 1024
# A one-piece body at least this long is hashed on a second I/O thread while the first writes and fsyncs it:
# the ack then waits for the longer of the two, not their sum (MD5 of 1 MiB ~1.3 ms, write+fsync ~1 ms).
# Below it, the extra trip costs about what it saves.
PARALLEL_HASH_MIN_BYTES = 128 * 1024
# While such a body arrives, what has arrived is hashed ahead, in trips of at least this much (one at a time,
# in order), so that little is left to hash after its last byte.
HASH_AHEAD_MIN_BYTES = 256 * 1024
# Pieces of one body being hashed and written at once while the next fills. With two, the hash of one piece
# (the slowest step, and sequential) runs while the next is written, and a stream is not held up each time a
# piece fills before the one ahead of it is done.
MAX_PIECES_IN_FLIGHT = 2
# O_DIRECT: buffer address, length and file offset must be multiples of the logical block size; 4096 covers
# 512-byte and 4K-sector disks. The end of a file that is not a multiple is written through the page cache.
DIRECT_ALIGN = 4096
# Idle piece buffers kept for the next writers (each PIECE_BYTES); more are made while writers need them.
FREE_PIECES_KEPT = 8
DIRECT_PROBE_NAME = ".direct-io-probe"


class WriterHost(Protocol):
    """What a :class:`SpoolFileWriter` needs of the spool: its I/O threads, piece buffers and data dir."""

    pieces: PiecePool
    direct_io: bool

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T: ...

    async def run_io_owned(self, fn: Callable[..., T], *args: Any, release: Callable[[T], object]) -> T: ...

    def submit_io(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]: ...

    def file_path(self, file_id: str) -> Path: ...

    def mark_dir_dirty(self) -> None: ...


class PiecePool:
    """Page-aligned buffers (anonymous mmaps) for the writers, reused so their pages stay mapped.

    Used on the event loop only."""

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self._keep = keep
        self._free: list[mmap.mmap] = []

    def take(self) -> mmap.mmap:
        return self._free.pop() if self._free else mmap.mmap(-1, self.size)

    def give(self, buf: mmap.mmap) -> None:
        if len(self._free) < self._keep:
            self._free.append(buf)
        else:
            with contextlib.suppress(BufferError):  # a traceback may still hold a view; the GC frees it
                buf.close()

    @property
    def idle(self) -> int:
        return len(self._free)


@dataclass(slots=True)
class _Flight:
    """A piece handed to the I/O threads: its write, its hash, and the hash-ahead trip over its head."""

    piece: mmap.mmap
    nbytes: int
    write: concurrent.futures.Future[None]
    hash: concurrent.futures.Future[None]
    ahead: concurrent.futures.Future[None] | None = None

    @property
    def trips(self) -> tuple[concurrent.futures.Future[None], ...]:
        return (self.write, self.hash) if self.ahead is None else (self.write, self.hash, self.ahead)


class SpoolFileWriter:
    """Streams one object's (or part's) bytes into a new spool file, computing its MD5 on the way.

    The bytes are copied into a page-aligned piece buffer; a full piece goes to two I/O threads, one writing
    it at its offset (with O_DIRECT where the spool uses it), one hashing it, while the next piece fills. Up
    to MAX_PIECES_IN_FLIGHT pieces are in flight; each piece's hash trip waits for the one before it, so the
    MD5 sees the bytes in order, and a write error surfaces when its piece is settled."""

    def __init__(self, spool: WriterHost, file_id: str, reserved_bytes: int) -> None:
        self._spool = spool
        self.file_id = file_id
        self.reserved_bytes = reserved_bytes
        self._fd = -1
        self._md5 = hashlib.md5(usedforsecurity=False)
        # Hash objects fed every byte with the MD5, on the I/O thread (a body verifier's, delegated to us).
        self.extra_hashers: tuple[Any, ...] = ()
        self._piece: mmap.mmap | None = None  # the piece filling
        self._filled = 0
        self._flights: collections.deque[_Flight] = collections.deque()  # oldest first
        self._submitted = 0  # bytes handed to write trips: the next piece's file offset
        # Hashing ahead (a body declared to fit one piece): the trip hashing the filling piece's head, and
        # how many of its bytes have been handed to hash trips.
        self._hash_ahead = PARALLEL_HASH_MIN_BYTES <= reserved_bytes <= PIECE_BYTES
        self._ahead: concurrent.futures.Future[None] | None = None
        self._hashed = 0
        self._open = False
        self.size = 0

    async def open(self) -> None:
        """Start the upload. The file itself is created with the first full piece, or by :meth:`finish` for a
        body that fits in one piece (created, written and fsynced there: :meth:`_finish_whole`)."""
        self._open = True

    async def _create(self) -> None:
        try:
            self._fd = await self._spool.run_io_owned(
                _open_data_file, self._path(), self._spool.direct_io, release=os.close
            )
        except OSError as exc:
            raise _write_failed(exc) from exc
        # Only now: a journal batch that fsyncs the directory after this point covers the new entry.
        self._spool.mark_dir_dirty()

    def _path(self) -> Path:
        return self._spool.file_path(self.file_id)

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        size = self._spool.pieces.size
        while view:
            if self._piece is None:
                self._piece = self._spool.pieces.take()
                self._filled = 0
            elif self._filled == size:
                await self._hand_over()  # more than the declared length: the deferred piece goes now
                continue
            n = min(len(view), size - self._filled)
            self._piece[self._filled : self._filled + n] = view[:n]
            self._filled += n
            view = view[n:]
            # A full piece goes to the I/O threads, unless it is the whole declared body of a file not yet
            # created: finish() then creates, writes and fsyncs it at once (its head hashed ahead meanwhile).
            if self._filled == size and (self._fd >= 0 or self.size + size < self.reserved_bytes):
                await self._hand_over()
            elif self._hash_ahead and self._filled - self._hashed >= HASH_AHEAD_MIN_BYTES:
                self._hash_more()

    def _hash_more(self) -> None:
        """Hash what has arrived of the filling piece, unless a hash trip over it still runs (the next call
        takes the bytes that arrive meanwhile). One trip at a time keeps the bytes in order; the thread reads
        only bytes already copied, while the loop copies the next ones behind them."""
        ahead = self._ahead
        if ahead is not None and (not ahead.done() or ahead.cancelled() or ahead.exception() is not None):
            return  # still hashing, or failed: finish() waits for it and reports the failure
        lo, hi = self._hashed, self._filled
        self._ahead = self._spool.submit_io(_hash_piece, self._piece, hi, self._md5, self.extra_hashers, lo)
        self._hashed = hi

    def _take_ahead(self) -> tuple[concurrent.futures.Future[None] | None, int]:
        """The filling piece's hash-ahead trip and how far it went; the next piece starts afresh."""
        ahead, hashed = self._ahead, self._hashed
        self._ahead, self._hashed = None, 0
        return ahead, hashed

    async def _hand_over(self) -> None:
        """Start the filled piece, once fewer than MAX_PIECES_IN_FLIGHT are in flight."""
        while len(self._flights) >= MAX_PIECES_IN_FLIGHT:
            await self._settle_oldest()
        piece, n = self._piece, self._filled
        if piece is None:
            return
        if n == 0:
            self._piece = None
            self._spool.pieces.give(piece)
            return
        if self._fd < 0:
            await self._create()
        self._piece, self._filled = None, 0
        # Hashing ahead is for a body that fits one piece; once pieces are in flight, their hash trips chain.
        self._hash_ahead = False
        ahead, hashed = self._take_ahead()  # a body longer than declared may have been hashed ahead
        before = self._flights[-1].hash if self._flights else ahead
        offset, self._submitted = self._submitted, self._submitted + n
        self._flights.append(
            _Flight(
                piece,
                n,
                self._spool.submit_io(_write_piece, self._fd, piece, n, offset),
                self._after(before, _hash_piece, piece, n, self._md5, self.extra_hashers, hashed),
                ahead,  # waited for too, before the piece goes back
            )
        )

    def _after(
        self, before: concurrent.futures.Future[None] | None, fn: Callable[..., None], *args: Any
    ) -> concurrent.futures.Future[None]:
        """``fn(*args)`` on the I/O pool once ``before`` is done (at once if None); its outcome, or
        ``before``'s failure, in the returned future. No thread is held while ``before`` runs: the trip is
        submitted by ``before``'s completion."""
        out: concurrent.futures.Future[None] = concurrent.futures.Future()

        def copy(inner: concurrent.futures.Future[None]) -> None:
            exc = SpoolWriteFailed() if inner.cancelled() else inner.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(None)

        def start(prev: concurrent.futures.Future[None] | None) -> None:
            if not out.set_running_or_notify_cancel():
                return  # its waiter gave up before it started: it never runs, and never reads the piece
            if prev is not None and (prev.cancelled() or prev.exception() is not None):
                out.set_exception(SpoolWriteFailed() if prev.cancelled() else prev.exception())
                return
            try:
                self._spool.submit_io(fn, *args).add_done_callback(copy)
            except RuntimeError as exc:  # the pool is shut down (the gateway is stopping)
                out.set_exception(exc)

        if before is None:
            start(None)
        else:
            before.add_done_callback(start)
        return out

    async def _settle_oldest(self) -> None:
        """Wait for every trip of the oldest piece in flight (also when one fails: they share the piece)."""
        flight = self._flights[0]
        failed: BaseException | None = None
        for cf in flight.trips:
            try:
                await asyncio.wrap_future(cf)
            except Exception as exc:  # the first failure is raised once all its trips are over
                failed = failed or exc
        self._flights.popleft()
        self._spool.pieces.give(flight.piece)
        if isinstance(failed, OSError):
            raise _write_failed(failed) from failed
        if failed is not None:
            raise failed
        self.size += flight.nbytes

    async def _settle(self) -> None:
        while self._flights:
            await self._settle_oldest()

    async def _quiesce(self) -> None:
        """Before the fd is closed: the I/O threads must be done with it (their outcome no longer matters)."""
        ahead, _ = self._take_ahead()
        flights, self._flights = list(self._flights), collections.deque()
        cfs = [cf for f in flights for cf in f.trips] + ([ahead] if ahead is not None else [])
        for cf in cfs:
            if cf.cancelled():  # never started (a waiter cancelled it): the thread never saw the piece
                continue
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.wrap_future(cf))
        for f in flights:
            self._spool.pieces.give(f.piece)
        piece, self._piece = self._piece, None
        if piece is not None:
            self._spool.pieces.give(piece)

    async def finish(self) -> str:
        """Everything written and fsynced; returns the MD5 (hex)."""
        if not self._open:
            raise AssertionError("finish() of a writer that is not open")
        self._open = False
        if self._fd < 0:
            await self._finish_whole()
            return self._md5.hexdigest()
        await self._hand_over()
        await self._settle()
        fd, self._fd = self._fd, -1
        try:
            await self._spool.run_io(durable.fsync_close, fd)
        except OSError as exc:
            await self._spool.run_io(unlink_all, [self._path()])
            raise _write_failed(exc) from exc
        return self._md5.hexdigest()

    async def _finish_whole(self) -> None:
        """A body that fit in one piece (or was empty): create, hash, write, fsync and close in one trip, or,
        from PARALLEL_HASH_MIN_BYTES up, in two trips at once: one thread creates, writes and fsyncs the file
        while another hashes the same (unchanging) piece."""
        piece, n = self._piece, self._filled
        self._piece, self._filled = None, 0
        ahead, hashed = self._take_ahead()
        path, direct = self._path(), self._spool.direct_io
        trips: list[Awaitable[None]]
        try:
            if piece is None or (n < PARALLEL_HASH_MIN_BYTES and ahead is None):
                md5, extra = self._md5, self.extra_hashers
                trips = [self._spool.run_io(_create_whole, path, direct, piece, n, md5, extra)]
            else:
                hashing = self._after(ahead, _hash_piece, piece, n, self._md5, self.extra_hashers, hashed)
                trips = [
                    self._spool.run_io(_create_whole, path, direct, piece, n, None),
                    asyncio.wrap_future(hashing),
                ]
            # Both trips end before the piece goes back to the pool, also when one of them fails.
            outcomes = await asyncio.gather(*trips, return_exceptions=True)
        finally:
            if piece is not None:
                self._spool.pieces.give(piece)
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            await self._spool.run_io(unlink_all, [path])
            if isinstance(failed, OSError):
                raise _write_failed(failed) from failed
            raise failed
        self._spool.mark_dir_dirty()
        self.size += n

    async def discard(self) -> None:
        """Drop the file (a failed or rejected upload). Safe to call in any state, more than once."""
        self._open = False
        await self._quiesce()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            await self._spool.run_io(os.close, fd)
        await self._spool.run_io(unlink_all, [self._path()])


def _open_data_file(path: Path, direct: bool) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    if not direct:
        return os.open(path, flags, 0o600)
    try:
        return os.open(path, flags | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    # Refused after all (the probe said yes; another filesystem may be mounted there now): the file may have
    # been created before the refusal. Its name is ours alone, so start it again through the page cache.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, flags, 0o600)


def _create_whole(
    path: Path, direct: bool, piece: mmap.mmap | None, nbytes: int, md5: Any, extra: tuple[Any, ...] = ()
) -> None:
    """I/O thread: a whole small file (``nbytes`` of ``piece``), created, written, fsynced and closed; hashed
    on the way unless ``md5`` is None (another thread hashes the piece)."""
    fd = _open_data_file(path, direct)
    try:
        if piece is not None and nbytes:
            if md5 is not None:
                _hash_piece(piece, nbytes, md5, extra)
            _write_piece(fd, piece, nbytes, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_piece(piece: mmap.mmap, nbytes: int, md5: Any, extra: tuple[Any, ...] = (), start: int = 0) -> None:
    """I/O thread: feed bytes ``start`` to ``nbytes`` of ``piece`` to the MD5 and the ``extra`` hashes
    (hashlib and zlib release the GIL on buffers this size)."""
    with memoryview(piece) as whole, whole[start:nbytes] as view:
        md5.update(view)
        for h in extra:
            h.update(view)


def _write_piece(fd: int, piece: mmap.mmap, nbytes: int, offset: int) -> None:
    """I/O thread: write the first ``nbytes`` of ``piece`` at ``offset`` of the file."""
    with memoryview(piece) as whole, whole[:nbytes] as view:
        aligned = nbytes - nbytes % DIRECT_ALIGN
        _pwrite_all(fd, view[:aligned], offset)
        if aligned < nbytes:  # the end of the file: O_DIRECT cannot write a partial block
            _drop_direct(fd)
            _pwrite_all(fd, view[aligned:], offset + aligned)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    retried = False
    while view:
        try:
            n = os.pwrite(fd, view, offset)
        except OSError as exc:
            # EINVAL from an O_DIRECT write (a short write left an unaligned rest, or the filesystem wants
            # more alignment): carry on through the page cache, retrying once (another piece's thread may
            # have turned O_DIRECT off already). Any other error, or EINVAL again, is the write's.
            if exc.errno != errno.EINVAL or retried:
                raise
            _drop_direct(fd)
            retried = True
            continue
        view, offset, retried = view[n:], offset + n, False


def _drop_direct(fd: int) -> None:
    """Turn O_DIRECT off on ``fd`` (nothing to do if it is off)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_DIRECT:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)


def direct_io_works(data_dir: Path) -> bool:
    """Whether the spool's filesystem takes an aligned O_DIRECT write (tmpfs and some others refuse it)."""
    path = data_dir / DIRECT_PROBE_NAME
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    buf = mmap.mmap(-1, DIRECT_ALIGN)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
        try:
            os.write(fd, buf)
        finally:
            os.close(fd)
    except OSError as exc:
        log.info(
            "spool: %s does not take O_DIRECT writes (%s); data files go through the page cache",
            data_dir,
            exc.strerror,
        )
        return False
    finally:
        buf.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True


def unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
