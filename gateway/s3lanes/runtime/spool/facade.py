"""The :class:`Spool` facade: the one owner of the spool's state, journal and data files, on the event loop.

The HTTP front and the drainer ask it (lookups, room, records to commit; what is drainable, and that a drain
started, failed, succeeded, is done); it applies every journaled record to its
:class:`~s3lanes.core.spool_state.SpoolState` and carries out what each change asks for (files to unlink,
uploads to cut, waiters to wake). Flush waiters and the journal's healing live here; the data files are
:mod:`.disk`, the journal file and its group commit :mod:`.journal`, start-up :mod:`.recovery`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import secrets
import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar

from s3lanes.clock import Clock
from s3lanes.config import SpoolConfig
from s3lanes.core.journal import encode_batch
from s3lanes.core.journal_records import (
    BackendIntent,
    BackendIntentEnd,
    BackendUpload,
    BackendUploadEnd,
    Complete,
    Put,
    Record,
)
from s3lanes.core.spool_state import Admission, Applied, Entry, SpoolSpace, SpoolState, Upload
from s3lanes.runtime.spool.disk import (
    FREE_PIECES_KEPT,
    PIECE_BYTES,
    PiecePool,
    SpoolFileWriter,
    direct_io_works,
    unlink_all,
)
from s3lanes.runtime.spool.errors import JournalAppendFailed, SpoolWriteFailed, crash_on_failure
from s3lanes.runtime.spool.journal import GroupCommit, JournalFile, JournalHooks
from s3lanes.runtime.spool.recovery import RecoveryReport, recover
from s3lanes.runtime.tasks import cancel_and_wait

log = logging.getLogger("s3lanes.spool")

T = TypeVar("T")

P = ParamSpec("P")


def _of_state(method: Callable[Concatenate[SpoolState, P], T]) -> Callable[Concatenate[Spool, P], T]:
    """A method of the :class:`Spool` that is ``method`` of its state."""

    @functools.wraps(method)
    def of_state(spool: Spool, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(spool.state, *args, **kwargs)

    return of_state


DRAIN_RATE_WINDOW_S = 10.0
HEAL_INTERVAL_S = 2.0
_BOOKKEEPING = (BackendUpload, BackendUploadEnd, BackendIntent, BackendIntentEnd)
ROOM_STEP_BYTES = 8 * 1024 * 1024  # see Reservation.grow


@dataclass(frozen=True, slots=True)
class FlushResult:
    durable: bool
    pending_objects: int
    pending_bytes: int
    oldest_pending_age_s: float | None
    waited_s: float


@dataclass(frozen=True, slots=True)
class SpoolFigures:
    capacity_bytes: int
    used_bytes: int  # on disk (objects, parts of open uploads)
    reserved_bytes: int  # by writes in progress
    full: bool  # above high water, until below low water
    pending_objects: int
    pending_bytes: int
    open_uploads: int
    keys_in_doubt: int
    oldest_acked_at: float | None  # wall clock
    pending_by_prefix: dict[tuple[str, str], int]  # (bucket, top-level prefix) -> bytes


class Reservation:
    """Room held in the spool for one write, from :meth:`Spool.reserve` until its block ends."""

    def __init__(self, spool: Spool, nbytes: int, admission: Admission) -> None:
        self._spool = spool
        self.nbytes = nbytes
        self.admission = admission
        self.grown = 0  # held beyond ``nbytes`` for a body of unknown length (see grow)

    @property
    def admitted(self) -> bool:
        return self.admission is Admission.SPOOL

    def grow(self, seen: int) -> bool:
        """Room for a body of unknown length (chunked, no Content-Length), held as it arrives:
        ``seen`` bytes of it so far, ROOM_STEP_BYTES at a time. False once the spool cannot hold more."""
        while seen > self.grown:
            if self._spool.admit(ROOM_STEP_BYTES, must=True) is not Admission.SPOOL:
                return False
            self.grown += ROOM_STEP_BYTES
        return True

    def writer(self) -> SpoolFileWriter:
        """A new spool file for the write's bytes."""
        return self._spool.writer(self.nbytes)

    async def commit(self, writer: SpoolFileWriter, rec: Record) -> None:
        """Journal the record of the bytes ``writer`` holds; the file is discarded if that fails before the
        record can have reached the journal."""
        try:
            await self._spool.commit([rec])
        except JournalAppendFailed:
            # The record may have reached the journal: its data must stay for recovery (which removes the
            # file as an orphan if the record did not survive).
            raise
        except BaseException:
            await writer.discard()
            raise


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
        self._journal = JournalFile(root)
        self._dir_dirty = False
        self._group: GroupCommit | None = None  # from open() to close()
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
        report, batch_no = await self.run_io(
            recover, self.state, self._journal, self.data_dir, self.cfg.journal_compact_bytes
        )
        if self.cfg.direct_io:
            self.direct_io = report.direct_io = await self.run_io(direct_io_works, self.data_dir)
        if self.cfg.capacity_bytes == 0:
            usage = await self.run_io(shutil.disk_usage, self.root)
            self.space.capacity_bytes = int(usage.free * 0.8) + self.state.bytes_on_disk
        self.space.set_used(self.state.bytes_on_disk)
        hooks = JournalHooks(
            run_io=self._run_journal_io,
            dir_to_sync=self._take_dir_dirty,
            apply=self._apply,
            snapshot=self.state.snapshot_records,
            failed=self._go_degraded,
        )
        self._group = GroupCommit(
            self._journal, hooks, batch_no=batch_no, compact_bytes=self.cfg.journal_compact_bytes
        )
        self._group.start()
        if report.lost_entries:
            await self.commit([self.state.done_record(int(s)) for s in report.lost_entries])
        expired = self.state.expired_uploads(self._clock.wall(), self.cfg.abandoned_upload_s)
        if expired:
            await self.commit([self.state.abort_record(u.upload_id) for u in expired])
        self.recovery = report
        (log.error if report.lost_entries else log.info)("%s", report.summary())
        self.drain_wakeup.set()
        return report

    async def close(self) -> None:
        await cancel_and_wait(self._healer)
        self._healer = None
        if self._group is not None:
            # Let queued records land first: their writers are waiting for the ack.
            if self._group.waiting and self.degraded is None:
                await self.commit([])  # FIFO: returns once every queued batch is in the journal
            await self._group.stop()
            self._group = None
        if self._journal.is_open:
            await self._run_journal_io(self._journal.close)
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

    def _take_dir_dirty(self) -> Path | None:
        """The data directory, if files were created in it since the last batch (the batch fsyncs it)."""
        dirty, self._dir_dirty = self._dir_dirty, False
        return self.data_dir if dirty else None

    # -- the journal (group commit) --------------------------------------------------------------------------

    async def commit(self, records: Sequence[Record]) -> list[Applied]:
        """Append records durably; resolves once they are in the journal and applied to the state."""
        if self._group is None:
            raise SpoolWriteFailed("The spool is not open.")
        if self.degraded is not None:
            raise SpoolWriteFailed(f"The gateway's spool is out of service: {self.degraded}")
        try:
            encode_batch([r.encode() for r in records])  # one that cannot be encoded fails its own request
        except (TypeError, ValueError, OverflowError) as exc:
            raise SpoolWriteFailed(f"The spool cannot record this request: {exc}") from None
        return await asyncio.shield(self._group.submit(records))

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
                await self._run_journal_io(self._journal.rewrite, snapshot)
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

    async def commit_bookkeeping(self, records: Sequence[Record]) -> None:
        """Journal the drain's own bookkeeping (its uploads and intents on the store, opened or closed). With
        the journal out of service they are applied in memory only: a restart replays the older journal, whose
        open uploads and intents recovery resolves against the store, while this process must not count
        them as pending (flush would wait for a journal write that cannot happen until the disk heals)."""
        assert all(isinstance(rec, _BOOKKEEPING) for rec in records), records
        try:
            await self.commit(records)
        except SpoolWriteFailed:
            if self.degraded is None:
                raise
            for rec in records:
                self._apply(rec)

    def unjournaled(self, bucket: str, key: str | None = None) -> bool:
        """Whether a key (with ``key`` None: any key of the bucket) is closed to writes until the journal is
        rewritten (see :meth:`forget_unjournaled`)."""
        if key is not None:
            return (bucket, key) in self.unjournaled_keys
        return any(b == bucket for b, _ in self.unjournaled_keys)

    def forget_unjournaled(self, bucket: str, key: str, garbage: tuple[str, ...], nbytes: int) -> None:
        """A drained entry whose ``done`` could not be journaled: forgotten in memory, its files kept (a
        restart replays the old journal and needs them), its key closed to other writes until the journal
        is rewritten (a write through to the store now would be overwritten by that replay)."""
        self.unjournaled_keys.add((bucket, key))
        self._kept_files.extend(garbage)
        self._kept_bytes += nbytes
        self.space.set_used(self.state.bytes_on_disk + self._kept_bytes)

    def _apply(self, rec: Record) -> Applied:
        applied = self.state.apply(rec)
        if isinstance(rec, (Put, Complete)):
            self.acked_bytes += self.state.entries[rec.seq].size
        self._after(applied)
        if isinstance(
            rec, (BackendUploadEnd, BackendIntentEnd)
        ):  # flush counts open drain uploads and intents too
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
        asyncio.get_running_loop().run_in_executor(self._executor, unlink_all, paths)

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

    def pending_under(self, bucket: str, prefix: str) -> tuple[int, int, float | None]:
        """(objects, bytes, oldest acknowledgement) not yet on the backend under bucket/prefix."""
        return self.state.pending_under(bucket, prefix)

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
        """Reserve room for a write of ``nbytes`` (see :class:`~s3lanes.core.spool_state.SpoolSpace`)."""
        return self.space.admit(nbytes, must=must)

    def release(self, reserved: int) -> None:
        """Give back a reservation of :meth:`admit` (the write committed or failed)."""
        self.space.release(reserved)

    @contextlib.asynccontextmanager
    async def reserve(self, nbytes: int, *, must: bool = False) -> AsyncIterator[Reservation]:
        """Room for one write of ``nbytes`` (see :meth:`admit`), held until the block ends, whatever way it
        ends: admit, write, commit or discard, release. The block looks at :attr:`Reservation.admitted`
        first: a write that got no room must not be spooled (nothing is held then)."""
        held = Reservation(self, nbytes, self.admit(nbytes, must=must))
        try:
            yield held
        finally:
            if held.admitted:
                self.release(nbytes + held.grown)

    # Record builders: seqs are assigned here, in the order the front asks for them. Each is the state's own
    # builder (same signature), as the front reaches the state only through the spool.
    put_record = _of_state(SpoolState.put_record)
    delete_record = _of_state(SpoolState.delete_record)
    create_upload_record = _of_state(SpoolState.create_upload_record)
    part_record = staticmethod(SpoolState.part_record)
    abort_record = staticmethod(SpoolState.abort_record)
    complete_record = _of_state(SpoolState.complete_record)

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
        records: list[Record] = [self.state.backend_upload_record(upload_id, entry)]
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

    def figures(self) -> SpoolFigures:
        """The spool's gauges, read at once (metrics scrapes, status)."""
        return SpoolFigures(
            capacity_bytes=self.space.capacity_bytes,
            used_bytes=self.space.used_bytes,
            reserved_bytes=self.space.reserved_bytes,
            full=self.space.full,
            pending_objects=len(self.state.entries),
            pending_bytes=sum(e.size for e in self.state.entries.values()),
            open_uploads=len(self.state.uploads),
            keys_in_doubt=len(self.state.in_doubt),
            oldest_acked_at=self.state.oldest_acked_at(),
            pending_by_prefix=self.state.pending_by_prefix(),
        )

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
