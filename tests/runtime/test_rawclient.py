"""The lean GET/HEAD client (s3lanes.runtime.rawclient) behind Backend.read, against the real SeaweedFS.

Answers SeaweedFS never gives (a chunked body, a store that stalls, one that closes idle connections) come
from small TCP servers on loopback that speak HTTP/1.1 the way such a store would: real sockets, no mocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import aiohttp
import pytest

from s3lanes.clock import SystemClock
from s3lanes.config import BackendConfig, Credential
from s3lanes.errors import GatewayTimeout, ServiceUnavailable
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.rawclient import RawResponse
from tests.conftest import Backend as Seaweed
from tests.conftest import s3_client

pytestmark = pytest.mark.e2e

BODY = bytes(range(256)) * 64  # 16 KiB


def cred(seaweed: Seaweed) -> Credential:
    a = seaweed.admin
    return Credential("client", "secret", a.access_key, a.secret_key)


@pytest.fixture
async def store(seaweed: Seaweed, unique_bucket: str) -> AsyncIterator[tuple[Backend, str]]:
    s3 = s3_client(seaweed)
    try:
        s3.put_object(Bucket=unique_bucket, Key="obj", Body=BODY)
    finally:
        s3.close()
    backend = Backend(BackendConfig(endpoint=seaweed.endpoint_url), seaweed.endpoint_url, SystemClock())
    await backend.start()
    try:
        yield backend, unique_bucket
    finally:
        await backend.close()


async def read(
    backend: Backend, seaweed: Seaweed, bucket: str, key: str, method: str = "GET", **headers: str
) -> RawResponse:
    resp = await backend.read(method, backend.target(bucket, key, ""), headers, cred(seaweed))
    assert isinstance(resp, RawResponse)
    return resp


async def test_a_get_streams_the_body_and_the_connection_is_reused(
    store: tuple[Backend, str], seaweed: Seaweed
) -> None:
    backend, bucket = store
    for _ in range(3):
        resp = await read(backend, seaweed, bucket, "obj")
        assert resp.status == 200 and resp.content_length == len(BODY)
        got = b"".join([chunk async for chunk, _ in resp.content.iter_chunks()])
        resp.release()
        assert got == BODY
    pool = backend._raw
    assert pool is not None and pool.opened == 1 and pool.idle_count == 1


async def test_head_has_no_body_and_keeps_the_connection(
    store: tuple[Backend, str], seaweed: Seaweed
) -> None:
    backend, bucket = store
    resp = await read(backend, seaweed, bucket, "obj", "HEAD")
    assert resp.status == 200 and resp.content_length == len(BODY)
    assert resp.content.is_eof() and await resp.content.read() == b""
    resp.release()
    resp = await read(backend, seaweed, bucket, "obj")  # the next answer is not confused by a missing body
    assert await resp.read() == BODY
    assert backend._raw is not None and backend._raw.opened == 1


async def test_not_modified_and_ranges_and_missing_keys(store: tuple[Backend, str], seaweed: Seaweed) -> None:
    backend, bucket = store
    head = await read(backend, seaweed, bucket, "obj", "HEAD")
    etag = head.headers["ETag"]
    head.release()
    resp = await read(backend, seaweed, bucket, "obj", **{"if-none-match": etag})
    assert resp.status == 304 and await resp.read() == b""
    resp = await read(backend, seaweed, bucket, "obj", range="bytes=100-199")
    assert resp.status == 206 and resp.headers["Content-Range"] == f"bytes 100-199/{len(BODY)}"
    assert await resp.read() == BODY[100:200]
    resp = await read(backend, seaweed, bucket, "no-such-key")
    assert resp.status == 404 and b"NoSuchKey" in await resp.read()
    assert backend._raw is not None and backend._raw.opened == 1


async def test_a_body_left_unread_closes_the_connection_instead_of_reusing_it(
    store: tuple[Backend, str], seaweed: Seaweed
) -> None:
    backend, bucket = store
    resp = await read(backend, seaweed, bucket, "obj")
    await resp.content.readany()  # the client went away after the first piece
    resp.close()
    resp.release()  # idempotent: the finally of the relay
    assert backend._raw is not None and backend._raw.idle_count == 0
    assert await (await read(backend, seaweed, bucket, "obj")).read() == BODY
    assert backend._raw.opened == 2


async def test_raw_reads_off_uses_the_session(seaweed: Seaweed, unique_bucket: str) -> None:
    cfg = BackendConfig(endpoint=seaweed.endpoint_url, raw_reads=False)
    backend = Backend(cfg, seaweed.endpoint_url, SystemClock())
    await backend.start()
    try:
        resp = await backend.read("GET", backend.target(unique_bucket, "x", ""), {}, cred(seaweed))
        assert isinstance(resp, aiohttp.ClientResponse) and resp.status == 404
        resp.release()
    finally:
        await backend.close()


# -- stores that misbehave on a real socket --------------------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def backend_at(endpoint: str, **cfg: float) -> Backend:
    base = BackendConfig(endpoint=endpoint, access_key="k", secret_key="s")
    backend = Backend(replace(base, **cfg), endpoint, SystemClock())  # type: ignore[arg-type]
    await backend.start()
    return backend


CRED = Credential("client", "secret", "k", "s")


async def test_a_chunked_answer_is_decoded_and_the_connection_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_head(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            await writer.drain()
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint)
    try:
        for _ in range(2):
            resp = await backend.read("GET", backend.target("b", "k", ""), {}, CRED)
            assert isinstance(resp, RawResponse) and resp.content_length is None
            assert await resp.read() == b"hello world"
        assert backend._raw is not None and backend._raw.opened == 1
    finally:
        await backend.close()
        server.close()


async def test_header_bytes_the_client_sent_reach_the_store_unchanged() -> None:
    """The server decodes header bytes as UTF-8 with surrogate escapes; a stray 0xff byte (from a fuzzer or
    a broken client) and real UTF-8 both go out as the bytes that came in, and are the store's to judge."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await read_head(reader))
        writer.write(b"HTTP/1.1 416 Requested Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint)
    try:
        client_bytes = b"bytes=\xff0-1\xc3\xa9"
        value = client_bytes.decode("utf-8", "surrogateescape")
        resp = await backend.read("GET", backend.target("b", "k", ""), {"Range": value}, CRED)
        assert resp.status == 416
        resp.release()
        assert b"\r\nRange: " + client_bytes + b"\r\n" in heads[0], heads
    finally:
        await backend.close()
        server.close()


async def test_a_silent_store_is_a_gateway_timeout_and_a_refused_one_unavailable() -> None:
    stalled = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        await stalled.wait()
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint, read_timeout_s=0.3)
    try:
        with pytest.raises(GatewayTimeout):
            await backend.read("GET", backend.target("b", "k", ""), {}, CRED)
        assert backend.health.failures == 1
        assert backend._raw is not None and backend._raw.idle_count == 0
    finally:
        stalled.set()
        await backend.close()
        server.close()
        await server.wait_closed()
    backend = await backend_at(endpoint)  # nothing listens there any more
    try:
        with pytest.raises(ServiceUnavailable):
            await backend.read("GET", backend.target("b", "k", ""), {}, CRED)
    finally:
        await backend.close()


async def test_a_body_cut_mid_way_fails_the_stream_and_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint)
    try:
        resp = await backend.read("GET", backend.target("b", "k", ""), {}, CRED)
        assert isinstance(resp, RawResponse)
        with pytest.raises(aiohttp.ClientPayloadError):
            async for _ in resp.content.iter_chunks():
                pass
        resp.release()
        assert backend._raw is not None and backend._raw.idle_count == 0
    finally:
        await backend.close()
        server.close()


async def test_a_pooled_connection_the_store_closed_is_retried_on_a_new_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)  # the first request on a connection is answered (keep-alive) ...
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_head(reader)  # ... the second finds it closed: no byte of an answer
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint)
    try:
        for _ in range(3):
            resp = await backend.read("GET", backend.target("b", "k", ""), {}, CRED)
            assert await resp.read() == b"ok"
        # GET 1 on connection 1; GET 2 on connection 1, closed, sent again on 2; GET 3 likewise on 3.
        assert backend._raw is not None and backend._raw.opened == 3
        assert backend.health.failures == 0
    finally:
        await backend.close()
        server.close()


async def test_a_cancelled_wait_for_the_answer_closes_the_connection_and_frees_its_slot() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        await release.wait()
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint, pool_size=1)
    try:
        task = asyncio.ensure_future(backend.read("GET", backend.target("b", "k", ""), {}, CRED))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pool = backend._raw
        assert pool is not None and pool.idle_count == 0
        # The one slot is free again: a second request gets a connection (and times out on this store).
        release.set()
        with pytest.raises((ServiceUnavailable, GatewayTimeout)):
            await asyncio.wait_for(backend.read("GET", backend.target("b", "k", ""), {}, CRED), 5)
    finally:
        release.set()
        await backend.close()
        server.close()


async def test_an_empty_object_reads_as_empty_and_keeps_the_connection(
    store: tuple[Backend, str], seaweed: Seaweed
) -> None:
    backend, bucket = store
    s3 = s3_client(seaweed)
    try:
        s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    finally:
        s3.close()
    for _ in range(2):
        resp = await read(backend, seaweed, bucket, "empty")
        assert resp.status == 200 and resp.content_length == 0
        assert [c async for c, _ in resp.content.iter_chunks()] == []
        resp.release()
    assert backend._raw is not None and backend._raw.opened == 1


async def test_a_response_dropped_without_release_frees_its_slot() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_head(reader)
            except asyncio.IncompleteReadError:
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    server, endpoint = await serve(handler)
    backend = await backend_at(endpoint, pool_size=1)
    try:
        resp = await backend.read("GET", backend.target("b", "k", ""), {}, CRED)
        del resp  # never released: the one slot comes back when the response is collected
        resp = await asyncio.wait_for(backend.read("GET", backend.target("b", "k", ""), {}, CRED), 5)
        assert await resp.read() == b"ok"
    finally:
        await backend.close()
        server.close()


async def test_connections_leave_from_the_backend_and_lane_source_addresses() -> None:
    peers: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[0])
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server, endpoint = await serve(handler)
    base = BackendConfig(endpoint=endpoint, access_key="k", secret_key="s", source_address="127.0.0.2")
    cfg = replace(base, lane_source_addresses={"checkpoint": "127.0.0.3"})
    backend = Backend(cfg, endpoint, SystemClock())
    await backend.start()
    try:
        for lane in (None, "checkpoint", "interactive"):
            resp = await backend.read("GET", backend.target("b", "k", ""), {}, CRED, lane=lane)
            assert await resp.read() == b"ok"
    finally:
        await backend.close()
        server.close()
    assert peers == ["127.0.0.2", "127.0.0.3", "127.0.0.2"]
