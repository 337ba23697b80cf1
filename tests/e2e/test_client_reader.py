"""The lazy sample reader and the s3torchconnector-style dataset entry points through the real gateway: tar
streams and random-access tars read member by member (counting the bytes fetched), byte-range records as
files, ``from_prefix``/``from_objects``."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from typing import IO, Any, cast

import pytest
from torch.utils.data import DataLoader

from s3lanes_client import ClientConfig, GatewayClient, ObjectReader
from s3lanes_client.torch import S3IterableDataset, S3MapDataset
from tests.e2e.conftest import Gateway
from tests.e2e.test_client_sync import gateway_config
from tests.e2e.test_client_torch import upload

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB


def make_tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def member_bytes(shard: int, i: int, size: int) -> bytes:
    seed = hashlib.sha256(f"{shard}/{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def members_of_stream(reader: ObjectReader) -> tuple[str, list[tuple[str, str]]]:
    """A transform: the tar read as a stream ("r|*"), member by member (module level: picklable)."""
    out = []
    with tarfile.open(fileobj=cast(IO[bytes], reader), mode="r|*") as tar:
        for member in tar:
            f = tar.extractfile(member)
            assert f is not None
            out.append((member.name, hashlib.sha256(f.read()).hexdigest()))
    return reader.key, out


def fetch_counter(client: GatewayClient) -> list[int]:
    """Every GetObject's Content-Length as the client receives it (botocore's after-call hook)."""
    sizes: list[int] = []

    def count(http_response: Any, **_: Any) -> None:
        sizes.append(int(http_response.headers.get("content-length", 0)))

    client.s3.meta.events.register("after-call.s3.GetObject", count)
    return sizes


def test_tar_streams_are_read_member_by_member_from_a_lazy_reader(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    shards = {
        f"tars/shard-{s}.tar": {f"s{s}/m{i:02d}.bin": member_bytes(s, i, 3000 + 700 * i) for i in range(6)}
        for s in range(3)
    }
    upload(backend, bucket, {key: make_tar(m) for key, m in shards.items()})
    dataset: S3IterableDataset[tuple[str, list[tuple[str, str]]]] = S3IterableDataset(
        bucket,
        prefix="tars/",
        transform=members_of_stream,
        config=gateway_config(gateway),
        as_reader=True,
        reader_block_bytes=4 * KiB,  # several ranged GETs per shard: the stream crosses block boundaries
        readahead=2,
    )
    expected = {
        key: [(name, hashlib.sha256(data).hexdigest()) for name, data in members.items()]
        for key, members in shards.items()
    }
    assert dict(dataset) == expected
    # The same in two DataLoader workers: each makes its readers (and client) in its own process.
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    got = [(key, [tuple(m) for m in members]) for key, members in loader]
    assert sorted(k for k, _ in got) == sorted(expected)
    assert dict(got) == expected


def one_member(reader: ObjectReader) -> tuple[bytes, int, int]:
    """A transform: open the tar for random access ("r:"), skip to member m07 by its headers, read it."""
    with tarfile.open(fileobj=cast(IO[bytes], reader), mode="r:") as tar:
        while (member := tar.next()) is not None and member.name != "m07.bin":
            pass
        assert member is not None
        f = tar.extractfile(member)
        assert f is not None
        return f.read(), reader.bytes_fetched, reader.requests


def test_random_access_tar_fetches_only_headers_and_the_member(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    members = {f"m{i:02d}.bin": os.urandom(2 * MiB) for i in range(12)}
    blob = make_tar(members)
    upload(backend, bucket, {"big/archive.tar": blob})
    dataset: S3MapDataset[tuple[bytes, int, int]] = S3MapDataset(
        bucket,
        keys=["big/archive.tar"],
        transform=one_member,
        config=gateway_config(gateway),
        as_reader=True,
        reader_block_bytes=64 * KiB,
    )
    on_the_wire = fetch_counter(dataset._source.client())
    data, fetched, requests = dataset[0]
    assert data == members["m07.bin"]
    # Eight headers (one 64 KiB block each) and the 2 MiB member, out of a 24 MiB object.
    assert sum(on_the_wire) == fetched
    assert len(on_the_wire) == requests
    assert 2 * MiB <= fetched <= 2 * MiB + 9 * 64 * KiB, fetched
    assert fetched < len(blob) / 8, (fetched, len(blob))


def window(reader: ObjectReader) -> tuple[int, int, bytes, bytes, int]:
    end = reader.seek(0, io.SEEK_END)
    reader.seek(10)
    middle = reader.read(5)
    reader.seek(0)
    whole = reader.read()
    return reader.offset, end, middle, whole + reader.read(), reader.bytes_fetched


def test_records_as_readers_see_only_their_byte_range(gateway: Gateway, backend: Any, bucket: str) -> None:
    blob = bytes(range(256)) * 10  # 2560 bytes: records of 1000, 1000, 560
    upload(backend, bucket, {"packed/a.bin": blob})
    dataset: S3MapDataset[tuple[int, int, bytes, bytes, int]] = S3MapDataset(
        bucket,
        prefix="packed/",
        record_bytes=1000,
        transform=window,
        config=gateway_config(gateway),
        as_reader=True,
        reader_block_bytes=64,
    )
    assert len(dataset) == 3
    for i, start in enumerate((0, 1000, 2000)):
        offset, end, middle, whole, fetched = dataset[i]
        record = blob[start : start + 1000]
        assert (offset, end, middle, whole) == (start, len(record), record[10:15], record)
        assert fetched <= 64 + len(record)  # one block for the small read, then the rest, never outside


def test_from_prefix_and_from_objects_hand_readers_like_s3torchconnector(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    objects = {f"objs/{i}.bin": member_bytes(9, i, 100 + i) for i in range(6)}
    upload(backend, bucket, objects)
    # region/endpoint as s3torchconnector takes them, over a config without an endpoint
    keys_only = ClientConfig(access_key=gateway.access_key, secret_key=gateway.secret_key)
    mapped = S3MapDataset.from_prefix(
        f"s3://{bucket}/objs/", region="us-east-1", endpoint=gateway.http_url, config=keys_only
    )
    readers = [mapped[i] for i in range(len(mapped))]
    assert all(isinstance(r, ObjectReader) for r in readers)
    assert {r.key: r.read() for r in readers} == objects

    order = ["objs/4.bin", "objs/1.bin", "objs/3.bin"]
    listed = S3MapDataset.from_objects([f"s3://{bucket}/{k}" for k in order], config=gateway_config(gateway))
    assert [listed[i].read() for i in range(3)] == [objects[k] for k in order]

    uris = [f"s3://{bucket}/{k}" for k in sorted(objects)]
    sharded = S3IterableDataset.from_objects(uris, config=gateway_config(gateway), rank=1, world_size=2)
    everything = S3IterableDataset.from_objects(
        uris, config=gateway_config(gateway), rank=1, world_size=2, enable_sharding=False
    )
    assert [r.key for r in sharded] == sorted(objects)[1::2]
    assert [r.read() for r in everything] == [objects[k] for k in sorted(objects)]
    plain = S3IterableDataset.from_prefix(
        f"s3://{bucket}/objs/", config=gateway_config(gateway), as_reader=False
    )
    assert {s.key: s.data for s in plain} == objects  # identity over Samples

    with pytest.raises(ValueError, match="one bucket"):
        S3MapDataset.from_objects([f"s3://{bucket}/a", "s3://other/b"], config=gateway_config(gateway))
