"""The write spool on local disk: data files, the journal with group commit, recovery, flush waiters.

Layout under the spool directory::

    journal            framed msgpack records (gateway.core.journal), appended with group commit
    data/<random id>   one file per object or part; names never come from object keys

The durability recipe of one acknowledged write: the data file is written and fsynced, the data directory
is fsynced (once per journal batch, for every file created since the last batch), then the record is
appended to the journal and the journal fdatasynced, again once per batch for every writer waiting. Only
then is the record applied to :class:`~gateway.core.spool_state.SpoolState` and the client answered. A
crash before that point leaves an orphan data file, removed on the next start; after it, the journal has
the record and recovery finds the data.

Data files are written with ``O_DIRECT`` where the filesystem allows it (``[spool] direct_io``, probed at
start): the bytes go from a page-aligned buffer of ours to the disk without a copy into the page cache, so a
burst of checkpoints neither pays for that copy nor leaves gigabytes of dirty pages for a long ``fsync`` and a
writeback storm that evicts the node's cache. The ``fsync`` before the ack still runs (it makes the file's
metadata and the disk's write cache durable). Where ``O_DIRECT`` is refused, the same code writes through the
page cache.

All blocking file work runs on thread pools, never on the event loop, and on three of them so that no ack
queues behind bulk work: one thread for the journal (appends, compaction; sequential by nature), a small
pool for writing data files (hashing and writing pieces, creating, fsyncing, unlinking), and a pool for
reading them (the drain's uploads, GETs served from the spool, copies). A failed fsync or a full
disk fails the write that hit it with 503 and, for the journal, puts the spool out of service for new
writes (``degraded``): after a failed fsync the kernel's page cache state is unknown (fsyncgate), so the
only safe course is to stop acknowledging into it. Data already acknowledged keeps draining.
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
import secrets
import shutil
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from gateway.clock import Clock
from gateway.config import SpoolConfig
from gateway.core.journal import BATCH_KEY, JournalCorrupt, encode_batch, file_header, replay
from gateway.core.spool_state import Admission, Applied, Entry, SpoolSpace, SpoolState, Upload
from gateway.errors import ServiceUnavailable
from gateway.runtime import durable

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
DRAIN_RATE_WINDOW_S = 10.0
JOURNAL_NAME = "journal"
HEAL_INTERVAL_S = 2.0


class SpoolWriteFailed(ServiceUnavailable):
    """The spool could not make a write durable (disk full, I/O error): nothing was acknowledged."""

    default_message = "The gateway could not store the upload on its local spool. Please retry."


class JournalAppendFailed(SpoolWriteFailed):
    """The journal append of the write's record failed. The record may or may not be in the journal file
    (the gateway truncates it back when it can), so the write's data file must be kept: if the record did
    survive, recovery needs the data; if not, recovery removes the file as an orphan. Either outcome is one
    S3 allows for a request answered 503."""


@dataclass(slots=True)
class RecoveryReport:
    journal_bytes: int = 0
    records: int = 0
    torn_bytes: int = 0
    entries: int = 0
    uploads: int = 0
    bytes: int = 0
    orphans_removed: int = 0
    lost_entries: list[str] = field(default_factory=list)
    compacted: bool = False
    direct_io: bool = False
    in_doubt: int = 0  # keys whose drain request may still be on its way to the store (fenced on drain)

    def summary(self) -> str:
        text = (
            f"spool recovery: {self.records} journal records ({self.journal_bytes} bytes), "
            f"{self.entries} objects ({self.bytes} bytes) to drain, {self.uploads} open multipart uploads, "
            f"{self.orphans_removed} unacknowledged files removed; data files written "
            + ("with O_DIRECT" if self.direct_io else "through the page cache")
        )
        if self.in_doubt:
            text += f", {self.in_doubt} keys in doubt (a drain request may still be on the wire: fenced)"
        if self.torn_bytes:
            text += f", torn journal tail of {self.torn_bytes} bytes truncated"
        if self.lost_entries:
            text += f", {len(self.lost_entries)} entries LOST (data file missing or short)"
        return text


@dataclass(frozen=True, slots=True)
class FlushResult:
    durable: bool
    pending_objects: int
    pending_bytes: int
    oldest_pending_age_s: float | None
    waited_s: float


class Spool:
    """Owns the spool directory, its journal and its state. Lives on the gateway's event loop."""

    def __init__(self, cfg: SpoolConfig, root: Path, clock: Clock, *, io_threads: int = 4) -> None:
        self.cfg = cfg
        self.root = root
        self.data_dir = root / "data"
        self._clock = clock
        self.state = SpoolState(cfg.commit_markers)
        self.space = SpoolSpace(cfg.capacity_bytes, cfg.high_water, cfg.low_water)
        self._executor = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="spool-io")
        self._journal_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool-journal")
        self._read_executor = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="spool-read")
        self._journal_fd = -1
        self._journal_bytes = 0
        self._dir_dirty = False
        self._batch_no = 0
        self._queue: list[tuple[list[dict[str, Any]], asyncio.Future[list[Applied]]]] = []
        self._wake_committer = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._flush_waiters: list[tuple[str, str, int, asyncio.Future[None]]] = []
        self._key_waiters: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self.degraded: str | None = None
        # While degraded: keys whose drained entries' ``done`` records could not be journaled (a restart would
        # drain them again, so nothing else may write these keys until the journal is rewritten), and the
        # files those entries kept for that case.
        self.unjournaled_keys: set[tuple[str, str]] = set()
        self._kept_files: list[str] = []
        self._kept_bytes = 0
        self._healer: asyncio.Task[None] | None = None
        self.drain_wakeup = asyncio.Event()
        self.on_cancel: Callable[[int], None] = lambda seq: None
        self.recovery: RecoveryReport | None = None
        self.acked_bytes = 0
        self.drained_bytes = 0
        self.fence_reapplies = 0  # newest states the drain applied again after a fence found an older one
        self._drained_recent: collections.deque[tuple[float, int]] = collections.deque()
        self.direct_io = False  # set by open(): cfg.direct_io and the filesystem accepts O_DIRECT
        self.pieces = PiecePool(PIECE_BYTES, FREE_PIECES_KEPT)

    # -- executor --------------------------------------------------------------------------------------------

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T:
        """Data-file work of the writers (and start-up work)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run_read_io(self, fn: Callable[..., T], *args: Any) -> T:
        """Reading spool files: the drain, GETs served from the spool, copies."""
        return await asyncio.get_running_loop().run_in_executor(self._read_executor, fn, *args)

    async def run_io_owned(self, fn: Callable[..., T], *args: Any, release: Callable[[T], object]) -> T:
        """:meth:`run_io` for work that returns something to release (descriptors): see :func:`_owned`."""
        return await _owned(asyncio.ensure_future(self.run_io(fn, *args)), release)

    async def run_read_io_owned(self, fn: Callable[..., T], *args: Any, release: Callable[[T], object]) -> T:
        """:meth:`run_read_io` for work that returns something to release: see :func:`_owned`."""
        return await _owned(asyncio.ensure_future(self.run_read_io(fn, *args)), release)

    async def _run_journal_io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._journal_executor, fn, *args)

    def submit_io(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Start ``fn`` on the I/O pool without waiting (the caller keeps the future to wait for it)."""
        return self._executor.submit(fn, *args)

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def open(self) -> RecoveryReport:
        """Recover before the listener opens: replay, truncate a torn tail, drop orphans, resume drains."""
        report = await self.run_io(self._recover_sync)
        if self.cfg.direct_io:
            self.direct_io = report.direct_io = await self.run_io(_direct_io_works, self.data_dir)
        if self.cfg.capacity_bytes == 0:
            usage = await self.run_io(shutil.disk_usage, self.root)
            self.space.capacity_bytes = int(usage.free * 0.8) + self.state.bytes_on_disk
        self.space.set_used(self.state.bytes_on_disk)
        self._committer = asyncio.create_task(self._commit_loop(), name="spool-journal")
        self._committer.add_done_callback(crash_on_failure)
        if report.lost_entries:
            await self.commit([self.state.done_record(int(s)) for s in report.lost_entries])
        expired = self.state.expired_uploads(self._clock.wall(), self.cfg.abandoned_upload_s)
        if expired:
            await self.commit([self.state.abort_record(u.upload_id) for u in expired])
        self.recovery = report
        (log.error if report.lost_entries else log.info)("%s", report.summary())
        self.drain_wakeup.set()
        return report

    def _recover_sync(self) -> RecoveryReport:
        report = RecoveryReport()
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        path = self.root / JOURNAL_NAME
        data = path.read_bytes() if path.exists() else b""
        report.journal_bytes = len(data)
        result = replay(data)  # JournalCorrupt propagates: a loud startup error
        report.records = len(result.records)
        report.torn_bytes = result.torn_bytes
        for rec in result.records:
            batch = rec.get(BATCH_KEY)
            if isinstance(batch, int):
                self._batch_no = max(self._batch_no, batch)
            try:
                self.state.apply(rec)
            except (KeyError, ValueError, TypeError) as exc:
                raise JournalCorrupt(0, f"record {rec!r} does not apply: {exc}") from exc
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if result.valid_bytes == 0:
                os.ftruncate(fd, 0)
                os.write(fd, file_header())
                self._journal_bytes = len(file_header())
            else:
                if result.torn_bytes:
                    log.warning("journal: truncating a torn tail of %d bytes", result.torn_bytes)
                    os.ftruncate(fd, result.valid_bytes)
                self._journal_bytes = result.valid_bytes
            os.fsync(fd)
        finally:
            os.close(fd)
        durable.fsync_dir(self.root)
        # Files no record refers to were never acknowledged.
        referenced = self.state.referenced_files()
        for name in os.listdir(self.data_dir):
            if name not in referenced:
                os.unlink(self.data_dir / name)
                report.orphans_removed += 1
        for entry in list(self.state.entries.values()):
            if entry.kind == "del":
                continue  # a tombstone has no data
            expected = entry.part_sizes or (entry.size,)
            for file_id, size in zip(entry.files, expected, strict=True):
                try:
                    actual = os.stat(self.data_dir / file_id).st_size
                except FileNotFoundError:
                    actual = -1
                if actual != size:
                    log.error(
                        "spool: acknowledged data of %s/%s (entry %d) is missing or short: file %s has %d of"
                        " %d bytes",
                        entry.bucket,
                        entry.key,
                        entry.seq,
                        file_id,
                        actual,
                        size,
                    )
                    report.lost_entries.append(str(entry.seq))
                    break
        report.in_doubt = self.state.recovered()
        report.entries = len(self.state.entries)
        report.uploads = len(self.state.uploads)
        report.bytes = self.state.bytes_on_disk
        if self._journal_bytes > self.cfg.journal_compact_bytes:
            self._compact_sync(self.state.snapshot_records())  # nothing else runs yet
            report.compacted = True
        self._journal_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        return report

    async def close(self) -> None:
        if self._healer is not None:
            self._healer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._healer
            self._healer = None
        if self._committer is not None:
            # Let queued records land first: their writers are waiting for the ack.
            if self._queue and self.degraded is None:
                await self.commit([])  # FIFO: returns once every queued batch is in the journal
            self._committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._committer
            self._committer = None
        if self._journal_fd >= 0:
            fd, self._journal_fd = self._journal_fd, -1
            await self._run_journal_io(durable.fsync_close, fd)
        for _, _, _, fut in self._flush_waiters:
            if not fut.done():
                fut.cancel()
        for executor in (self._executor, self._read_executor, self._journal_executor):
            executor.shutdown(wait=True)

    # -- writing data ----------------------------------------------------------------------------------------

    def new_file_id(self) -> str:
        return secrets.token_hex(16)

    def file_path(self, file_id: str) -> Path:
        return self.data_dir / file_id

    def writer(self, reserved_bytes: int) -> SpoolFileWriter:
        return SpoolFileWriter(self, self.new_file_id(), reserved_bytes)

    def mark_dir_dirty(self) -> None:
        self._dir_dirty = True

    # -- the journal (group commit) --------------------------------------------------------------------------

    async def commit(self, records: list[dict[str, Any]]) -> list[Applied]:
        """Append records durably; resolves once they are in the journal and applied to the state."""
        if self._journal_fd < 0 and self._committer is None:
            raise SpoolWriteFailed("The spool is not open.")
        if self.degraded is not None:
            raise SpoolWriteFailed(f"The gateway's spool is out of service: {self.degraded}")
        try:
            encode_batch(records)  # a record that cannot be encoded fails its own request, not the committer
        except (TypeError, ValueError, OverflowError) as exc:
            raise SpoolWriteFailed(f"The spool cannot record this request: {exc}") from None
        fut: asyncio.Future[list[Applied]] = asyncio.get_running_loop().create_future()
        self._queue.append((records, fut))
        self._wake_committer.set()
        return await asyncio.shield(fut)

    async def _commit_loop(self) -> None:
        while True:
            await self._wake_committer.wait()
            self._wake_committer.clear()
            if not self._queue:
                continue
            batch, self._queue = self._queue, []
            records = [rec for recs, _ in batch for rec in recs]
            self._batch_no += 1
            for rec in records:
                rec[BATCH_KEY] = self._batch_no
            data = encode_batch(records)
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            good_bytes = self._journal_bytes
            try:
                await self._run_journal_io(self._append_sync, data, dir_dirty)
            except OSError as exc:
                # Put the journal back as it was before this batch, so that records nobody was told are
                # durable cannot come back at the next start (best effort: the disk is failing).
                with contextlib.suppress(OSError):
                    await self._run_journal_io(self._truncate_sync, good_bytes)
                self._go_degraded(f"journal write failed: {exc}")
                err = JournalAppendFailed()
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            self._journal_bytes += len(data)
            results: list[list[Applied]] = []
            for recs, _ in batch:
                results.append([self._apply(rec) for rec in recs])
            for (_, fut), applied in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(applied)
            if self._journal_bytes > self.cfg.journal_compact_bytes and not self._queue:
                # The snapshot is taken here, on the loop, where the state lives; only the file work is
                # handed to the I/O thread.
                snapshot = self.state.snapshot_records()
                try:
                    await self._run_journal_io(self._compact_sync, snapshot)
                except OSError as exc:
                    self._go_degraded(f"journal compaction failed: {exc}")

    def _go_degraded(self, why: str) -> None:
        self.degraded = why
        log.error("spool: %s; new writes go to the backend directly until the journal is rewritten", why)
        if self._healer is None or self._healer.done():
            self._healer = asyncio.create_task(self._heal_loop(), name="spool-heal")
            self._healer.add_done_callback(crash_on_failure)

    async def _heal_loop(self) -> None:
        """Out of service: try, every few seconds, to rewrite the journal from the state in memory into a new
        file (tmp, fsync, rename, fsync the directory). A failed fsync leaves the old file's pages in an
        unknown state; a new file that was written and fsynced without error is known good. Once it is in
        place the spool is back in service, with no restart."""
        while self.degraded is not None:
            await self._clock.sleep(HEAL_INTERVAL_S)
            snapshot = self.state.snapshot_records()
            try:
                await self._run_journal_io(self._compact_sync, snapshot)
            except OSError as exc:
                log.debug("spool: journal rewrite failed, still out of service: %s", exc)
                continue
            log.warning("spool: journal rewritten; back in service (was: %s)", self.degraded)
            self.degraded = None
            self.unjournaled_keys.clear()
            kept, self._kept_files, self._kept_bytes = self._kept_files, [], 0
            if kept:
                self.unlink_later(tuple(kept))
            self.space.set_used(self.state.bytes_on_disk)
            self._wake_waiters()

    async def commit_bookkeeping(self, records: list[dict[str, Any]]) -> None:
        """Journal the drain's own bookkeeping (its uploads and intents on the store, opened or closed). With
        the journal out of service they are applied in memory only: a restart replays the older journal, whose
        open uploads and intents recovery resolves against the store, while this process must not count
        them as pending (flush would wait for a journal write that cannot happen until the disk heals)."""
        assert all(str(rec["t"]).startswith("bmp") for rec in records), records
        try:
            await self.commit(records)
        except SpoolWriteFailed:
            if self.degraded is None:
                raise
            for rec in records:
                self._apply(rec)

    def forget_unjournaled(self, bucket: str, key: str, garbage: tuple[str, ...], nbytes: int) -> None:
        """A drained entry whose ``done`` could not be journaled: forgotten in memory, its files kept (a
        restart replays the old journal and needs them), its key closed to other writes until the journal
        is rewritten (a write through to the store now would be overwritten by that replay)."""
        self.unjournaled_keys.add((bucket, key))
        self._kept_files.extend(garbage)
        self._kept_bytes += nbytes
        self.space.set_used(self.state.bytes_on_disk + self._kept_bytes)

    def _truncate_sync(self, length: int) -> None:
        os.ftruncate(self._journal_fd, length)
        os.fdatasync(self._journal_fd)

    def _append_sync(self, data: bytes, dir_dirty: bool) -> None:
        if dir_dirty:
            durable.fsync_dir(self.data_dir)
        durable.append(self._journal_fd, data)

    def _compact_sync(self, records: list[dict[str, Any]]) -> None:
        """Rewrite the journal with only what is live: tmp, fsync, rename, fsync the directory."""
        data = file_header() + encode_batch(records)
        durable.replace_file(self.root / JOURNAL_NAME, data, tmp=self.root / (JOURNAL_NAME + ".tmp"))
        if self._journal_fd >= 0:
            os.close(self._journal_fd)
            self._journal_fd = os.open(self.root / JOURNAL_NAME, os.O_WRONLY | os.O_APPEND)
        log.info("spool: journal compacted from %d to %d bytes", self._journal_bytes, len(data))
        self._journal_bytes = len(data)

    def _apply(self, rec: Mapping[str, Any]) -> Applied:
        applied = self.state.apply(rec)
        if rec["t"] == "put":
            self.acked_bytes += int(self.state.entries[int(rec["seq"])].size)
        self._after(applied)
        if rec["t"] in ("bmpu_end", "bmpi_end"):  # flush counts open drain uploads and intents too
            self._wake_waiters()
        return applied

    def _after(self, applied: Applied) -> None:
        """Carry out what a state change asks for: unlink garbage, cancel uploads, wake waiters."""
        self.space.set_used(self.state.bytes_on_disk + self._kept_bytes)
        if applied.garbage:
            self.unlink_later(applied.garbage)
        for seq in applied.cancel:
            self.on_cancel(seq)
        if applied.removed:
            self._wake_waiters()
        self.drain_wakeup.set()

    def unlink_later(self, files: tuple[str, ...]) -> None:
        paths = [self.data_dir / f for f in files]
        asyncio.get_running_loop().run_in_executor(self._executor, _unlink_all, paths)

    # -- the state, as the HTTP front sees it ----------------------------------------------------------------
    # The spool is the only caller of its state and its space: the front and the drain ask these.

    def has_key(self, bucket: str, key: str) -> bool:
        """True while any entry of the key (live, or superseded but still uploading) is in the spool."""
        return self.state.has_key(bucket, key)

    def lookup(self, bucket: str, key: str) -> Entry | None:
        """The live entry of a key (a put to serve, or a tombstone), if the spool has one."""
        return self.state.lookup(bucket, key)

    def has_bucket_prefix(self, bucket: str, prefix: str) -> bool:
        return self.state.has_bucket_prefix(bucket, prefix)

    def live_under(self, bucket: str, prefix: str) -> Iterator[Entry]:
        return self.state.live_under(bucket, prefix)

    def entries(self) -> list[Entry]:
        """Every entry not yet on the backend, oldest first."""
        return list(self.state.entries.values())

    def entry(self, seq: int) -> Entry | None:
        return self.state.entries.get(seq)

    def uploads(self) -> list[Upload]:
        """The client multipart uploads open in the spool."""
        return list(self.state.uploads.values())

    def upload(self, upload_id: str) -> Upload | None:
        return self.state.uploads.get(upload_id)

    def admit(self, nbytes: int, *, must: bool = False) -> Admission:
        """Reserve room for a write of ``nbytes`` (see :class:`~gateway.core.spool_state.SpoolSpace`)."""
        return self.space.admit(nbytes, must=must)

    def release(self, reserved: int) -> None:
        """Give back a reservation of :meth:`admit` (the write committed or failed)."""
        self.space.release(reserved)

    # Record builders: seqs are assigned here, in the order the front asks for them.

    def put_record(
        self,
        *,
        bucket: str,
        key: str,
        file: str,
        size: int,
        md5: str,
        meta: Sequence[tuple[str, str]],
        access_key: str,
        lane: str,
        now_wall: float,
    ) -> dict[str, Any]:
        return self.state.put_record(
            bucket=bucket,
            key=key,
            file=file,
            size=size,
            md5=md5,
            meta=meta,
            access_key=access_key,
            lane=lane,
            now_wall=now_wall,
        )

    def delete_record(
        self, *, bucket: str, key: str, access_key: str, lane: str, now_wall: float
    ) -> dict[str, Any]:
        return self.state.delete_record(
            bucket=bucket, key=key, access_key=access_key, lane=lane, now_wall=now_wall
        )

    def create_upload_record(
        self,
        *,
        upload_id: str,
        bucket: str,
        key: str,
        meta: Sequence[tuple[str, str]],
        access_key: str,
        lane: str,
        now_wall: float,
    ) -> dict[str, Any]:
        return self.state.create_upload_record(
            upload_id=upload_id,
            bucket=bucket,
            key=key,
            meta=meta,
            access_key=access_key,
            lane=lane,
            now_wall=now_wall,
        )

    @staticmethod
    def part_record(
        *, upload_id: str, number: int, file: str, size: int, md5: str, checksum: str = ""
    ) -> dict[str, Any]:
        return SpoolState.part_record(
            upload_id=upload_id, number=number, file=file, size=size, md5=md5, checksum=checksum
        )

    @staticmethod
    def abort_record(upload_id: str) -> dict[str, Any]:
        return SpoolState.abort_record(upload_id)

    def complete_record(
        self,
        upload: Upload,
        requested: Sequence[tuple[int, str]],
        now_wall: float,
        *,
        part_checksums: Sequence[Mapping[str, str]] = (),
        object_checksum: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """Validate a CompleteMultipartUpload part list (S3's errors); the put record that completes it."""
        return self.state.complete_record(
            upload, requested, now_wall, part_checksums=part_checksums, object_checksum=object_checksum
        )

    # -- the drain asks --------------------------------------------------------------------------------------

    def pending_objects(self) -> int:
        return len(self.state.entries)

    def drainable(self, now: float, limit: int) -> list[Entry]:
        """Up to ``limit`` entries that may start uploading now, keeping every ordering rule."""
        return self.state.drainable(now, limit)

    def next_retry_at(self, now: float) -> float | None:
        return self.state.next_retry_at(now)

    def oldest_acked_at(self) -> float | None:
        return self.state.oldest_acked_at()

    def drain_started(self, entry: Entry) -> None:
        self.state.start_upload(entry)

    def drain_failed(self, entry: Entry, retry_at: float, error: str) -> None:
        """The attempt failed or was cut: retried after ``retry_at`` (a superseded entry leaves now)."""
        self._after(self.state.upload_failed(entry, retry_at, error))

    def drain_succeeded(self, entry: Entry) -> None:
        """The store holds the entry; :meth:`drain_done` journals it."""
        self.state.upload_succeeded(entry)
        self.note_drained(entry.size)

    async def drain_done(self, entry: Entry) -> None:
        """Journal that a drained entry is on the store (its files go). With the journal out of service the
        entry is forgotten in memory, its files kept: see :meth:`forget_unjournaled`."""
        done = self.state.done_record(entry.seq, entry)
        try:
            await self.commit([done])
        except SpoolWriteFailed:
            applied = self.state.apply(done)
            self.forget_unjournaled(entry.bucket, entry.key, applied.garbage, entry.size)
            self._after(Applied(removed=applied.removed))

    def is_in_doubt(self, entry: Entry) -> bool:
        return self.state.is_in_doubt(entry)

    def mark_in_doubt(self, entry: Entry) -> None:
        """A completing request of the entry went unanswered: its key's newest state is fenced."""
        self.state.in_doubt.add((entry.bucket, entry.key))

    def clear_in_doubt(self, entry: Entry) -> None:
        self.state.in_doubt.discard((entry.bucket, entry.key))

    def note_fence_reapply(self) -> None:
        self.fence_reapplies += 1

    async def journal_wire(self, entry: Entry) -> None:
        """Journal that a request completing ``entry`` may be on its way to the store (unless one is open).
        With the journal out of service the request goes out unrecorded."""
        if not self.state.wire_needed(entry):
            return
        try:
            await self.commit([self.state.wire_record(entry)])
        except SpoolWriteFailed:
            if self.degraded is None:
                raise

    async def journal_unwire(self, entries: Sequence[Entry]) -> None:
        """Settle the wires of entries none of whose requests can still be applied; best effort."""
        records = [self.state.unwire_record(e) for e in entries if self.state.unwire_needed(e)]
        if records:
            with contextlib.suppress(SpoolWriteFailed):
                await self.commit(records)

    def backend_uploads(self) -> Mapping[str, tuple[str, str, str, str]]:
        """Drain multipart uploads open on the store: upload id -> (bucket, key, access key, lane)."""
        return MappingProxyType(self.state.backend_uploads)

    def backend_intents(self) -> Mapping[str, tuple[str, str, str, str, float]]:
        """Drain uploads about to be created: token -> (bucket, key, access key, lane, not before)."""
        return MappingProxyType(self.state.backend_intents)

    async def journal_backend_intent(self, token: str, entry: Entry, not_before: float) -> None:
        await self.commit([self.state.backend_intent_record(token, entry, not_before)])

    async def journal_backend_upload(self, upload_id: str, entry: Entry, *, ends_intent: str | None) -> None:
        """Journal a drain upload's id (and the end of the intent it was created under, if journaled)."""
        records = [self.state.backend_upload_record(upload_id, entry)]
        if ends_intent is not None:
            records.append(self.state.backend_intent_end_record(ends_intent))
        await self.commit_bookkeeping(records)

    async def journal_backend_upload_end(self, upload_id: str) -> None:
        await self.commit_bookkeeping([self.state.backend_upload_end_record(upload_id)])

    async def journal_backend_intent_end(self, token: str) -> None:
        await self.commit_bookkeeping([self.state.backend_intent_end_record(token)])

    # -- waiting for the backend -----------------------------------------------------------------------------

    def _wake_waiters(self) -> None:
        keep = []
        for bucket, prefix, max_seq, fut in self._flush_waiters:
            if fut.done():
                continue
            if self._pending(bucket, prefix, max_seq) == 0:
                fut.set_result(None)
            else:
                keep.append((bucket, prefix, max_seq, fut))
        self._flush_waiters = keep
        for ident in list(self._key_waiters):
            if not self.state.has_key(*ident):
                for fut in self._key_waiters.pop(ident):
                    if not fut.done():
                        fut.set_result(None)

    def _stale_uploads(self, bucket: str, prefix: str) -> int:
        """Backend multipart uploads a drain opened and has not completed or aborted yet, under the prefix.
        Flush waits for them too: "durable" includes "nothing half-done left on the store"."""
        return self.state.open_backend_work(bucket, prefix)

    def _pending(self, bucket: str, prefix: str, max_seq: int) -> int:
        return self.state.pending_under(bucket, prefix, max_seq)[0] + self._stale_uploads(bucket, prefix)

    async def flush(self, bucket: str, prefix: str, timeout_s: float) -> FlushResult:
        """Wait until everything acknowledged under bucket/prefix before this call is on the backend."""
        started = self._clock.monotonic()
        max_seq = self.state.last_seq
        if self._pending(bucket, prefix, max_seq):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._flush_waiters.append((bucket, prefix, max_seq, fut))
            self.drain_wakeup.set()
            try:
                await self._clock.wait_for(asyncio.shield(fut), timeout_s)
            except TimeoutError:
                pass
            finally:
                if not fut.done():
                    fut.cancel()
        count, nbytes, oldest = self.state.pending_under(bucket, prefix, max_seq)
        count += self._stale_uploads(bucket, prefix)
        now_wall = self._clock.wall()
        return FlushResult(
            durable=count == 0,
            pending_objects=count,
            pending_bytes=nbytes,
            oldest_pending_age_s=None if oldest is None else max(0.0, now_wall - oldest),
            waited_s=self._clock.monotonic() - started,
        )

    async def wait_empty(self, timeout_s: float, *, poll_s: float = 0.1) -> bool:
        """Wait until every acknowledged object is on the backend and no drain upload is left half-done
        (client multipart uploads still open do not count: they are the client's to finish). False on
        timeout. Used on shutdown, so it polls rather than adding another waiter kind."""
        deadline = self._clock.monotonic() + timeout_s
        while self.state.entries or self.state.open_backend_work():
            if self.degraded is not None or self._clock.monotonic() >= deadline:
                return False
            self.drain_wakeup.set()
            await self._clock.sleep(poll_s)
        return True

    async def wait_key_clear(self, bucket: str, key: str, timeout_s: float) -> bool:
        """Wait until no entry of the key is in the spool (drained or dropped); False on timeout."""
        ident = (bucket, key)
        if not self.state.has_key(bucket, key):
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._key_waiters.setdefault(ident, []).append(fut)
        self.drain_wakeup.set()
        try:
            await self._clock.wait_for(asyncio.shield(fut), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()

    def note_drained(self, nbytes: int) -> None:
        self.drained_bytes += nbytes
        self._drained_recent.append((self._clock.monotonic(), nbytes))

    def drain_rate_bps(self, window_s: float = DRAIN_RATE_WINDOW_S) -> float:
        """Bytes confirmed on the backend per second over the last ``window_s``."""
        since = self._clock.monotonic() - window_s
        recent = self._drained_recent
        while recent and recent[0][0] < since:
            recent.popleft()
        return sum(n for _, n in recent) / window_s

    # -- status ----------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now_wall = self._clock.wall()
        oldest = self.state.oldest_acked_at()
        return {
            "enabled": True,
            "dir": str(self.root),
            "degraded": self.degraded,
            "capacity_bytes": self.space.capacity_bytes,
            "used_bytes": self.space.used_bytes,
            "reserved_bytes": self.space.reserved_bytes,
            "full": self.space.full,
            "when_full": self.cfg.when_full,
            "pending_objects": len(self.state.entries),
            "pending_bytes": sum(e.size for e in self.state.entries.values()),
            "open_uploads": len(self.state.uploads),
            "backend_uploads_open": self.state.open_backend_work(),
            "keys_in_doubt": len(self.state.in_doubt),
            "fence_reapplies_total": self.fence_reapplies,
            "oldest_pending_age_s": None if oldest is None else max(0.0, now_wall - oldest),
            "acked_bytes_total": self.acked_bytes,
            "drained_bytes_total": self.drained_bytes,
            "drain_rate_bps": self.drain_rate_bps(),
            "pending_by_prefix": [
                {"bucket": b, "prefix": p, "bytes": n}
                for (b, p), n in sorted(self.state.pending_by_prefix().items())
            ],
            "recovery": None if self.recovery is None else self.recovery.summary(),
            "direct_io": self.direct_io,
        }


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

    def __init__(self, spool: Spool, file_id: str, reserved_bytes: int) -> None:
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
            await self._spool.run_io(_unlink_all, [self._path()])
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
            await self._spool.run_io(_unlink_all, [path])
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
        await self._spool.run_io(_unlink_all, [self._path()])


async def _owned(fut: asyncio.Future[T], release: Callable[[T], object]) -> T:
    """The result of thread work that hands over a resource (an open descriptor). A caller cancelled while
    the thread still runs (a drain cut short, a shutdown) cannot stop the thread: the resource is then
    released as soon as it arrives, instead of leaking (an open descriptor of a file the spool deletes later
    keeps its disk space in use)."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:

        def release_late(f: asyncio.Future[T]) -> None:
            if not f.cancelled() and f.exception() is None:
                release(f.result())

        fut.add_done_callback(release_late)
        raise


def crash_on_failure(task: asyncio.Task[Any]) -> None:
    """A background task that dies takes the process down loudly: a journal committer or a
    drainer that silently stopped would leave writers waiting forever."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.critical("background task %s died: %r; exiting", task.get_name(), exc, exc_info=exc)
        os._exit(70)


def _write_failed(exc: OSError) -> SpoolWriteFailed:
    if exc.errno == errno.ENOSPC:
        log.error("spool: disk full while writing an upload: %s", exc)
        return SpoolWriteFailed("The gateway's spool disk is full. Please retry.")
    log.error("spool: write failed: %s", exc)
    return SpoolWriteFailed()


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


def _direct_io_works(data_dir: Path) -> bool:
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


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
