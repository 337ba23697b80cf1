"""``ObjectReader`` over an in-memory object (no network): windows, block reuse, full reads, counters."""

from __future__ import annotations

import io
import tarfile
from typing import Any, cast

import pytest

from s3lanes_client.model import ObjectInfo
from s3lanes_client.reader import ObjectReader

BLOB = bytes(range(256)) * 40  # 10240 bytes


class MemoryObjects:
    """Just what ``ObjectReader`` calls: ``head`` and ``get_bytes`` with ``[start, end)``."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: list[tuple[int | None, int | None]] = []
        self.heads = 0

    def head(self, bucket: str, key: str, *, lane: Any = None) -> ObjectInfo | None:
        self.heads += 1
        data = self.objects.get(key)
        return None if data is None else ObjectInfo(key, len(data))

    def get_bytes(
        self, bucket: str, key: str, *, start: Any = None, end: Any = None, lane: Any = None
    ) -> bytes:
        self.gets.append((start, end))
        return self.objects[key][start:end]

    def call(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("not used")


def reader(store: MemoryObjects, **kwargs: Any) -> ObjectReader:
    return ObjectReader(cast(Any, store), "b", "k", **kwargs)


def test_nothing_is_fetched_until_the_first_read_and_small_reads_share_a_block() -> None:
    store = MemoryObjects({"k": BLOB})
    r = reader(store, block_bytes=1000, size=len(BLOB))
    assert store.gets == [] and store.heads == 0
    assert r.read(10) == BLOB[:10] and r.read(10) == BLOB[10:20]
    assert store.gets == [(0, 1000)]
    r.seek(995)
    assert r.read(10) == BLOB[995:1005]  # crosses the block end: one new block at the read position
    assert store.gets == [(0, 1000), (995, 1995)]
    assert r.read(5000) == BLOB[1005:6005]  # a large read goes straight through
    assert store.gets[-1] == (1005, 6005)
    assert (r.requests, r.bytes_fetched) == (3, 1000 + 1000 + 5000)


def test_a_window_is_a_file_of_its_own_and_no_request_leaves_it() -> None:
    store = MemoryObjects({"k": BLOB})
    r = reader(store, block_bytes=64, start=1000, end=1100)
    assert (r.offset, r.seek(0, io.SEEK_END)) == (1000, 100)
    assert r.read(1) == b""
    r.seek(90)
    assert r.read(50) == BLOB[1090:1100]
    r.seek(0)
    assert r.read() == BLOB[1000:1100]
    assert all(s is not None and s >= 1000 and e is not None and e <= 1100 for s, e in store.gets), store.gets
    assert store.heads == 0


def test_an_open_ended_window_and_readall_reuse_the_cached_block() -> None:
    store = MemoryObjects({"k": BLOB})
    r = reader(store, block_bytes=100, start=10000)
    assert r.read(4) == BLOB[10000:10004]
    assert r.read() == BLOB[10004:]
    assert store.heads == 1 and store.gets == [(10000, 10100), (10100, 10240)]


def test_missing_object_and_closed_reader() -> None:
    store = MemoryObjects({})
    with pytest.raises(FileNotFoundError):
        reader(store).read(1)
    r = reader(MemoryObjects({"k": BLOB}))
    r.close()
    with pytest.raises(ValueError):
        r.read(1)


def test_tarfile_reads_members_through_it_in_both_modes() -> None:
    buf = io.BytesIO()
    members = {f"m{i}": bytes([i]) * (3000 + i) for i in range(5)}
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for mode in ("r|*", "r:", "r:*"):
        with tarfile.open(
            fileobj=reader(MemoryObjects({"k": buf.getvalue()}), block_bytes=700), mode=mode
        ) as t:
            got = {}
            for m in t:
                f = t.extractfile(m)
                assert f is not None
                got[m.name] = f.read()
        assert got == members, mode
