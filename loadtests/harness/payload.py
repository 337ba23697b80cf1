"""Object data: one random block, read from a seed-dependent offset and wrapped around, sent as views."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from loadtests.harness.stats import MIB

# Object data: one random block, read from a seed-dependent offset and wrapped around, sent as views
# (no copies). Random so that nothing on the way can compress it; 8 MiB so that it stays in cache.
BLOCK_BYTES = 8 * MIB
UPLOAD_PIECE_BYTES = 1 * MIB
_BLOCK = os.urandom(BLOCK_BYTES)
_BLOCK_VIEW = memoryview(_BLOCK)


def payload_pieces(size_bytes: int, seed: int) -> Iterator[memoryview]:
    """The bytes of object ``seed`` of ``size_bytes``: views into one random block, no copies."""
    offset = (seed * 1_048_573) % BLOCK_BYTES
    sent = 0
    while sent < size_bytes:
        n = min(UPLOAD_PIECE_BYTES, size_bytes - sent, BLOCK_BYTES - offset)
        yield _BLOCK_VIEW[offset : offset + n]
        sent += n
        offset = (offset + n) % BLOCK_BYTES


_SHA256_CACHE: dict[tuple[int, int], str] = {}


def payload_sha256(size_bytes: int, seed: int) -> str:
    key = (size_bytes, seed)
    if key not in _SHA256_CACHE:
        h = hashlib.sha256()
        for piece in payload_pieces(size_bytes, seed):
            h.update(piece)
        _SHA256_CACHE[key] = h.hexdigest()
    return _SHA256_CACHE[key]
