"""GET and HEAD through the gateway's lean backend client ([backend] raw_reads, on by default) answer as
through the aiohttp session (raw_reads = false): bodies, empty objects, ranges, 304, 404 with the gateway's
request id, HEAD without a body; and many GETs in a row reuse the connections instead of leaking them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def session_reads(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose GETs and HEADs go through the aiohttp session: the reference."""
    tmp: Path = tmp_path_factory.mktemp("session-reads")
    proc, gw = start_plain_gateway(
        tmp, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml="raw_reads = false"
    )
    try:
        yield gw
    finally:
        stop_and_check(proc, gw)


def answers(client: Any, bucket: str, etag: str) -> list[Any]:
    out: list[Any] = []
    got = client.get_object(Bucket=bucket, Key="data")
    out.append((got["Body"].read(), got["ContentLength"], got["ETag"]))
    out.append(client.get_object(Bucket=bucket, Key="empty")["Body"].read())
    out.append(client.get_object(Bucket=bucket, Key="empty")["Body"].read())  # twice: nothing shared
    got = client.get_object(Bucket=bucket, Key="data", Range="bytes=1000-1999")
    out.append((got["Body"].read(), got["ContentRange"]))
    head = client.head_object(Bucket=bucket, Key="data")
    out.append((head["ContentLength"], head["ETag"]))
    for call in (
        lambda: client.get_object(Bucket=bucket, Key="data", IfNoneMatch=etag),
        lambda: client.get_object(Bucket=bucket, Key="missing"),
        lambda: client.head_object(Bucket=bucket, Key="missing"),
    ):
        with pytest.raises(ClientError) as err:
            call()
        meta = err.value.response["ResponseMetadata"]
        out.append((meta["HTTPStatusCode"], err.value.response["Error"]["Code"]))
        # The store's error document carries the gateway's request id, as the header does.
        assert meta["RequestId"] == meta["HTTPHeaders"]["x-amz-request-id"]
    return out


def test_reads_answer_as_through_the_session(
    gateway: Gateway, session_reads: Gateway, backend: Any, bucket: str
) -> None:
    data = os.urandom(200 * 1024)
    etag = backend.put_object(Bucket=bucket, Key="data", Body=data)["ETag"]
    backend.put_object(Bucket=bucket, Key="empty", Body=b"")
    raw, session = gateway.client(), session_reads.client()
    try:
        got_raw, got_session = answers(raw, bucket, etag), answers(session, bucket, etag)
    finally:
        raw.close()
        session.close()
    assert got_raw == got_session
    assert got_raw[0] == (data, len(data), etag)
    assert got_raw[1] == got_raw[2] == b""
    assert got_raw[3] == (data[1000:2000], f"bytes 1000-1999/{len(data)}")
    assert got_raw[5:] == [(304, "304"), (404, "NoSuchKey"), (404, "404")]


def connections_to(backend_url: str) -> int:
    """TCP connections to the store's port, open (ESTABLISHED) or closed by this side (TIME_WAIT): a
    connection not reused shows up here as one more, kept or closed."""
    port = int(backend_url.rsplit(":", 1)[1].strip("/"))
    count = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port and fields[3] in ("01", "06"):
                count += 1
    return count


def test_many_sequential_gets_reuse_one_backend_connection(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    backend.put_object(Bucket=bucket, Key="small", Body=b"x" * 1024)
    client = gateway.client()
    try:
        before = connections_to(gateway.backend_url)
        for _ in range(50):
            assert client.get_object(Bucket=bucket, Key="small")["Body"].read() == b"x" * 1024
        after = connections_to(gateway.backend_url)
    finally:
        client.close()
    assert after - before <= 2, (before, after)
