"""``ObjectReader``: a seekable, read-only stream over one object (or one byte range of it), fetched lazily
with ranged GETs.

Reads smaller than a block are served from one cached block of ``block_bytes`` (fetched at the read position:
a small read-ahead buffer), so a reader that walks a file in small steps (``torch.load``'s zip reader,
``pickle``, ``tarfile``'s 512-byte headers) costs one request per block; a read of a block or more is fetched
directly into the caller's buffer. One block is cached, so memory is bounded by ``block_bytes`` plus what the
caller asks for. Nothing is fetched before the first read; the size comes from a HEAD at the first ``seek``
from the end or read (unless given, or known from a listing or a byte range).

A window ``[start, end)`` of the object can be read as if it were the whole file: positions, ``seek`` and the
size are relative to ``start``, and no request ever reaches outside the window. ``requests`` and
``bytes_fetched`` count the GETs made and the bytes they returned.

Reads return as many bytes as asked for (fewer only at the end), as ``io.BufferedIOBase`` promises, so the
reader can be handed to anything that takes a binary file: ``tarfile.open(fileobj=r, mode="r|*")`` (a
stream) or ``mode="r:"`` (random access: headers are read, members skipped with ``seek``), ``zipfile``,
``torch.load``, ``PIL.Image.open``.
"""

from __future__ import annotations

import io
from typing import Any

from s3lanes_client.model import ObjectClient


class ObjectReader(io.RawIOBase):
    def __init__(
        self,
        client: ObjectClient,
        bucket: str,
        key: str,
        *,
        lane: str | None = "restore",
        block_bytes: int = 8 * 1024 * 1024,
        size: int | None = None,
        start: int = 0,
        end: int | None = None,
    ) -> None:
        super().__init__()
        if block_bytes < 1:
            raise ValueError("block_bytes must be positive")
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"invalid byte range [{start}, {end})")
        self._client = client
        self.bucket = bucket
        self.key = key
        self._lane = lane
        self._block_bytes = block_bytes
        self._start = start
        # ``size`` is the readable length: the window's when a range is given, else the object's.
        self._size = end - start if end is not None else (None if size is None else size - start)
        self._pos = 0
        self._block_start = 0
        self._block = b""
        self.requests = 0
        self.bytes_fetched = 0

    @property
    def offset(self) -> int:
        """Where position 0 of this stream is in the object."""
        return self._start

    @property
    def size(self) -> int:
        if self._size is None:
            info = self._client.head(self.bucket, self.key, lane=self._lane)
            if info is None:
                raise FileNotFoundError(f"s3://{self.bucket}/{self.key}")
            self._size = max(0, info.size - self._start)
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError("seek on a closed reader")
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the stream (object offsets shifted by the window's start)."""
        data = self._client.get_bytes(
            self.bucket, self.key, start=self._start + start, end=self._start + end, lane=self._lane
        )
        self.requests += 1
        self.bytes_fetched += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("read from a closed reader")
        out = memoryview(buffer).cast("B")
        n = min(len(out), self.size - self._pos)
        if n <= 0:
            return 0
        start, end = self._pos, self._pos + n
        block_end = self._block_start + len(self._block)
        if self._block_start <= start and end <= block_end:
            offset = start - self._block_start
            out[:n] = self._block[offset : offset + n]
        elif n >= self._block_bytes:
            data = self._fetch(start, end)
            out[: len(data)] = data
            n = len(data)
        else:
            self._block_start = start
            self._block = self._fetch(start, min(self.size, start + self._block_bytes))
            n = min(n, len(self._block))
            out[:n] = self._block[:n]
        self._pos += n
        return n

    def prefetch(self) -> None:
        """Fill the read-ahead buffer at the current position now (a dataset's read-ahead threads call this,
        so the transform's first small reads find their bytes already here)."""
        if not self.closed and not self._block and self._pos < self.size:
            self._block_start = self._pos
            self._block = self._fetch(self._pos, min(self.size, self._pos + self._block_bytes))

    # The buffered-stream spellings: every read is already a full one.
    readinto1 = readinto

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readall(self) -> bytes:
        if self.closed:
            raise ValueError("read from a closed reader")
        if self._pos >= self.size:
            return b""
        # Serve what the cached block already holds, fetch only the rest.
        head = b""
        block_end = self._block_start + len(self._block)
        if self._block_start <= self._pos < block_end:
            head = self._block[self._pos - self._block_start :]
        rest = self._fetch(self._pos + len(head), self.size) if self._pos + len(head) < self.size else b""
        data = head + rest
        self._pos += len(data)
        return data

    def close(self) -> None:
        self._block = b""
        super().close()
