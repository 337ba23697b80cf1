"""The spool's journal file: appended in batches (group commit), truncated back after a failed append,
rewritten whole by compaction. The codec (frames, replay) is :mod:`gateway.core.journal`; the records are
:mod:`gateway.core.spool_state`'s. Every method here blocks: the spool runs them on its journal thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from gateway.core.journal import encode_batch, file_header
from gateway.core.journal_records import Record
from gateway.runtime import durable

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
