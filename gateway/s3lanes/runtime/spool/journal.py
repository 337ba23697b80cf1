"""The spool's journal: the file (appended in batches, truncated back after a failed append, rewritten whole
by compaction) and the group commit that batches the records of concurrent writers into one append and one
``fdatasync``. The codec (frames, replay) is :mod:`s3lanes.core.journal`, the records
:mod:`s3lanes.core.journal_records`. :class:`JournalFile`'s methods block: they run on the journal thread;
:class:`GroupCommit` runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s3lanes import durable
from s3lanes.core.journal import BATCH_KEY, encode_batch, file_header
from s3lanes.core.journal_records import Record
from s3lanes.core.spool_state import Applied
from s3lanes.runtime.spool.errors import JournalAppendFailed, crash_on_failure
from s3lanes.runtime.tasks import cancel_and_wait

log = logging.getLogger("s3lanes.spool")

JOURNAL_NAME = "journal"


class JournalFile:
    """The open journal: its descriptor (``O_APPEND``) and its length, the end of its last whole batch."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / JOURNAL_NAME
        self.fd = -1
        self.nbytes = 0

    @property
    def is_open(self) -> bool:
        return self.fd >= 0

    def read(self) -> bytes:
        return self.path.read_bytes() if self.path.exists() else b""

    def repair(self, valid_bytes: int, torn_bytes: int) -> None:
        """After replay: cut a torn tail (or write the header of a new or headless file), durably."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if valid_bytes == 0:
                os.ftruncate(fd, 0)
                durable.write_all(fd, file_header())
                self.nbytes = len(file_header())
            else:
                if torn_bytes:
                    log.warning("journal: truncating a torn tail of %d bytes", torn_bytes)
                    os.ftruncate(fd, valid_bytes)
                self.nbytes = valid_bytes
            os.fsync(fd)
        finally:
            os.close(fd)
        durable.fsync_dir(self.root)

    def open_append(self) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def append(self, data: bytes, sync_dir: Path | None = None) -> None:
        """One batch: ``sync_dir`` (the data directory, when files were created since the last batch) is
        fsynced first, so that no record lands durably before the files it names."""
        if sync_dir is not None:
            durable.fsync_dir(sync_dir)
        durable.append(self.fd, data)
        self.nbytes += len(data)

    def truncate(self, length: int) -> None:
        """Back to ``length`` (a batch whose append failed must not come back at the next start)."""
        os.ftruncate(self.fd, length)
        os.fdatasync(self.fd)
        self.nbytes = length

    def rewrite(self, records: Iterable[Record]) -> None:
        """Rewrite the journal with only ``records`` (what is live): tmp, fsync, rename, fsync the directory;
        appends then go to the new file."""
        data = file_header() + encode_batch([r.encode() for r in records])
        durable.replace_file(self.path, data, tmp=self.root / (JOURNAL_NAME + ".tmp"))
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        log.info("spool: journal compacted from %d to %d bytes", self.nbytes, len(data))
        self.nbytes = len(data)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            durable.fsync_close(fd)


@dataclass(frozen=True, slots=True)
class JournalHooks:
    """What a :class:`GroupCommit` asks of the spool that owns it."""

    run_io: Callable[..., Awaitable[Any]]  # runs a blocking file call on the journal's I/O thread
    dir_to_sync: Callable[[], Path | None]  # a directory whose entries become durable with the next batch
    apply: Callable[[Record], Applied]  # applies a durable record to the spool's state (on the loop)
    snapshot: Callable[[], list[Record]]  # the records that rebuild the state (a compaction writes them)
    failed: Callable[[str], None]  # the journal failed: the spool stops taking writes


class GroupCommit:
    """Records queued by concurrent writers go to the journal together: one append and one ``fdatasync``
    per batch, numbered (``BATCH_KEY``) so that replay can tell a torn last batch from damage. Only once a
    batch is durable is each record applied (``apply``, on the loop, in journal order) and its writer
    answered; a failed append is cut off the file again (best effort), fails every writer of the batch with
    :class:`JournalAppendFailed` and reports ``failed``. A journal grown past ``compact_bytes`` is
    rewritten from ``snapshot`` once no batch is waiting."""

    def __init__(
        self, journal: JournalFile, hooks: JournalHooks, *, batch_no: int, compact_bytes: int
    ) -> None:
        self._journal = journal
        self._hooks = hooks
        self._batch_no = batch_no
        self._compact_bytes = compact_bytes
        self._queue: list[tuple[Sequence[Record], asyncio.Future[list[Applied]]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="spool-journal")
        self._task.add_done_callback(crash_on_failure)

    @property
    def waiting(self) -> bool:
        """Whether batches are queued and not yet in the journal."""
        return bool(self._queue)

    def submit(self, records: Sequence[Record]) -> asyncio.Future[list[Applied]]:
        """Queue ``records`` (already checked to encode); the future resolves once they are durable and
        applied."""
        fut: asyncio.Future[list[Applied]] = asyncio.get_running_loop().create_future()
        self._queue.append((records, fut))
        self._wake.set()
        return fut

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._queue:
                continue
            batch, self._queue = self._queue, []
            self._batch_no += 1
            maps = [rec.encode() for recs, _ in batch for rec in recs]
            for m in maps:
                m[BATCH_KEY] = self._batch_no
            data = encode_batch(maps)
            sync_dir = self._hooks.dir_to_sync()
            good_bytes = self._journal.nbytes
            try:
                await self._hooks.run_io(self._journal.append, data, sync_dir)
            except OSError as exc:
                # Put the journal back as it was before this batch, so that records nobody was told are
                # durable cannot come back at the next start (best effort: the disk is failing).
                with contextlib.suppress(OSError):
                    await self._hooks.run_io(self._journal.truncate, good_bytes)
                self._hooks.failed(f"journal write failed: {exc}")
                err = JournalAppendFailed()
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            results: list[list[Applied]] = []
            for recs, _ in batch:
                results.append([self._hooks.apply(rec) for rec in recs])
            for (_, fut), applied in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(applied)
            if self._journal.nbytes > self._compact_bytes and not self._queue:
                # The snapshot is taken here, on the loop, where the state lives; only the file work is
                # handed to the I/O thread.
                snapshot = self._hooks.snapshot()
                try:
                    await self._hooks.run_io(self._journal.rewrite, snapshot)
                except OSError as exc:
                    self._hooks.failed(f"journal compaction failed: {exc}")
