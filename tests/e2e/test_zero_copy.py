"""The zero-copy GET relay (``[server] zero_copy_min_bytes``, :mod:`s3lanes.http.zerocopy`), end to end.

A plain-HTTP GET whose body from the store is at least the threshold is spliced from the store's socket to
the client's. These tests hold it to what the copying relay guarantees: the bytes are exact (whole objects,
ranges, sizes around the threshold), the client's keep-alive connection stays usable for the next request,
the bytes are counted in the lane, a store that stops sending or closes mid-body ends the client's
connection (never a hang, never a short body passed off as whole), a client leaving mid-body costs nothing,
and no descriptor (pipe, duplicate socket) outlives its request. HTTPS is never spliced. Objects still in
the write spool are sent from their files with ``sendfile(2)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, slow_spool_toml, start_plain_gateway, stop_gateway
from tests.e2e.s3raw import UNSIGNED_PAYLOAD, key_path, sign

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
THRESHOLD = 1 * MiB


def metric(gw: Gateway, family: str, **labels: str) -> float:
    """Sum of a metric's samples (counters: their ``_total``) whose labels include ``labels``."""
    with urllib.request.urlopen(gw.http_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name in (family, family + "_total") and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def settled(read: Callable[[], float], want: float, timeout_s: float = 5.0) -> float:
    """``read()`` once it equals ``want``, or its value at the deadline. A byte counter is bumped when the
    coroutine that sent the bytes resumes, which can be just after the client already has them and asks for
    the metrics."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = read()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_fds_at_most(pid: int, limit: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = open_fds(pid)
        if n <= limit or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def signed_get(
    gw: Gateway, target: str, extra: dict[str, str] | None = None, *, method: str = "GET"
) -> dict[str, str]:
    return sign(
        method,
        gw.http_url,
        target,
        dict(extra or {}),
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        payload_hash=UNSIGNED_PAYLOAD,
    )


def get_on(
    conn: http.client.HTTPConnection, gw: Gateway, target: str, extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = signed_get(gw, target, extra)
    conn.request("GET", target, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


@pytest.fixture(scope="module")
def zc_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("zero-copy")
    proc, gw = start_plain_gateway(
        tmp, seaweed, backend_endpoint=seaweed.endpoint_url, server_toml=f"zero_copy_min_bytes = {THRESHOLD}"
    )
    try:
        yield gw
    finally:
        assert stop_gateway(proc) == 0
        log = gw.log_path.read_text()
        assert "Traceback" not in log, log[-4000:]


def put_direct(seaweed: Any, bucket: str, key: str, data: bytes) -> None:
    client = s3_client(seaweed)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data)
    finally:
        client.close()


def test_spliced_bodies_are_exact_and_the_connection_stays_in_step(
    zc_gateway: Gateway, seaweed: Any, bucket: str
) -> None:
    gw = zc_gateway
    sizes = {
        "below": THRESHOLD - 1,
        "at": THRESHOLD,
        "odd": 9 * MiB + 12345,
        "big": 33 * MiB + 7,
    }
    blobs = {name: os.urandom(size) for name, size in sizes.items()}
    for name, data in blobs.items():
        put_direct(seaweed, bucket, f"obj-{name}", data)
    spliced_before = metric(gw, "s3lanes_zero_copy_bytes")
    down_before = metric(gw, "s3lanes_lane_bytes", direction="down")
    host, port = urlsplit(gw.http_url).hostname, urlsplit(gw.http_url).port
    conn = http.client.HTTPConnection(host or "127.0.0.1", port, timeout=60)
    expected_spliced = 0
    expected_down = 0
    try:
        # Every request on the same keep-alive connection: a spliced body that left one byte too many or
        # too few would make the next answer unreadable.
        for name in ("at", "below", "odd", "big", "at", "odd"):
            status, headers, body = get_on(conn, gw, key_path(bucket, f"obj-{name}"))
            assert status == 200, (name, status, body[:300])
            assert hashlib.sha256(body).digest() == hashlib.sha256(blobs[name]).digest(), name
            assert int(headers["content-length"]) == len(blobs[name])
            expected_down += len(body)
            if len(body) >= THRESHOLD:
                expected_spliced += len(body)
        # A range answer (206) large enough is spliced too; a short one is not.
        for first, last in ((100, 5 * MiB + 6), (9 * MiB, 9 * MiB + 12344), (0, 1000)):
            status, headers, body = get_on(
                conn, gw, key_path(bucket, "obj-odd"), {"Range": f"bytes={first}-{last}"}
            )
            assert status == 206, status
            assert body == blobs["odd"][first : last + 1]
            assert headers["content-range"] == f"bytes {first}-{last}/{sizes['odd']}"
            expected_down += len(body)
            if len(body) >= THRESHOLD:
                expected_spliced += len(body)
        # HEAD and a small GET after all of it, still on the same connection.
        big = key_path(bucket, "obj-big")
        conn.request("HEAD", big, headers=signed_get(gw, big, method="HEAD"))
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        assert int(head.getheader("Content-Length") or -1) == sizes["big"]
        status, _, body = get_on(conn, gw, key_path(bucket, "obj-below"))
        assert status == 200 and body == blobs["below"]
        expected_down += len(body)
    finally:
        conn.close()
    assert metric(gw, "s3lanes_zero_copy_bytes") - spliced_before == expected_spliced
    assert metric(gw, "s3lanes_lane_bytes", direction="down") - down_before == expected_down


def test_errors_from_the_store_are_relayed_not_spliced(zc_gateway: Gateway, bucket: str) -> None:
    gw = zc_gateway
    host, port = urlsplit(gw.http_url).hostname, urlsplit(gw.http_url).port
    conn = http.client.HTTPConnection(host or "127.0.0.1", port, timeout=30)
    try:
        status, _, body = get_on(conn, gw, key_path(bucket, "no-such-key"))
        assert status == 404 and b"<Code>NoSuchKey</Code>" in body
    finally:
        conn.close()


def test_a_client_leaving_mid_body_leaves_no_descriptor_behind(
    zc_gateway: Gateway, seaweed: Any, bucket: str
) -> None:
    gw = zc_gateway
    data = os.urandom(48 * MiB)
    put_direct(seaweed, bucket, "leave", data)
    target = key_path(bucket, "leave")
    host, port = urlsplit(gw.http_url).hostname or "127.0.0.1", urlsplit(gw.http_url).port or 80
    # Warm the gateway's connection pool first, so the baseline counts a pooled store connection.
    conn = http.client.HTTPConnection(host, port, timeout=30)
    status, _, body = get_on(conn, gw, target)
    conn.close()
    assert status == 200 and body == data
    baseline = wait_fds_at_most(gw.pid, 0, timeout_s=0.5)
    for _ in range(5):
        sock = socket.create_connection((host, port), timeout=30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KiB)
        head = "".join(f"{k}: {v}\r\n" for k, v in signed_get(gw, target).items())
        sock.sendall(f"GET {target} HTTP/1.1\r\n{head}\r\n".encode())
        got = 0
        while got < 2 * MiB:
            chunk = sock.recv(256 * KiB)
            assert chunk, "the gateway closed before sending 2 MiB"
            got += len(chunk)
        sock.close()
    after = wait_fds_at_most(gw.pid, baseline)
    assert after <= baseline, f"descriptors {baseline} -> {after} after clients left mid-body"
    # Still serving, and the lanes are quiet again.
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        status, _, body = get_on(conn, gw, target, {"Range": "bytes=0-99"})
        assert status == 206 and body == data[:100]
    finally:
        conn.close()


def test_https_is_never_spliced(gateway: Gateway, seaweed: Any, bucket: str) -> None:
    """The session gateway (default threshold 8 MiB) serves the same 9 MiB object over both listeners."""
    data = os.urandom(9 * MiB)
    put_direct(seaweed, bucket, "both", data)
    before = metric(gateway, "s3lanes_zero_copy_bytes")
    got = gateway.client(https=True).get_object(Bucket=bucket, Key="both")["Body"].read()
    assert got == data
    assert metric(gateway, "s3lanes_zero_copy_bytes") == before
    got = gateway.client().get_object(Bucket=bucket, Key="both")["Body"].read()
    assert got == data
    assert settled(lambda: metric(gateway, "s3lanes_zero_copy_bytes") - before, len(data)) == len(data)


# -- a store that fails mid-body --------------------------------------------------------------------------


class BrokenStore:
    """Answers every request 200 with a Content-Length of ``declared`` bytes, sends ``sent`` of them, then
    either stays silent (``close=False``) or closes the connection. Not an S3 server: a fault, on loopback."""

    def __init__(self, declared: int, sent: int, *, close: bool) -> None:
        self.declared, self.sent, self.close = declared, sent, close
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="broken-store", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    def __enter__(self) -> BrokenStore:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    break
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                + f"Content-Length: {self.declared}\r\n\r\n".encode()
            )
            block = b"x" * (256 * KiB)
            left = self.sent
            while left > 0:
                writer.write(block[: min(left, len(block))])
                left -= min(left, len(block))
                await writer.drain()
            if self.close:
                writer.close()
                return
            await asyncio.sleep(3600)
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)


@pytest.mark.parametrize("close", [False, True], ids=["store-goes-silent", "store-closes"])
@pytest.mark.parametrize(
    ("declared", "sent"), [(16 * MiB, 3 * MiB), (16 * KiB, 8 * KiB)], ids=["spliced", "small-read-whole"]
)
def test_a_store_failing_mid_body_cuts_the_client_off_promptly(
    seaweed: Any, tmp_path: Path, close: bool, declared: int, sent: int
) -> None:
    """The spliced relay, and the small body read whole before its head is sent (proxy._relay_whole)."""
    with BrokenStore(declared, sent, close=close) as store:
        proc, gw = start_plain_gateway(
            tmp_path,
            seaweed,
            backend_endpoint=f"http://127.0.0.1:{store.port}",
            extra_toml="read_timeout_s = 1\nconnect_timeout_s = 2",
            server_toml=f"zero_copy_min_bytes = {THRESHOLD}",
        )
        try:
            host, port = urlsplit(gw.http_url).hostname or "127.0.0.1", urlsplit(gw.http_url).port or 80
            baseline = open_fds(gw.pid)
            for _ in range(3):
                conn = http.client.HTTPConnection(host, port, timeout=20)
                started = time.monotonic()
                headers = signed_get(gw, "/bkt/obj")
                conn.request("GET", "/bkt/obj", headers=headers)
                resp = conn.getresponse()
                assert resp.status == 200
                assert int(resp.getheader("Content-Length") or 0) == declared
                with pytest.raises(http.client.IncompleteRead) as info:
                    resp.read()
                elapsed = time.monotonic() - started
                conn.close()
                assert len(info.value.partial) == sent  # what the store sent, and nothing made up
                assert elapsed < 10, f"the client waited {elapsed:.1f} s for a dead body"
            assert metric(gw, "s3lanes_zero_copy_bytes") >= (3 * sent if declared >= THRESHOLD else 0)
            after = wait_fds_at_most(gw.pid, baseline)
            assert after <= baseline, f"descriptors {baseline} -> {after}"
            with urllib.request.urlopen(gw.http_url + "/_s3lanes/healthz", timeout=10) as resp:
                assert resp.status == 200
        finally:
            assert stop_gateway(proc) == 0
        log = gw.log_path.read_text()
        assert log.count("backend body failed mid-stream") == 3, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


def test_zero_copy_off_copies(seaweed: Any, tmp_path: Path, bucket: str) -> None:
    proc, gw = start_plain_gateway(
        tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, server_toml="zero_copy_min_bytes = 0"
    )
    try:
        data = os.urandom(12 * MiB)
        put_direct(seaweed, bucket, "copied", data)
        client = gw.client()
        assert client.get_object(Bucket=bucket, Key="copied")["Body"].read() == data
        assert metric(gw, "s3lanes_zero_copy_bytes") == 0
        assert metric(gw, "s3lanes_lane_bytes", direction="down") >= len(data)
    finally:
        assert stop_gateway(proc) == 0


# -- GETs served from the spool: sendfile ------------------------------------------------------------------


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "zero-copy-off"])
def test_spooled_objects_are_served_exactly_with_sendfile_unless_off(
    seaweed: Any, tmp_path: Path, bucket: str, zero_copy: bool
) -> None:
    """Objects still in the spool (a drain trickling at 200 KB/s) are served from it, byte for byte, on one
    keep-alive connection, every body byte counted as sent without a copy (none with zero copy off)."""
    proc, gw = start_plain_gateway(
        tmp_path,
        seaweed,
        backend_endpoint=seaweed.endpoint_url,
        extra_toml=slow_spool_toml(200_000),
        server_toml="" if zero_copy else "zero_copy_min_bytes = 0",
    )
    try:
        client = gw.client()
        single = os.urandom(3 * MiB + 5)
        client.put_object(Bucket=bucket, Key="single", Body=single)
        parts = [os.urandom(5 * MiB), os.urandom(1 * MiB + 3)]
        up = client.create_multipart_upload(Bucket=bucket, Key="multi")["UploadId"]
        etags = [
            client.upload_part(Bucket=bucket, Key="multi", UploadId=up, PartNumber=i + 1, Body=p)["ETag"]
            for i, p in enumerate(parts)
        ]
        client.complete_multipart_upload(
            Bucket=bucket,
            Key="multi",
            UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]},
        )
        multi = b"".join(parts)
        before = not_drained(gw)
        host, port = urlsplit(gw.http_url).hostname or "127.0.0.1", urlsplit(gw.http_url).port or 80
        conn = http.client.HTTPConnection(host, port, timeout=60)
        served = 0
        try:
            cases = [
                ("single", None, single),
                ("multi", None, multi),
                ("multi", (5 * MiB - 100, 5 * MiB + 99), multi[5 * MiB - 100 : 5 * MiB + 100]),  # both parts
                ("single", (7, 7), single[7:8]),
            ]
            for key, rng, want in cases:
                extra = {"Range": f"bytes={rng[0]}-{rng[1]}"} if rng else None
                status, headers, body = get_on(conn, gw, key_path(bucket, key), extra)
                assert status == (206 if rng else 200), (key, status, body[:300])
                assert headers.get("x-s3lanes-source") == "spool", headers
                assert body == want, key
                served += len(body)
        finally:
            conn.close()
        # The trickling drain's sendfile bytes are the checkpoint lane's; the GETs' are the others'.
        want_bytes = served if zero_copy else 0
        assert settled(lambda: not_drained(gw) - before, want_bytes) == want_bytes
    finally:
        assert stop_gateway(proc) == 0


def not_drained(gw: Gateway) -> float:
    return metric(gw, "s3lanes_zero_copy_bytes") - metric(gw, "s3lanes_zero_copy_bytes", lane="checkpoint")


# -- drains to the store: sendfile -------------------------------------------------------------------------


@pytest.mark.parametrize("zero_copy", [True, False], ids=["sendfile", "zero-copy-off"])
def test_drains_upload_exact_objects_with_sendfile_unless_off(
    seaweed: Any, tmp_path: Path, bucket: str, zero_copy: bool
) -> None:
    """The drain sends spool files to the store with sendfile (single PUTs and multipart parts, several
    uploads on the same keep-alive connections); the store ends up with the exact bytes and the ETags the
    gateway acknowledged, and every drained body byte counts as sent without a copy (none with it off)."""
    proc, gw = start_plain_gateway(
        tmp_path,
        seaweed,
        backend_endpoint=seaweed.endpoint_url,
        extra_toml=slow_spool_toml(50_000_000, drain_concurrency=1),
        server_toml="" if zero_copy else "zero_copy_min_bytes = 0",
    )
    store = s3_client(seaweed)
    try:
        client = gw.client()
        objects: dict[str, tuple[bytes, str]] = {}
        for i, size in enumerate([1, 256 * KiB, 3 * MiB + 5, 700 * KiB + 1]):
            data = os.urandom(size)
            etag = client.put_object(Bucket=bucket, Key=f"ckpt/single-{i}", Body=data)["ETag"]
            objects[f"ckpt/single-{i}"] = (data, etag)
        parts = [os.urandom(5 * MiB), os.urandom(1 * MiB + 3)]
        up = client.create_multipart_upload(Bucket=bucket, Key="ckpt/multi")["UploadId"]
        etags = [
            client.upload_part(Bucket=bucket, Key="ckpt/multi", UploadId=up, PartNumber=i + 1, Body=p)["ETag"]
            for i, p in enumerate(parts)
        ]
        done = client.complete_multipart_upload(
            Bucket=bucket,
            Key="ckpt/multi",
            UploadId=up,
            MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]},
        )
        objects["ckpt/multi"] = (b"".join(parts), done["ETag"])
        result = gw.flush(bucket, "ckpt/")
        assert result["durable"], result
        for key, (data, etag) in objects.items():
            got = store.get_object(Bucket=bucket, Key=key)
            assert got["ETag"] == etag, key
            assert got["Body"].read() == data, key
        total = sum(len(d) for d, _ in objects.values())
        drained = metric(gw, "s3lanes_zero_copy_bytes", lane="checkpoint")
        assert drained == (total if zero_copy else 0)
        assert metric(gw, "s3lanes_lane_bytes", lane="checkpoint", direction="up") >= total
    finally:
        store.close()
        assert stop_gateway(proc) == 0
        assert "Traceback" not in gw.log_path.read_text(errors="replace")
