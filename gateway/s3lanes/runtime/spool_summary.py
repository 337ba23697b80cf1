"""Which buckets the spool may hold something of: a small shared file the workers of a node map in memory.

Theory of operation
-------------------
With ``[server] workers = N`` and the spool on, worker 0 owns the spool; the others forward to it what may
touch the spool (``s3lanes.http.forward``). Most reads (dataset objects that were never spooled) should not
pay that round trip, so the owner publishes which buckets the spool may hold data of, and a worker reads it
from shared memory, with no system call, before each request.

The summary is a file of ``HEADER_BYTES + SLOTS`` bytes, mapped shared by every worker. A bucket hashes to
one slot (CRC-32); a slot is 1 while some bucket of that slot may have spooled entries, uploads or writes in
progress, else 0. Byte 0 of the header is 1 once an owner has recovered the spool and published; until then
(a fresh node) every bucket counts as spooled. Collisions only cost a forwarded read, never a wrong answer.

It is a superset, never a subset, of the truth, which is what makes a local read safe:

- a write that may spool marks its bucket's slot *before* the spool sees it (:meth:`SummaryWriter.hold`), so
  the mark is in memory before the write's 200 leaves the owner;
- :meth:`SummaryWriter.refresh` recomputes the slots from the spool's state plus the writes held, on the
  owner's event loop (no write can land between reading both); it clears a slot only once nothing of its
  buckets is in the spool (drained) and no write of them is in flight.
- A killed owner leaves its marks in the file (they stay a superset: nothing drains while it is gone); the
  restarted owner recovers the spool, then refreshes.

This is *not* a lock or an ordering mechanism: ordering and read-your-writes come from sending every request
that may touch the spool to its one owner. The summary only says which reads may skip that.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

SLOTS = 65536
HEADER_BYTES = 8
FILE_BYTES = HEADER_BYTES + SLOTS
REFRESH_S = 0.2  # how soon a drained bucket's reads stay local again


def slot_of(bucket: str) -> int:
    return zlib.crc32(bucket.encode("utf-8", "surrogateescape")) % SLOTS


def create_summary(path: Path) -> None:
    """A fresh summary (not published: every bucket counts as spooled), replacing any previous one. The
    supervisor creates it before it forks the workers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(bytes(FILE_BYTES))
    os.replace(tmp, path)


def _map(path: Path, *, writable: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return mmap.mmap(fd, FILE_BYTES, access=access)
    finally:
        os.close(fd)


class SummaryReader:
    """A worker's view of the summary (read only)."""

    def __init__(self, path: Path) -> None:
        self._mm = _map(path, writable=False)

    def published(self) -> bool:
        return self._mm[0] == 1

    def may_hold(self, bucket: str) -> bool:
        """Whether the spool may hold something of ``bucket`` (True until the owner has published)."""
        return self._mm[0] != 1 or self._mm[HEADER_BYTES + slot_of(bucket)] != 0

    def close(self) -> None:
        self._mm.close()


class SummaryWriter:
    """The owner's side: marks buckets as writes to them start, and refreshes the slots from the spool."""

    def __init__(self, path: Path, spooled_buckets: Callable[[], Iterable[str]]) -> None:
        self._mm = _map(path, writable=True)
        self._spooled_buckets = spooled_buckets
        self._held: dict[str, int] = {}  # bucket -> writes in flight
        # The slots at 1 in the file (a previous owner's marks too, cleared by the first refresh).
        body = self._mm[HEADER_BYTES:FILE_BYTES]
        self._set = {i for i, v in enumerate(body) if v}

    @contextlib.contextmanager
    def hold(self, bucket: str) -> Iterator[None]:
        """Around a write that may spool: its bucket counts as spooled from before the write until a refresh
        after it (by then the spool's state has the write, or the write did not spool)."""
        self._held[bucket] = self._held.get(bucket, 0) + 1
        i = slot_of(bucket)
        self._mm[HEADER_BYTES + i] = 1
        self._set.add(i)
        try:
            yield
        finally:
            left = self._held[bucket] - 1
            if left:
                self._held[bucket] = left
            else:
                del self._held[bucket]

    def refresh(self) -> int:
        """Recompute every slot from the spool's state and the writes held; publish. Returns the slots set."""
        wanted = {slot_of(bucket) for bucket in (*self._spooled_buckets(), *self._held)}
        for i in wanted - self._set:
            self._mm[HEADER_BYTES + i] = 1
        for i in self._set - wanted:
            self._mm[HEADER_BYTES + i] = 0
        self._set = wanted
        self._mm[0] = 1
        return len(wanted)

    async def run(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(REFRESH_S)

    def close(self) -> None:
        self._mm.close()
