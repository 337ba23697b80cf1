"""The write spool end to end: a real ``s3lanes serve`` with its spool on, boto3 clients, SeaweedFS as the
ground truth (read directly, bypassing the gateway).

Two gateways do most of the work:

* ``spool_gateway`` (session, conftest): drains as fast as SeaweedFS takes the data.
* ``slow_gateway`` (this module): its backend bandwidth is ``SLOW_RATE_BPS`` and the drainer runs two uploads
  at a time, so what is spooled stays pending long enough to look at it (listing merges, ordering while an
  upload is on the wire, commit markers, flush timeouts). :func:`hold_drain` occupies both drain slots with
  two "blocker" objects, so everything spooled after it waits for about ``HOLD_S``.

Tests that need a pending entry check afterwards that it really was pending (the backend did not have it
yet, or the ack came from the spool), so a drain faster than planned fails the test instead of letting it
pass vacuously. Every test drains its bucket before the bucket is deleted (fixtures ``fast``/``slow``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, slow_spool_toml, start_plain_gateway, stop_and_check

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB

SOURCE_HEADER = "x-s3lanes-source"
WRITE_THROUGH_HEADER = "x-s3lanes-write-through"

# The slow gateway's backend bandwidth: drains of a few MiB take about a second.
SLOW_RATE_BPS = 4_000_000
HOLD_S = 1.5
SLOW_TOML = slow_spool_toml(SLOW_RATE_BPS, spool_extra="retry_base_s = 0.1\nretry_max_s = 0.5\n")

HEX_FILE_NAME = re.compile(r"[0-9a-f]{32}")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


# --- helpers ---------------------------------------------------------------------------------------------


def md5_etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def multipart_etag(parts: list[bytes]) -> str:
    joined = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(joined).hexdigest()}-{len(parts)}"'


# Local twins of tests/e2e/s3raw.py helpers: importing that module makes `mypy` on this file report an error
# in it (its SigV4Auth subclass).
def client_error(exc: ClientError) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a boto3 ClientError."""
    return str(exc.response["Error"]["Code"]), int(exc.response["ResponseMetadata"]["HTTPStatusCode"])


def object_exists(backend: Any, bucket: str, key: str) -> bool:
    try:
        backend.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if client_error(exc)[1] == 404:
            return False
        raise
    return True


def all_keys(backend: Any, bucket: str, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for page in backend.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return keys


def source(resp: dict[str, Any]) -> str | None:
    """``x-s3lanes-source`` of a boto3 response (``"spool"`` when the spool answered or absorbed it)."""
    value = resp["ResponseMetadata"]["HTTPHeaders"].get(SOURCE_HEADER)
    return None if value is None else str(value)


def read(client: Any, bucket: str, key: str, **kwargs: Any) -> bytes:
    body: bytes = client.get_object(Bucket=bucket, Key=key, **kwargs)["Body"].read()
    return body


def backend_etag(backend: Any, bucket: str, key: str) -> str | None:
    """The backend's ETag of the key, None if it does not have it."""
    try:
        return str(backend.head_object(Bucket=bucket, Key=key)["ETag"])
    except ClientError as exc:
        if client_error(exc)[1] == 404:
            return None
        raise


def add_header(client: Any, event: str, name: str, value: str) -> None:
    """Put a header on every ``event`` request of this client (signed with the rest)."""

    def hook(request: Any, **_: Any) -> None:
        request.headers[name] = value

    client.meta.events.register(f"before-sign.s3.{event}", hook)


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def spool_status(gw: Gateway) -> dict[str, Any]:
    doc: dict[str, Any] = gw.status()["spool"]
    return doc


def in_flight(gw: Gateway) -> int:
    return int(spool_status(gw)["drain"]["in_flight"])


def drained_bytes(gw: Gateway) -> int:
    """Bytes the drainer confirmed on the backend since the gateway started (superseded data never counts:
    it is either not uploaded or its upload is cancelled)."""
    return int(spool_status(gw)["drained_bytes_total"])


def flush_url(gw: Gateway, bucket: str, prefix: str, timeout_s: float) -> str:
    query = urllib.parse.urlencode({"bucket": bucket, "prefix": prefix, "timeout": str(timeout_s)})
    return f"{gw.http_url}/_s3lanes/flush?{query}"


def post_flush(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """POST the flush API; (HTTP status, JSON document), error statuses included."""
    req = urllib.request.Request(url, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        finally:
            exc.close()


def scrape(gw: Gateway) -> dict[str, float]:
    """Unlabelled samples of the gateway's Prometheus text (``name -> value``)."""
    with urllib.request.urlopen(f"{gw.http_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        if "{" not in name:
            out[name] = float(value)
    return out


def write_through_count(gw: Gateway, reason: str) -> float:
    """``s3lanes_spool_write_through_total{reason=...}`` (0 before its first increment)."""
    with urllib.request.urlopen(f"{gw.http_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    wanted = f's3lanes_spool_write_through_total{{reason="{reason}"}} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line[len(wanted) :])
    return 0.0


def drained_bytes_metric(samples: dict[str, float]) -> float:
    # A counter; prometheus_client exposes it with the _total suffix.
    for name in ("s3lanes_spool_drained_bytes_total", "s3lanes_spool_drained_bytes"):
        if name in samples:
            return samples[name]
    raise AssertionError(f"no s3lanes_spool_drained_bytes in {sorted(samples)}")


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def spool_data_names(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir())


@dataclass
class BackendWatcher:
    """Polls the backend from a thread, with its own client, while the test drives the gateway; keeps every
    observation (``probe(client)``) in order. Use as a context manager; a probe error fails the test."""

    seaweed: Any
    probe: Callable[[Any], Any]
    interval_s: float = 0.01
    observations: list[Any] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _error: list[BaseException] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        client = s3_client(self.seaweed)
        try:
            while not self._stop.is_set():
                self.observations.append(self.probe(client))
                self._stop.wait(self.interval_s)
            self.observations.append(self.probe(client))
        except BaseException as exc:
            self._error.append(exc)
        finally:
            client.close()

    def __enter__(self) -> BackendWatcher:
        self._thread = threading.Thread(target=self._run, name="backend-watcher", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)
        if self._error:
            raise self._error[0]


def hold_drain(s3: Any, bucket: str, hold_s: float = HOLD_S) -> int:
    """On the slow gateway: spool two blocker objects that occupy both drain slots for about ``hold_s``, so
    whatever is spooled next stays pending meanwhile. Returns the bytes spooled."""
    size = int(SLOW_RATE_BPS * hold_s / 2)
    for n in range(2):
        resp = s3.put_object(Bucket=bucket, Key=f"zz-hold/blocker-{n}", Body=os.urandom(size))
        assert source(resp) == "spool"
    return 2 * size


# --- fixtures --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlainGateway:
    gw: Gateway
    tmp: Path

    @property
    def spool_data(self) -> Path:
        return self.tmp / "state" / "spool" / "data"


@pytest.fixture(scope="module")
def slow_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlainGateway]:
    """A spooling gateway (HTTP, admin identity) whose drain runs at SLOW_RATE_BPS, two uploads at a time."""
    tmp = tmp_path_factory.mktemp("slow-spool-gateway")
    proc, gw = start_plain_gateway(tmp, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=SLOW_TOML)
    try:
        yield PlainGateway(gw, tmp)
    finally:
        stop_and_check(proc, gw)


@pytest.fixture
def slow(slow_gateway: PlainGateway, bucket: str) -> Iterator[PlainGateway]:
    """The slow gateway; the test's bucket is drained afterwards (before the bucket is deleted), its drain
    resumed first if the test paused it."""
    yield slow_gateway
    slow_gateway.gw.drain_paused(False)
    slow_gateway.gw.flush(bucket)


@pytest.fixture
def fast(spool_gateway: Gateway, bucket: str) -> Iterator[Gateway]:
    """The session spool gateway; the test's bucket is drained afterwards."""
    yield spool_gateway
    spool_gateway.flush(bucket)


# --- 1. acknowledged before durable, read back at once ---------------------------------------------------


def test_put_is_served_from_the_spool_at_once_and_lands_byte_exact_with_the_acked_etag(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    s3 = slow.gw.client()
    data = os.urandom(3 * MiB + 17)
    put = s3.put_object(
        Bucket=bucket,
        Key="ckpt/obj.bin",
        Body=data,
        ContentType="application/x-test",
        Metadata={"step": "10", "note": "spooled"},
        ContentDisposition="attachment",
    )
    assert put["ETag"] == md5_etag(data)
    assert source(put) == "spool"
    # Acknowledged, not yet durable: the drain of 3 MiB at SLOW_RATE_BPS takes most of a second.
    assert not object_exists(backend, bucket, "ckpt/obj.bin")

    head = s3.head_object(Bucket=bucket, Key="ckpt/obj.bin")
    assert source(head) == "spool"
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == md5_etag(data)
    assert head["ContentType"] == "application/x-test"
    assert head["Metadata"] == {"step": "10", "note": "spooled"}
    assert head["ContentDisposition"] == "attachment"

    got = s3.get_object(Bucket=bucket, Key="ckpt/obj.bin")
    assert source(got) == "spool"
    assert got["Body"].read() == data
    assert got["ETag"] == md5_etag(data)
    assert got["ContentType"] == "application/x-test"

    ranged = s3.get_object(Bucket=bucket, Key="ckpt/obj.bin", Range="bytes=1000-1999")
    assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert ranged["ContentRange"] == f"bytes 1000-1999/{len(data)}"
    assert ranged["Body"].read() == data[1000:2000]
    suffix = s3.get_object(Bucket=bucket, Key="ckpt/obj.bin", Range="bytes=-100")
    assert suffix["Body"].read() == data[-100:]
    assert not object_exists(backend, bucket, "ckpt/obj.bin"), "the reads above came from the backend"

    slow.gw.flush(bucket)
    stored = backend.get_object(Bucket=bucket, Key="ckpt/obj.bin")
    assert stored["Body"].read() == data
    assert stored["ETag"] == md5_etag(data)
    assert stored["ContentType"] == "application/x-test"
    assert stored["Metadata"] == {"step": "10", "note": "spooled"}
    assert stored["ContentDisposition"] == "attachment"


def test_multipart_upload_is_readable_at_once_and_the_backend_etag_equals_the_acked_one(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    s3 = slow.gw.client()
    parts = [os.urandom(5 * MiB) for _ in range(3)] + [os.urandom(300 * KiB + 3)]
    data = b"".join(parts)
    key = "ckpt/step-1/model.bin"
    created = s3.create_multipart_upload(
        Bucket=bucket, Key=key, ContentType="application/x-model", Metadata={"shard": "0"}
    )
    assert source(created) == "spool"
    upload_id = created["UploadId"]
    done = []
    for number, part in enumerate(parts, start=1):
        resp = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=part)
        assert resp["ETag"] == md5_etag(part)
        done.append({"PartNumber": number, "ETag": resp["ETag"]})
    completed = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )
    assert source(completed) == "spool"
    assert completed["ETag"] == multipart_etag(parts)

    head = s3.head_object(Bucket=bucket, Key=key)
    assert source(head) == "spool"
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == multipart_etag(parts)
    assert head["ContentType"] == "application/x-model"
    assert head["Metadata"] == {"shard": "0"}
    got = s3.get_object(Bucket=bucket, Key=key)
    assert source(got) == "spool"
    assert got["Body"].read() == data
    # A range across the boundary of parts 1 and 2, and one inside the tail part.
    lo, hi = 5 * MiB - 10, 5 * MiB + 9
    across = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={lo}-{hi}")
    assert across["Body"].read() == data[lo : hi + 1]
    tail = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={15 * MiB + 5}-")
    assert tail["Body"].read() == data[15 * MiB + 5 :]
    assert not object_exists(backend, bucket, key), "the reads above came from the backend"

    slow.gw.flush(bucket)
    stored = backend.get_object(Bucket=bucket, Key=key)
    assert stored["Body"].read() == data
    # The drain reproduced the client's part layout: same multipart ETag.
    assert stored["ETag"] == multipart_etag(parts)
    assert stored["ContentType"] == "application/x-model"
    assert stored["Metadata"] == {"shard": "0"}
    assert backend.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def b64_md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def test_content_md5_is_checked_by_the_spool_before_the_ack_and_a_wrong_one_leaves_nothing(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    """rclone and minio send Content-MD5 on PutObject and UploadPart. The spool checks it against the MD5
    it computes for the ETag: right, acknowledged from the spool; wrong, 400 BadDigest and nothing kept."""
    s3 = slow.gw.client()
    data = os.urandom(2 * MiB + 5)
    good = s3.put_object(Bucket=bucket, Key="ckpt/md5/good.bin", Body=data, ContentMD5=b64_md5(data))
    assert source(good) == "spool"
    assert good["ETag"] == md5_etag(data)

    def files() -> set[str]:
        return {f.name for f in slow.spool_data.iterdir()}

    before = files()
    with pytest.raises(ClientError) as caught:
        s3.put_object(Bucket=bucket, Key="ckpt/md5/bad.bin", Body=data, ContentMD5=b64_md5(data[:-1]))
    assert client_error(caught.value) == ("BadDigest", 400)
    assert caught.value.response["Error"]["ExpectedDigest"] == b64_md5(data[:-1])
    assert caught.value.response["Error"]["CalculatedDigest"] == b64_md5(data)
    assert files() <= before, "the refused body left a spool file"
    with pytest.raises(ClientError) as missing:
        s3.head_object(Bucket=bucket, Key="ckpt/md5/bad.bin")
    assert client_error(missing.value)[1] == 404

    # A part: a wrong Content-MD5 is refused and the upload has no such part; the right one is taken.
    key = "ckpt/md5/parts.bin"
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = os.urandom(5 * MiB)
    before = files()
    with pytest.raises(ClientError) as bad_part:
        s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=part, ContentMD5=b64_md5(b"x")
        )
    assert client_error(bad_part.value) == ("BadDigest", 400)
    assert files() <= before, "the refused part left a spool file"
    assert s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id).get("Parts", []) == []
    ok = s3.upload_part(
        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=part, ContentMD5=b64_md5(part)
    )
    assert ok["ETag"] == md5_etag(part)
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": ok["ETag"]}]},
    )

    slow.gw.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="ckpt/md5/good.bin")["Body"].read() == data
    assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == part
    assert not object_exists(backend, bucket, "ckpt/md5/bad.bin")


def test_put_over_https_with_aws_chunked_body_is_spooled_byte_exact(
    fast: Gateway, backend: Any, bucket: str
) -> None:
    s3 = fast.client(https=True)
    data = os.urandom(2 * MiB + 5)
    put = s3.put_object(Bucket=bucket, Key="ckpt/https.bin", Body=data, Metadata={"k": "v"})
    assert source(put) == "spool"
    assert put["ETag"] == md5_etag(data)
    assert read(s3, bucket, "ckpt/https.bin") == data
    fast.flush(bucket)
    stored = backend.get_object(Bucket=bucket, Key="ckpt/https.bin")
    assert stored["Body"].read() == data
    assert stored["ETag"] == md5_etag(data)
    assert stored["Metadata"] == {"k": "v"}


# --- 2. listings merge the spool with the backend --------------------------------------------------------


def utf8_sorted(keys: set[str]) -> list[str]:
    return sorted(keys, key=lambda k: k.encode())


def listed_v2(
    s3: Any, bucket: str, page_size: int | None = None, **kwargs: Any
) -> tuple[list[str], list[str]]:
    """(keys, common prefixes) of a whole ListObjectsV2, page by page, in the order the pages gave them."""
    keys: list[str] = []
    prefixes: list[str] = []
    config = {"PageSize": page_size} if page_size else {}
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig=config, **kwargs
    ):
        keys.extend(o["Key"] for o in page.get("Contents", []))
        prefixes.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
    return keys, prefixes


def listed_v1(
    s3: Any, bucket: str, page_size: int | None = None, **kwargs: Any
) -> tuple[list[str], list[str]]:
    keys: list[str] = []
    prefixes: list[str] = []
    config = {"PageSize": page_size} if page_size else {}
    for page in s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig=config, **kwargs):
        keys.extend(o["Key"] for o in page.get("Contents", []))
        prefixes.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
    return keys, prefixes


def test_listings_merge_spooled_and_backend_keys_exactly_once_in_order(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    s3 = slow.gw.client()
    on_backend = {
        "list/b-01": b"b1",
        "list/dir1/b-x": b"bx",
        "list/dir2/b-y": b"by",
        "list/over": b"old",
        "list/dir3/over-del": b"backend copy, deleted through the gateway",
        "list/z-last": b"z",
    }
    for key, body in on_backend.items():
        backend.put_object(Bucket=bucket, Key=key, Body=body)
    slow.gw.drain_paused(True)  # the spooled writes below stay pending while the listings run
    spooled = {
        "list/s-01": b"s1",
        "list/s-03": b"s3" * 100,
        "list/dir1/s-a": b"sa",
        "list/dir4/s-only": b"only in the spool",
        "list/over": b"newer and longer",
        "list/\u00e9-unicode": b"u",
        "list/s-del": b"deleted while spooled",
        "list/dir3/over-del": b"spooled over the backend copy",
    }
    for key, body in spooled.items():
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=body)) == "spool"
    for key in ("list/s-del", "list/dir3/over-del"):
        deleted = s3.delete_object(Bucket=bucket, Key=key)
        assert deleted["ResponseMetadata"]["HTTPStatusCode"] == 204
        assert source(deleted) == "spool"
    gone = {"list/s-del", "list/dir3/over-del"}
    final = {**on_backend, **spooled}
    for key in gone:
        del final[key]
    expected = utf8_sorted(set(final))

    def check_listings(dirs: list[str], dirs_v1: list[str] | None = None) -> None:
        # Whole listing: every key once, S3 order, sizes and ETags of the newest version.
        page = s3.list_objects_v2(Bucket=bucket, Prefix="list/")
        assert [o["Key"] for o in page["Contents"]] == expected
        assert {o["Key"]: o["Size"] for o in page["Contents"]} == {k: len(v) for k, v in final.items()}
        assert {o["Key"]: o["ETag"] for o in page["Contents"]} == {k: md5_etag(v) for k, v in final.items()}
        assert page["KeyCount"] == len(expected)
        # Paginated (V2 continuation tokens, V1 markers) with and without a delimiter.
        for page_size in (1, 2, 3):
            assert listed_v2(s3, bucket, page_size, Prefix="list/") == (expected, [])
            assert listed_v1(s3, bucket, page_size, Prefix="list/") == (expected, [])
        top = [k for k in expected if "/" not in k.removeprefix("list/")]
        for delimited_page in (None, 1, 2):
            keys, prefixes = listed_v2(s3, bucket, delimited_page, Prefix="list/", Delimiter="/")
            assert (keys, prefixes) == (top, dirs), delimited_page
            keys, prefixes = listed_v1(s3, bucket, delimited_page, Prefix="list/", Delimiter="/")
            assert (keys, prefixes) == (top, dirs if dirs_v1 is None else dirs_v1), delimited_page
        # A narrower prefix: one spooled and one backend key.
        assert listed_v2(s3, bucket, 1, Prefix="list/dir1/") == (["list/dir1/b-x", "list/dir1/s-a"], [])
        # Deleted while spooled: not readable either, although the backend still has one of them.
        for key in gone:
            with pytest.raises(ClientError) as err:
                s3.get_object(Bucket=bucket, Key=key)
            assert client_error(err.value) == ("NoSuchKey", 404)
            with pytest.raises(ClientError) as err:
                s3.head_object(Bucket=bucket, Key=key)
            assert client_error(err.value)[1] == 404

    check_listings(["list/dir1/", "list/dir2/", "list/dir4/"])  # dir3's only key is deleted
    # The merge was exercised: the spooled keys were still pending while the listings above ran.
    assert set(all_keys(backend, bucket, "list/")) == set(on_backend), "the drain outran the test"
    assert backend_etag(backend, bucket, "list/over") == md5_etag(b"old")

    slow.gw.drain_paused(False)
    slow.gw.flush(bucket)
    assert utf8_sorted(set(all_keys(backend, bucket, "list/"))) == expected
    for key, body in final.items():
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    for key in gone:
        assert not object_exists(backend, bucket, key)
    # SeaweedFS may keep an emptied directory as a common prefix, and its V1 and V2 listings need not agree
    # on it: after the drain the backend decides, per API.
    on_backend_v2 = backend.list_objects_v2(Bucket=bucket, Prefix="list/", Delimiter="/")["CommonPrefixes"]
    on_backend_v1 = backend.list_objects(Bucket=bucket, Prefix="list/", Delimiter="/")["CommonPrefixes"]
    check_listings([p["Prefix"] for p in on_backend_v2], [p["Prefix"] for p in on_backend_v1])


def test_listing_continuation_token_issued_while_spooled_still_works_after_the_drain(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    s3 = slow.gw.client()
    for n in (0, 2, 4):
        backend.put_object(Bucket=bucket, Key=f"tok/k-{n}", Body=b"b")
    slow.gw.drain_paused(True)
    for n in (1, 3, 5):
        assert source(s3.put_object(Bucket=bucket, Key=f"tok/k-{n}", Body=b"s")) == "spool"
    expected = [f"tok/k-{n}" for n in range(6)]
    v2 = s3.list_objects_v2(Bucket=bucket, Prefix="tok/", MaxKeys=3)
    assert [o["Key"] for o in v2["Contents"]] == expected[:3]
    assert v2["IsTruncated"]
    v1 = s3.list_objects(Bucket=bucket, Prefix="tok/", MaxKeys=3)
    assert [o["Key"] for o in v1["Contents"]] == expected[:3]
    assert not object_exists(backend, bucket, "tok/k-1"), "the drain outran the test"

    # The client pages on after the spooled keys reached the backend (a listing racing the drain). The token
    # is the gateway's own; with nothing spooled under the prefix any more it must still be understood.
    slow.gw.drain_paused(False)
    slow.gw.flush(bucket)
    rest = s3.list_objects_v2(
        Bucket=bucket, Prefix="tok/", MaxKeys=3, ContinuationToken=v2["NextContinuationToken"]
    )
    assert [o["Key"] for o in rest.get("Contents", [])] == expected[3:]
    rest_v1 = s3.list_objects(Bucket=bucket, Prefix="tok/", MaxKeys=3, Marker=expected[2])
    assert [o["Key"] for o in rest_v1.get("Contents", [])] == expected[3:]


# --- 3. ordering: the backend ends in the order the gateway acknowledged ---------------------------------


def watch_key(seaweed: Any, bucket: str, key: str) -> BackendWatcher:
    """Records the backend's ETag of ``key`` (None: absent) over time."""
    return BackendWatcher(seaweed, lambda client: backend_etag(client, bucket, key))


def transitions(observations: list[Any]) -> list[Any]:
    """The observations with repeats collapsed: the states the backend went through, in order."""
    out: list[Any] = []
    for obs in observations:
        if not out or out[-1] != obs:
            out.append(obs)
    return out


def test_put_put_delete_put_of_one_key_ends_with_the_last_put_and_never_goes_back(
    slow: PlainGateway, backend: Any, bucket: str, seaweed: Any
) -> None:
    s3 = slow.gw.client()
    v1, v2, v3 = os.urandom(1 * MiB), os.urandom(1 * MiB + 1), os.urandom(100 * KiB)
    drained_before = drained_bytes(slow.gw)
    assert source(s3.put_object(Bucket=bucket, Key="k", Body=v1)) == "spool"
    assert source(s3.put_object(Bucket=bucket, Key="k", Body=v2)) == "spool"
    assert source(s3.delete_object(Bucket=bucket, Key="k")) == "spool"
    assert source(s3.put_object(Bucket=bucket, Key="k", Body=v3)) == "spool"
    with watch_key(seaweed, bucket, "k") as watcher:
        assert read(s3, bucket, "k") == v3
        slow.gw.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="k")["Body"].read() == v3
    seen = transitions(watcher.observations)
    # Whatever reached the backend before the last ack may be seen first; after that only v3 may appear.
    assert seen[-1] == md5_etag(v3)
    assert md5_etag(v1) not in seen[1:] and md5_etag(v2) not in seen[1:], seen
    assert seen.count(md5_etag(v3)) == 1, seen
    # Superseded data was not uploaded (v1 only if it was complete on the backend before v2's ack).
    uploaded = drained_bytes(slow.gw) - drained_before
    assert uploaded in (len(v3), len(v1) + len(v3)), uploaded
    assert (uploaded == len(v1) + len(v3)) == (seen[0] == md5_etag(v1)), (uploaded, seen)


def test_put_then_delete_never_leaves_the_object_on_the_backend(
    slow: PlainGateway, backend: Any, bucket: str, seaweed: Any
) -> None:
    s3 = slow.gw.client()
    # (a) The PUT is still queued (both drain slots busy) when the DELETE is acknowledged.
    drained_before = drained_bytes(slow.gw)
    held = hold_drain(s3, bucket, hold_s=0.8)
    queued = os.urandom(512 * KiB)
    assert source(s3.put_object(Bucket=bucket, Key="queued", Body=queued)) == "spool"
    assert source(s3.delete_object(Bucket=bucket, Key="queued")) == "spool"
    with watch_key(seaweed, bucket, "queued") as watcher:
        with pytest.raises(ClientError) as err:
            s3.get_object(Bucket=bucket, Key="queued")
        assert client_error(err.value) == ("NoSuchKey", 404)
        slow.gw.flush(bucket)
    assert set(watcher.observations) == {None}, transitions(watcher.observations)
    assert drained_bytes(slow.gw) - drained_before == held, "the deleted object was uploaded"

    # (b) The PUT is on the wire to the backend when the DELETE is acknowledged: the upload is cancelled.
    on_wire = os.urandom(3 * MiB)
    assert source(s3.put_object(Bucket=bucket, Key="on-wire", Body=on_wire)) == "spool"
    wait_until(lambda: in_flight(slow.gw) == 1, 5, "the drain to start uploading")
    assert not object_exists(backend, bucket, "on-wire")
    assert source(s3.delete_object(Bucket=bucket, Key="on-wire")) == "spool"
    with watch_key(seaweed, bucket, "on-wire") as watcher:
        slow.gw.flush(bucket)
        time.sleep(0.2)  # a late upload would show now
    assert set(watcher.observations) == {None}, transitions(watcher.observations)
    assert not object_exists(backend, bucket, "on-wire")
    assert drained_bytes(slow.gw) - drained_before == held, "the cancelled upload counted as drained"


def test_overwrite_of_a_key_whose_older_version_is_mid_upload_ends_with_the_new_version(
    slow: PlainGateway, backend: Any, bucket: str, seaweed: Any
) -> None:
    s3 = slow.gw.client()
    # A single-PUT upload cancelled mid-body.
    old = os.urandom(3 * MiB)
    new = os.urandom(200 * KiB)
    assert source(s3.put_object(Bucket=bucket, Key="single", Body=old)) == "spool"
    wait_until(lambda: in_flight(slow.gw) == 1, 5, "the drain to start uploading")
    assert not object_exists(backend, bucket, "single")
    assert source(s3.put_object(Bucket=bucket, Key="single", Body=new)) == "spool"
    with watch_key(seaweed, bucket, "single") as watcher:
        assert read(s3, bucket, "single") == new
        slow.gw.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="single")["Body"].read() == new
    assert md5_etag(old) not in watcher.observations, transitions(watcher.observations)

    # A multipart drain cancelled between parts: its backend upload is aborted, not left behind.
    parts = [os.urandom(5 * MiB), os.urandom(1 * KiB)]
    mpu = s3.create_multipart_upload(Bucket=bucket, Key="multi")
    uploaded = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(
                Bucket=bucket, Key="multi", UploadId=mpu["UploadId"], PartNumber=n, Body=part
            )["ETag"],
        }
        for n, part in enumerate(parts, start=1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="multi", UploadId=mpu["UploadId"], MultipartUpload={"Parts": uploaded}
    )
    wait_until(
        lambda: bool(backend.list_multipart_uploads(Bucket=bucket).get("Uploads")),
        5,
        "the drain to start its backend multipart upload",
    )
    assert source(s3.put_object(Bucket=bucket, Key="multi", Body=new)) == "spool"
    with watch_key(seaweed, bucket, "multi") as watcher:
        slow.gw.flush(bucket)
    assert backend.get_object(Bucket=bucket, Key="multi")["Body"].read() == new
    assert multipart_etag(parts) not in watcher.observations, transitions(watcher.observations)
    assert backend.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


# --- 4. commit markers reach the backend after the shards before them ------------------------------------


def test_commit_marker_is_never_on_the_backend_while_a_shard_before_it_is_missing(
    slow: PlainGateway, backend: Any, bucket: str, seaweed: Any
) -> None:
    s3 = slow.gw.client()
    step = "ckpt/step-10/"
    # Staggered sizes: the two drain slots free up at different times, so without the ordering rule the
    # manifest would get a slot about half a second before the last shard is on the backend.
    sizes = (128 * KiB, 1 * MiB, 1 * MiB + 1, 1 * MiB + 2)
    shards = {f"{step}__{n}_0.distcp": os.urandom(size) for n, size in enumerate(sizes)}
    manifest = b'{"state_dict_metadata": "small manifest"}'
    for key, body in shards.items():
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=body)) == "spool"
    assert source(s3.put_object(Bucket=bucket, Key=f"{step}.metadata", Body=manifest)) == "spool"
    # DeepSpeed's `latest` one level up names the step: it waits for everything under ckpt/.
    assert source(s3.put_object(Bucket=bucket, Key="ckpt/latest", Body=b"step-10")) == "spool"

    def sizes_under_ckpt(client: Any) -> dict[str, int]:
        page = client.list_objects_v2(Bucket=bucket, Prefix="ckpt/")
        return {o["Key"]: o["Size"] for o in page.get("Contents", [])}

    with BackendWatcher(seaweed, sizes_under_ckpt) as watcher:
        slow.gw.flush(bucket)
    complete = {key: len(body) for key, body in shards.items()}
    seen = transitions(watcher.observations)
    for obs in seen:
        on_backend_shards = {k: v for k, v in obs.items() if k in complete}
        if f"{step}.metadata" in obs:
            assert on_backend_shards == complete, f"the manifest was on the backend before its shards: {obs}"
        if "ckpt/latest" in obs:
            assert f"{step}.metadata" in obs and on_backend_shards == complete, f"`latest` came early: {obs}"
    # The watcher saw the drain in progress (shards arriving one by one), so the checks had teeth.
    assert any(0 < len(obs) < len(shards) for obs in seen), seen
    assert seen[-1] == {**complete, f"{step}.metadata": len(manifest), "ckpt/latest": 7}
    assert backend.get_object(Bucket=bucket, Key=f"{step}.metadata")["Body"].read() == manifest

    # A marker waits for its own directory only: step-40's is not held back by step-30's shard.
    assert source(s3.put_object(Bucket=bucket, Key="ckpt/step-30/shard", Body=os.urandom(2 * MiB))) == "spool"
    assert source(s3.put_object(Bucket=bucket, Key="ckpt/step-40/.metadata", Body=b"40")) == "spool"
    with BackendWatcher(seaweed, sizes_under_ckpt) as watcher:
        slow.gw.flush(bucket)
    assert any(
        "ckpt/step-40/.metadata" in obs and "ckpt/step-30/shard" not in obs for obs in watcher.observations
    ), transitions(watcher.observations)


# --- 5. CopyObject and UploadPartCopy from a spooled source ----------------------------------------------


def test_copy_object_from_a_spooled_source_with_copy_and_replace_metadata(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    s3 = slow.gw.client()
    slow.gw.drain_paused(True)  # whatever the machine's load, the sources stay in the spool meanwhile
    data = os.urandom(300 * KiB + 1)
    s3.put_object(
        Bucket=bucket, Key="src/obj", Body=data, ContentType="text/x-source", Metadata={"origin": "src"}
    )
    copied = s3.copy_object(Bucket=bucket, Key="dst/copy", CopySource={"Bucket": bucket, "Key": "src/obj"})
    assert source(copied) == "spool"  # the spool copied it (a backend-side copy would not say so)
    assert copied["CopyObjectResult"]["ETag"] == md5_etag(data)
    replaced = s3.copy_object(
        Bucket=bucket,
        Key="dst/replace",
        CopySource={"Bucket": bucket, "Key": "src/obj"},
        MetadataDirective="REPLACE",
        ContentType="application/x-new",
        Metadata={"fresh": "yes"},
    )
    assert source(replaced) == "spool"
    assert replaced["CopyObjectResult"]["ETag"] == md5_etag(data)
    # Onto itself with new metadata (the one legal self-copy).
    in_place = s3.copy_object(
        Bucket=bucket,
        Key="src/obj",
        CopySource={"Bucket": bucket, "Key": "src/obj"},
        MetadataDirective="REPLACE",
        ContentType="text/x-source",
        Metadata={"origin": "src", "edited": "1"},
    )
    assert source(in_place) == "spool"
    assert not object_exists(backend, bucket, "src/obj"), "the drain ran while paused"

    expected = {
        "dst/copy": ("text/x-source", {"origin": "src"}),
        "dst/replace": ("application/x-new", {"fresh": "yes"}),
        "src/obj": ("text/x-source", {"origin": "src", "edited": "1"}),
    }

    def check(client: Any) -> None:
        for key, (content_type, meta) in expected.items():
            got = client.get_object(Bucket=bucket, Key=key)
            assert got["Body"].read() == data, key
            assert got["ETag"] == md5_etag(data), key
            assert (got["ContentType"], got["Metadata"]) == (content_type, meta), key

    check(s3)
    slow.gw.drain_paused(False)
    slow.gw.flush(bucket)
    check(backend)
    check(s3)


def test_upload_part_copy_from_a_spooled_source_into_a_spooled_multipart_upload(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    s3 = slow.gw.client()
    slow.gw.drain_paused(True)  # whatever the machine's load, the sources stay in the spool meanwhile
    big = os.urandom(5 * MiB + 100)
    small = os.urandom(64 * KiB)
    s3.put_object(Bucket=bucket, Key="src/big", Body=big)
    s3.put_object(Bucket=bucket, Key="src/small", Body=small)
    mpu = s3.create_multipart_upload(Bucket=bucket, Key="dst/assembled", ContentType="application/x-mpu")
    assert mpu["UploadId"].startswith("s3lanes-"), "the upload is not held by the spool"
    upload_id = mpu["UploadId"]
    part1 = s3.upload_part_copy(
        Bucket=bucket,
        Key="dst/assembled",
        UploadId=upload_id,
        PartNumber=1,
        CopySource={"Bucket": bucket, "Key": "src/big"},
        CopySourceRange=f"bytes=0-{5 * MiB - 1}",
    )
    part2 = s3.upload_part_copy(
        Bucket=bucket,
        Key="dst/assembled",
        UploadId=upload_id,
        PartNumber=2,
        CopySource={"Bucket": bucket, "Key": "src/small"},
    )
    for key in ("src/big", "src/small"):
        assert not object_exists(backend, bucket, key), "the drain ran while paused"
    pieces = [big[: 5 * MiB], small]
    assert part1["CopyPartResult"]["ETag"] == md5_etag(pieces[0])
    assert part2["CopyPartResult"]["ETag"] == md5_etag(pieces[1])
    etags = [part1["CopyPartResult"]["ETag"], part2["CopyPartResult"]["ETag"]]
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="dst/assembled",
        UploadId=upload_id,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, start=1)]},
    )
    assert done["ETag"] == multipart_etag(pieces)
    got = s3.get_object(Bucket=bucket, Key="dst/assembled")
    assert got["Body"].read() == b"".join(pieces)
    assert got["ContentType"] == "application/x-mpu"

    slow.gw.drain_paused(False)
    slow.gw.flush(bucket)
    stored = backend.get_object(Bucket=bucket, Key="dst/assembled")
    assert stored["Body"].read() == b"".join(pieces)
    assert stored["ETag"] == multipart_etag(pieces)
    assert stored["ContentType"] == "application/x-mpu"


# --- 6. multipart uploads held by the spool: ListParts, ListMultipartUploads, abort ------------------------


def test_aborted_spooled_multipart_uploads_leave_nothing_and_are_no_longer_listed(
    fast: Gateway, backend: Any, bucket: str
) -> None:
    s3 = fast.client()
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(10 * KiB)]
    aborted = s3.create_multipart_upload(Bucket=bucket, Key="mpu/aborted")["UploadId"]
    other = s3.create_multipart_upload(Bucket=bucket, Key="mpu/other")["UploadId"]
    direct = backend.create_multipart_upload(Bucket=bucket, Key="mpu/on-backend")["UploadId"]
    assert aborted.startswith("s3lanes-") and other.startswith("s3lanes-")
    for n, part in enumerate(parts, start=1):
        resp = s3.upload_part(Bucket=bucket, Key="mpu/aborted", UploadId=aborted, PartNumber=n, Body=part)
        assert source(resp) == "spool"
    s3.upload_part(Bucket=bucket, Key="mpu/other", UploadId=other, PartNumber=1, Body=b"x")

    # ListParts, whole and page by page.
    listed = s3.list_parts(Bucket=bucket, Key="mpu/aborted", UploadId=aborted)
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed["Parts"]] == [
        (n, len(part), md5_etag(part)) for n, part in enumerate(parts, start=1)
    ]
    paged = [
        p["PartNumber"]
        for page in s3.get_paginator("list_parts").paginate(
            Bucket=bucket, Key="mpu/aborted", UploadId=aborted, PaginationConfig={"PageSize": 2}
        )
        for p in page.get("Parts", [])
    ]
    assert paged == [1, 2, 3]

    def open_uploads() -> set[tuple[str, str]]:
        page = s3.list_multipart_uploads(Bucket=bucket, Prefix="mpu/")
        return {(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])}

    assert open_uploads() == {("mpu/aborted", aborted), ("mpu/other", other), ("mpu/on-backend", direct)}
    assert source(s3.abort_multipart_upload(Bucket=bucket, Key="mpu/aborted", UploadId=aborted)) == "spool"
    assert open_uploads() == {("mpu/other", other), ("mpu/on-backend", direct)}
    with pytest.raises(ClientError) as err:
        s3.list_parts(Bucket=bucket, Key="mpu/aborted", UploadId=aborted)
    assert client_error(err.value) == ("NoSuchUpload", 404)
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mpu/aborted",
            UploadId=aborted,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": md5_etag(parts[0])}]},
        )
    assert client_error(err.value) == ("NoSuchUpload", 404)
    s3.abort_multipart_upload(Bucket=bucket, Key="mpu/other", UploadId=other)
    assert open_uploads() == {("mpu/on-backend", direct)}

    fast.flush(bucket)
    assert all_keys(backend, bucket) == []
    on_backend = backend.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in on_backend] == [("mpu/on-backend", direct)]
    backend.abort_multipart_upload(Bucket=bucket, Key="mpu/on-backend", UploadId=direct)


# --- 7. write-through on request -------------------------------------------------------------------------


def test_write_through_header_puts_the_object_on_the_backend_before_the_answer(
    fast: Gateway, backend: Any, bucket: str
) -> None:
    s3 = fast.client()
    add_header(s3, "PutObject", WRITE_THROUGH_HEADER, "true")
    add_header(s3, "CreateMultipartUpload", WRITE_THROUGH_HEADER, "true")
    data = os.urandom(256 * KiB)
    put = s3.put_object(Bucket=bucket, Key="wt/obj", Body=data, Metadata={"via": "write-through"})
    assert source(put) is None
    # No flush: the backend has it the moment the gateway answered.
    stored = backend.get_object(Bucket=bucket, Key="wt/obj")
    assert stored["Body"].read() == data
    assert stored["ETag"] == put["ETag"] == md5_etag(data)
    assert stored["Metadata"] == {"via": "write-through"}
    got = s3.get_object(Bucket=bucket, Key="wt/obj")
    assert source(got) is None
    assert got["Body"].read() == data

    mpu = s3.create_multipart_upload(Bucket=bucket, Key="wt/multi")
    assert not mpu["UploadId"].startswith("s3lanes-"), "the spool took a write-through multipart upload"
    part = s3.upload_part(Bucket=bucket, Key="wt/multi", UploadId=mpu["UploadId"], PartNumber=1, Body=b"p")
    assert source(part) is None
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="wt/multi",
        UploadId=mpu["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert backend.get_object(Bucket=bucket, Key="wt/multi")["Body"].read() == b"p"


def test_write_through_put_of_a_key_with_spooled_data_lands_after_it(
    slow: PlainGateway, backend: Any, bucket: str, seaweed: Any
) -> None:
    s3 = slow.gw.client()
    through = slow.gw.client()
    add_header(through, "PutObject", WRITE_THROUGH_HEADER, "true")
    older = os.urandom(1 * MiB)
    newer = os.urandom(10 * KiB)
    assert source(s3.put_object(Bucket=bucket, Key="k", Body=older)) == "spool"
    with watch_key(seaweed, bucket, "k") as watcher:
        put = through.put_object(Bucket=bucket, Key="k", Body=newer)
        assert source(put) is None
        assert backend.get_object(Bucket=bucket, Key="k")["Body"].read() == newer
        slow.gw.flush(bucket)
        time.sleep(0.2)
    assert backend.get_object(Bucket=bucket, Key="k")["Body"].read() == newer
    seen = transitions(watcher.observations)
    assert seen[-1] == md5_etag(newer)
    # The spooled older version was uploaded first (or not at all), never after the newer one.
    assert md5_etag(older) not in seen[seen.index(md5_etag(newer)) :], seen


# --- 8. a full spool: SlowDown or write-through ----------------------------------------------------------

TINY_SPOOL_RATE_BPS = 1_000_000


def tiny_spool_toml(when_full: str) -> str:
    """2 MiB of spool, full above 1 MiB until below 512 KiB, drained at 1 MB/s."""
    return f"""
bandwidth = "{TINY_SPOOL_RATE_BPS}"

[scheduler]
latency_target_ms = 2000
request_cost_bytes = "4KiB"
chunk_bytes = "64KiB"
burst_bytes = "64KiB"

[spool]
capacity = "2MiB"
high_water = 0.5
low_water = 0.25
when_full = "{when_full}"
retry_after_s = 2
"""


@pytest.fixture
def tiny_spool(
    request: pytest.FixtureRequest, seaweed: Any, tmp_path: Path, bucket: str
) -> Iterator[PlainGateway]:
    proc, gw = start_plain_gateway(
        tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url, extra_toml=tiny_spool_toml(request.param)
    )
    try:
        yield PlainGateway(gw, tmp_path)
        gw.flush(bucket)
    finally:
        stop_and_check(proc, gw)


def fill_above_high_water(s3: Any, bucket: str) -> None:
    """One object of 1.25 MiB: admitted into the empty spool, which is then above its 1 MiB high-water mark
    for about 1.3 s of drain at 1 MB/s."""
    assert source(s3.put_object(Bucket=bucket, Key="fill", Body=os.urandom(1280 * KiB))) == "spool"


@pytest.mark.parametrize("tiny_spool", ["slowdown"], indirect=True)
def test_spool_below_its_high_water_mark_is_not_full(tiny_spool: PlainGateway, bucket: str) -> None:
    gw = tiny_spool.gw
    s3 = gw.client()
    # 600 KiB of 2 MiB, high water at 1 MiB: room for more.
    assert source(s3.put_object(Bucket=bucket, Key="a", Body=os.urandom(600 * KiB))) == "spool"
    status = spool_status(gw)
    assert status["used_bytes"] + status["reserved_bytes"] <= 600 * KiB
    assert status["full"] is False, status
    assert source(s3.put_object(Bucket=bucket, Key="b", Body=os.urandom(100 * KiB))) == "spool"


@pytest.mark.parametrize("tiny_spool", ["slowdown"], indirect=True)
def test_full_spool_answers_slowdown_with_retry_after_then_accepts_again_after_the_drain(
    tiny_spool: PlainGateway, backend: Any, bucket: str
) -> None:
    gw = tiny_spool.gw
    s3 = gw.client()
    fill_above_high_water(s3, bucket)
    data = os.urandom(100 * KiB)
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="late", Body=data)
    assert client_error(err.value) == ("SlowDown", 503)
    assert err.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "2"
    assert spool_status(gw)["full"] is True
    assert not object_exists(backend, bucket, "late")

    gw.flush(bucket)
    assert spool_status(gw)["full"] is False
    put = s3.put_object(Bucket=bucket, Key="late", Body=data)
    assert source(put) == "spool"
    assert read(s3, bucket, "late") == data

    # An object larger than the whole spool is not refused: it goes straight to the backend.
    huge = os.urandom(2 * MiB + 1)
    put = s3.put_object(Bucket=bucket, Key="huge", Body=huge)
    assert source(put) is None
    assert backend.get_object(Bucket=bucket, Key="huge")["Body"].read() == huge


@pytest.mark.parametrize("tiny_spool", ["slowdown"], indirect=True)
def test_a_part_copy_the_spool_cannot_hold_answers_slowdown_with_the_configured_retry_after(
    tiny_spool: PlainGateway, backend: Any, bucket: str
) -> None:
    gw = tiny_spool.gw
    s3 = gw.client()
    backend.put_object(Bucket=bucket, Key="copy-src/on-store", Body=os.urandom(1536 * KiB))
    mpu = s3.create_multipart_upload(Bucket=bucket, Key="copy-dst")
    assert mpu["UploadId"].startswith("s3lanes-"), "the upload is not held by the spool"
    gw.drain_paused(True)
    try:
        fill_above_high_water(s3, bucket)  # 1.25 MiB of 2 MiB: neither 1.25 nor 1.5 MiB more fits
        for copy_source in ("fill", "copy-src/on-store"):  # from the spool, from the store
            with pytest.raises(ClientError) as err:
                s3.upload_part_copy(
                    Bucket=bucket,
                    Key="copy-dst",
                    UploadId=mpu["UploadId"],
                    PartNumber=1,
                    CopySource={"Bucket": bucket, "Key": copy_source},
                )
            assert client_error(err.value) == ("SlowDown", 503)
            assert err.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "2", copy_source
    finally:
        gw.drain_paused(False)
    s3.abort_multipart_upload(Bucket=bucket, Key="copy-dst", UploadId=mpu["UploadId"])


@pytest.mark.parametrize("tiny_spool", ["write_through"], indirect=True)
def test_full_spool_in_write_through_mode_sends_the_write_to_the_backend(
    tiny_spool: PlainGateway, backend: Any, bucket: str
) -> None:
    gw = tiny_spool.gw
    s3 = gw.client()
    fill_above_high_water(s3, bucket)
    data = os.urandom(100 * KiB)
    full_before = write_through_count(gw, "full")
    put = s3.put_object(Bucket=bucket, Key="through", Body=data)
    assert source(put) is None
    assert put["ETag"] == md5_etag(data)
    assert write_through_count(gw, "full") == full_before + 1
    # No flush: on the backend the moment the gateway answered, while the fill is still draining.
    assert backend.get_object(Bucket=bucket, Key="through")["Body"].read() == data
    assert not object_exists(backend, bucket, "fill"), "the drain outran the test"
    assert read(s3, bucket, "through") == data

    gw.flush(bucket)
    assert source(s3.put_object(Bucket=bucket, Key="after", Body=b"small")) == "spool"


# --- 9. the flush API ------------------------------------------------------------------------------------


def test_flush_with_nothing_pending_returns_at_once_durable(fast: Gateway, bucket: str) -> None:
    started = time.monotonic()
    status, doc = post_flush(flush_url(fast, bucket, "nothing/here/", 60))
    assert time.monotonic() - started < 2
    assert status == 200
    assert doc["durable"] is True
    assert (doc["pending_objects"], doc["pending_bytes"]) == (0, 0)
    assert doc["bucket"] == bucket and doc["prefix"] == "nothing/here/"


def test_flush_timeout_answers_504_with_what_is_still_pending(slow: PlainGateway, bucket: str) -> None:
    s3 = slow.gw.client()
    size = 2 * MiB
    # Both objects start draining at the same instant, however long the PUTs take: a drain running from the
    # first object's acknowledgement has it on the store within ~0.4 s at 4 MB/s (it has the store to itself
    # until the second is acknowledged), which a slow PUT of the second (a loaded machine) used to let
    # happen before the 0.3 s flush answered. Sharing the rate, each needs ~0.9 s. The pause between the
    # PUTs stands for that slow machine.
    slow.gw.drain_paused(True)
    try:
        s3.put_object(Bucket=bucket, Key="big/one", Body=os.urandom(size))
        time.sleep(0.5)
        s3.put_object(Bucket=bucket, Key="big/two", Body=os.urandom(size))
        s3.put_object(Bucket=bucket, Key="other/small", Body=b"x")
    finally:
        slow.gw.drain_paused(False)
    started = time.monotonic()
    status, doc = post_flush(flush_url(slow.gw, bucket, "big/", 0.3))
    assert time.monotonic() - started < 3
    assert status == 504, doc
    assert doc["durable"] is False
    assert doc["pending_objects"] == 2
    assert 0 < doc["pending_bytes"] <= 2 * size
    assert doc["oldest_pending_age_s"] is not None and doc["oldest_pending_age_s"] >= 0
    # Scoped to its prefix: "other/" is durable long before "big/".
    status, doc = post_flush(flush_url(slow.gw, bucket, "other/", 30))
    assert (status, doc["durable"]) == (200, True)
    status, doc = post_flush(flush_url(slow.gw, bucket, "big/", 60))
    assert (status, doc["durable"], doc["pending_objects"], doc["pending_bytes"]) == (200, True, 0, 0)


def test_flush_accepts_unsigned_loopback_and_sigv4_signed_requests_and_checks_its_arguments(
    fast: Gateway, backend: Any, bucket: str
) -> None:
    s3 = fast.client()
    data = os.urandom(64 * KiB)
    s3.put_object(Bucket=bucket, Key="f/unsigned", Body=data)
    status, doc = post_flush(flush_url(fast, bucket, "f/", 60))
    assert (status, doc["durable"]) == (200, True)
    assert backend.get_object(Bucket=bucket, Key="f/unsigned")["Body"].read() == data

    s3.put_object(Bucket=bucket, Key="f/signed", Body=data)
    url = flush_url(fast, bucket, "f/", 60)
    req = AWSRequest(method="POST", url=url, headers={"x-amz-content-sha256": EMPTY_SHA256})
    botocore.auth.SigV4Auth(Credentials(fast.access_key, fast.secret_key), "s3", "us-east-1").add_auth(req)
    status, doc = post_flush(url, dict(req.headers.items()))
    assert (status, doc["durable"]) == (200, True), doc
    assert backend.get_object(Bucket=bucket, Key="f/signed")["Body"].read() == data

    for bad in (
        f"{fast.http_url}/_s3lanes/flush?prefix=f/",
        f"{fast.http_url}/_s3lanes/flush?bucket={bucket}&timeout=-1",
        f"{fast.http_url}/_s3lanes/flush?bucket={bucket}&timeout=soon",
    ):
        status, doc = post_flush(bad)
        assert status == 400, (bad, doc)
        assert "error" in doc


# --- 10. status and metrics ------------------------------------------------------------------------------


def test_status_and_metrics_show_pending_data_and_return_to_zero_after_flush(
    slow: PlainGateway, bucket: str
) -> None:
    gw = slow.gw
    s3 = gw.client()
    before = scrape(gw)
    sizes = (1 * MiB, 1 * MiB + 7, 300 * KiB)
    for n, size in enumerate(sizes):
        s3.put_object(Bucket=bucket, Key=f"st/obj-{n}", Body=os.urandom(size))
    first = spool_status(gw)
    time.sleep(0.3)
    second = spool_status(gw)
    samples = scrape(gw)

    assert first["pending_objects"] == len(sizes)
    assert 0 < first["pending_bytes"] <= sum(sizes)
    assert first["pending_bytes"] == sum(sizes), "a drain finished within milliseconds"
    assert second["oldest_pending_age_s"] > first["oldest_pending_age_s"] >= 0
    assert second["oldest_pending_age_s"] >= 0.25
    assert {"bucket": bucket, "prefix": "st/", "bytes": second["pending_bytes"]} in second[
        "pending_by_prefix"
    ]
    assert samples["s3lanes_spool_pending_bytes"] > 0
    assert samples["s3lanes_spool_pending_objects"] > 0
    assert samples["s3lanes_spool_oldest_pending_age_seconds"] >= 0.25

    gw.flush(bucket)
    after = spool_status(gw)
    assert (after["pending_objects"], after["pending_bytes"], after["oldest_pending_age_s"]) == (0, 0, None)
    assert after["pending_by_prefix"] == []
    samples = scrape(gw)
    assert samples["s3lanes_spool_pending_bytes"] == 0
    assert samples["s3lanes_spool_pending_objects"] == 0
    assert samples["s3lanes_spool_oldest_pending_age_seconds"] == 0
    assert drained_bytes_metric(samples) - drained_bytes_metric(before) == sum(sizes)


# --- 11. spool file names never come from keys -----------------------------------------------------------

# S3 keys are at most 1024 bytes of UTF-8; SeaweedFS also limits one path segment to 255 bytes.
_UNICODE_SEGMENT = "\u00e9\u6f22\U0001f642" * 28  # 252 bytes
HOSTILE_KEYS = (
    "keys/%00literal/x%00y%2F..%2Fz%2e%2e",
    "keys/..hidden/..x../..",
    "keys/dots..in..name",
    "keys/u/" + "/".join([_UNICODE_SEGMENT] * 4),
    "keys/ctl/\x01\x02\x1f\ttab",
    "keys/ctl/\x7f del",
    "keys/cr/carriage\rreturn",
    "keys/xml/<a href=\"x\">&amp;</a> 'q'",
    "keys/dots/../escape",
    "../../etc/x",
    "keys/a/./b",
    "keys/trailing/..",
    "keys/a//b",
    "/leading-slash",
    "keys/back\\..\\x",
)


def keys_the_backend_keeps(backend: Any, bucket: str, keys: tuple[str, ...]) -> list[str]:
    """The keys SeaweedFS stores as themselves: it refuses ``.``/``..`` segments and folds ``//`` and a
    leading ``/`` (a listing with the key as prefix hides the folding, so the whole bucket is listed). The
    bucket is left empty."""
    stored = []
    for key in keys:
        try:
            backend.put_object(Bucket=bucket, Key=key, Body=b"probe")
        except ClientError as exc:
            assert client_error(exc)[1] == 400, exc
            continue
        stored.append(key)
    listed = set(all_keys(backend, bucket))
    for key in listed:
        backend.delete_object(Bucket=bucket, Key=key)
    return [k for k in stored if k in listed]


def body_for(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest() * 100 + key.encode()


def assert_only_spool_files_appeared(root: Path, before: set[Path], data_dir: Path) -> None:
    new = files_under(root) - before
    outside = [p for p in new if p.parent != data_dir]
    assert not outside, f"files outside the spool's data directory: {outside}"
    names = [p.name for p in new]
    assert all(HEX_FILE_NAME.fullmatch(n) for n in names), names
    assert all(HEX_FILE_NAME.fullmatch(n) for n in spool_data_names(data_dir))


def delete_one_by_one(gw: Gateway, backend: Any, bucket: str, keys: list[str]) -> None:
    """Drain, then delete ``keys`` on the backend one request each: the bucket's teardown deletes in
    DeleteObjects XML, which cannot carry control characters."""
    gw.flush(bucket)
    for key in keys:
        backend.delete_object(Bucket=bucket, Key=key)


def test_hostile_keys_round_trip_byte_exact_and_spool_files_have_random_names(
    slow: PlainGateway, backend: Any, bucket: str
) -> None:
    accepted = keys_the_backend_keeps(backend, bucket, HOSTILE_KEYS)
    assert len(accepted) >= 6, accepted  # %00, dots inside names, 1 KiB of unicode, control characters...
    try:
        s3 = slow.gw.client()
        slow.gw.drain_paused(True)  # whatever the machine's load, the keys stay in the spool meanwhile
        before = files_under(slow.tmp)
        for key in accepted:
            put = s3.put_object(Bucket=bucket, Key=key, Body=body_for(key))
            assert source(put) == "spool", key
        assert_only_spool_files_appeared(slow.tmp, before, slow.spool_data)
        assert len(files_under(slow.tmp) - before) == len(accepted)
        for key in accepted:
            got = s3.get_object(Bucket=bucket, Key=key)
            assert (source(got), got["Body"].read()) == ("spool", body_for(key)), key
        assert listed_v2(s3, bucket, 3, Prefix="keys/") == (utf8_sorted(set(accepted)), [])
        assert all_keys(backend, bucket, "keys/") == [], "the drain ran while paused"

        slow.gw.drain_paused(False)
        slow.gw.flush(bucket)
        for key in accepted:
            assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == body_for(key), key
        assert set(all_keys(backend, bucket, "keys/")) == set(accepted)
        # In one page: SeaweedFS's own pagination skips the DEL character key (the gateway merges only
        # while it has spooled keys; afterwards it passes the listing through).
        assert listed_v2(s3, bucket, None, Prefix="keys/") == (utf8_sorted(set(accepted)), [])
    finally:
        slow.gw.drain_paused(False)  # the gateway is the module's: leave its drain running
        delete_one_by_one(slow.gw, backend, bucket, accepted)


def test_key_with_a_newline_round_trips_through_the_spool(fast: Gateway, backend: Any, bucket: str) -> None:
    # S3 allows any UTF-8 in a key, line feeds included (SeaweedFS stores them too).
    key = "keys/nl/line one\nline two"
    s3 = fast.client()
    try:
        put = s3.put_object(Bucket=bucket, Key=key, Body=body_for(key))
        assert put["ETag"] == md5_etag(body_for(key))
        assert read(s3, bucket, key) == body_for(key)
        fast.flush(bucket)
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == body_for(key)
    finally:
        delete_one_by_one(fast, backend, bucket, [key])


def test_keys_with_dot_or_empty_segments_are_answered_by_the_backend_not_the_spool(
    seaweed: Any, backend: Any, bucket: str, tmp_path: Path
) -> None:
    """Stores disagree on "."/".." and empty path segments (SeaweedFS refuses or folds them), so the spool
    never acknowledges such a key it might not be able to drain: the backend answers the write itself."""
    kept = keys_the_backend_keeps(backend, bucket, HOSTILE_KEYS)
    refused = [k for k in HOSTILE_KEYS if k not in kept]
    assert "../../etc/x" in refused and "keys/dots/../escape" in refused, refused
    etc_x_existed = Path("/etc/x").exists()

    proc, gw = start_plain_gateway(tmp_path, seaweed, backend_endpoint=seaweed.endpoint_url)
    try:
        data_dir = tmp_path / "state" / "spool" / "data"
        before = files_under(tmp_path)
        s3 = gw.client()
        for key in refused:
            try:
                put = s3.put_object(Bucket=bucket, Key=key, Body=body_for(key))
            except ClientError as exc:
                assert 400 <= client_error(exc)[1] < 500, (key, exc)  # the backend's own refusal
                continue
            assert source(put) != "spool", key
            assert read(s3, bucket, key) == body_for(key), key
        assert_only_spool_files_appeared(tmp_path, before, data_dir)
        assert not any(data_dir.iterdir())
        assert Path("/etc/x").exists() == etc_x_existed
        assert spool_status(gw)["pending_objects"] == 0
    finally:
        stop_and_check(proc, gw)
