"""The write spool on local disk: data files, the journal with group commit, recovery, flush waiters.

Modules: :mod:`.facade` (:class:`Spool`, the one owner of the state; waiters, healing),
:mod:`.disk` (data files, the ``O_DIRECT`` piece writer), :mod:`.journal` (the file, group commit),
:mod:`.recovery` (start-up), :mod:`.errors`. Durable writes follow :mod:`s3lanes.durable`.

Layout under the spool directory::

    journal            framed msgpack records (s3lanes.core.journal), appended with group commit
    data/<random id>   one file per object or part; names never come from object keys

The durability recipe of one acknowledged write: the data file is written and fsynced, the data directory
is fsynced (once per journal batch, for every file created since the last batch), then the record is
appended to the journal and the journal fdatasynced, again once per batch for every writer waiting. Only
then is the record applied to :class:`~s3lanes.core.spool_state.SpoolState` and the client answered. A
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

from s3lanes.runtime.spool.disk import PIECE_BYTES, PiecePool, SpoolFileWriter
from s3lanes.runtime.spool.errors import JournalAppendFailed, SpoolWriteFailed, crash_on_failure
from s3lanes.runtime.spool.facade import HEAL_INTERVAL_S, FlushResult, Reservation, Spool, SpoolFigures
from s3lanes.runtime.spool.journal import JOURNAL_NAME
from s3lanes.runtime.spool.recovery import RecoveryReport

__all__ = [
    "HEAL_INTERVAL_S",
    "JOURNAL_NAME",
    "PIECE_BYTES",
    "FlushResult",
    "JournalAppendFailed",
    "PiecePool",
    "RecoveryReport",
    "Reservation",
    "Spool",
    "SpoolFigures",
    "SpoolFileWriter",
    "SpoolWriteFailed",
    "crash_on_failure",
]
