"""``ObjectReader``: a seekable, read-only stream over one object, fetched with ranged GETs.

Reads smaller than a block are served from one cached block of ``block_bytes`` (fetched at the read position),
so a reader that walks a file in small steps (``torch.load``'s zip reader, ``pickle``) costs one request per
block; a read of a block or more is fetched directly into the caller's buffer. One block is cached, so memory
is bounded by ``block_bytes`` plus what the caller asks for. The object's size comes from a HEAD at the first
``seek`` from the end or read (or is given).
"""

from __future__ import annotations

import io
from typing import Any

from clients.model import ObjectClient


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
    ) -> None:
        super().__init__()
        if block_bytes < 1:
            raise ValueError("block_bytes must be positive")
        self._client = client
        self.bucket = bucket
        self.key = key
        self._lane = lane
        self._block_bytes = block_bytes
        self._size = size
        self._pos = 0
        self._block_start = 0
        self._block = b""

    @property
    def size(self) -> int:
        if self._size is None:
            info = self._client.head(self.bucket, self.key, lane=self._lane)
            if info is None:
                raise FileNotFoundError(f"s3://{self.bucket}/{self.key}")
            self._size = info.size
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
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
        return self._client.get_bytes(self.bucket, self.key, start=start, end=end, lane=self._lane)

    def readinto(self, buffer: Any) -> int:
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
            out[:n] = self._block[:n]
        self._pos += n
        return n

    def readall(self) -> bytes:
        if self._pos >= self.size:
            return b""
        data = self._fetch(self._pos, self.size)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self._block = b""
        super().close()
