"""Flexible checksums, and what goes over the wire (chunked bodies without Content-Length, Content-Encoding
values, request ids in error bodies), answer through the gateway as the store answers, spooled or not.

Every scenario runs twice: once straight against SeaweedFS (the reference) and once through a gateway, and
the observations (status, error code, the x-amz-checksum-* the answers carry, ETags) must be equal. The
gateway targets: the spool off (``off``); the spool on with the drain held back (``held``: the gateway's
backend is a relay that is paused after the bucket check, so every write stays in the spool and every read
is answered from it); and the same objects once the drain has run (``flushed``: read through the gateway,
which now proxies them, and straight from the store, which must hold the checksums the spool acknowledged).

Where SeaweedFS differs from AWS, the store is followed and the difference is written in the test's
docstring (and docs/compatibility.md), except for a malformed checksum value, where the gateway follows AWS.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import zlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import pytest
from awscrt import checksums as crt_checksums
from botocore.exceptions import ClientError

from s3lanes.core.checksums import crc_combine
from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.relay import CountingRelay
from tests.e2e.s3raw import (
    UNSIGNED_PAYLOAD,
    crc32_b64,
    error_fields,
    key_path,
    send,
    sign,
    signed_request,
    te_chunked,
)

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
PART_1 = os.urandom(5 * MiB)
PART_2 = os.urandom(1000)
SMALL = os.urandom(3000)
# Fields that differ between any two answers whatever their source.
_VOLATILE = (
    "LastModified",
    "Location",
    "UploadId",
    "Bucket",
    "Key",
    "ResponseMetadata",
    "Body",
    "Expiration",
    # The default type of an object stored without one is not what these tests are about (SeaweedFS
    # answers application/octet-stream, the spool S3's binary/octet-stream).
    "ContentType",
)


def _raw(data: bytes, algorithm: str) -> bytes:
    if algorithm == "CRC32":
        return zlib.crc32(data).to_bytes(4, "big")
    if algorithm == "CRC32C":
        return int(crt_checksums.crc32c(data)).to_bytes(4, "big")
    if algorithm == "CRC64NVME":
        return int(crt_checksums.crc64nvme(data)).to_bytes(8, "big")
    return hashlib.new(algorithm.lower(), data).digest()


def b64(data: bytes, algorithm: str) -> str:
    return base64.b64encode(_raw(data, algorithm)).decode()


def composite(parts: list[bytes], algorithm: str) -> str:
    return base64.b64encode(_raw(b"".join(_raw(p, algorithm) for p in parts), algorithm)).decode() + (
        f"-{len(parts)}"
    )


# --- targets ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relayed(
    seaweed: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, CountingRelay]]:
    """A spooling gateway whose backend is reached through a relay that a test can pause (drain held back)."""
    parts = urlsplit(seaweed.endpoint_url)
    relay = CountingRelay(parts.hostname or "127.0.0.1", parts.port or 80)
    relay.start()
    tmp = tmp_path_factory.mktemp("checksum-gateway")
    proc, gw = start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=f"http://127.0.0.1:{relay.port}",
        # A drain request the paused relay cut off is in doubt until the store's read timeout: 10 s, not the
        # default 60, so the held tests wait for it that long at most.
        extra_toml="read_timeout_s = 10\n\n[spool]\nretry_base_s = 0.05\nretry_max_s = 0.3",
    )
    try:
        yield gw, relay
    finally:
        code = stop_gateway(proc)
        relay.stop()
        assert code == 0, gw.log_path.read_text(errors="replace")[-4000:]
        assert "Traceback" not in gw.log_path.read_text(errors="replace")


@contextlib.contextmanager
def drain_held(gw: Gateway, relay: CountingRelay, bucket: str) -> Iterator[Any]:
    """The gateway's client while its store is out of reach (after one spooled write has checked the
    bucket): writes stay in the spool, reads are served from it. Afterwards the store is back and the spool
    is flushed."""
    s3 = gw.client()
    s3.put_object(Bucket=bucket, Key="zz-warm", Body=b"w")
    # On the store before the relay pauses: a drain cut off mid-request would be in doubt and hold its key
    # (and the flush at the end) for the backend's read timeout.
    gw.flush(bucket, "zz-warm")
    relay.pause()
    try:
        yield s3
    finally:
        relay.resume()
        gw.flush(bucket)


def observe(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What a call answered, without what always differs: the fields, the error code, or the status."""
    try:
        resp = fn()
    except ClientError as exc:
        return {
            "error": exc.response["Error"].get("Code"),
            "status": exc.response["ResponseMetadata"]["HTTPStatusCode"],
        }
    headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    out = {k: v for k, v in resp.items() if k not in _VOLATILE}
    out["checksum_headers"] = {k: v for k, v in headers.items() if k.startswith("x-amz-checksum-")}
    if "Body" in resp:
        resp["Body"].read()
    return out


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{path}/{k}"))
        return out
    return {path: value}


def assert_same(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    """Equal observations; else the paths that differ, each with (gateway's, store's)."""
    got, want = _flat(actual), _flat(expected)
    diff = {p: (got.get(p, "<absent>"), want.get(p, "<absent>")) for p in sorted(got.keys() | want.keys())}
    assert {p: d for p, d in diff.items() if d[0] != d[1]} == {}


def reads(s3: Any, bucket: str, key: str) -> dict[str, Any]:
    """Every way of reading an object's checksums back."""
    return {
        "head-mode": observe(lambda: s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")),
        "head": observe(lambda: s3.head_object(Bucket=bucket, Key=key)),
        "get-mode": observe(lambda: s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")),
        "get-range-mode": observe(
            lambda: s3.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED", Range="bytes=0-9")
        ),
    }


def run_targets(
    gateway: Gateway,
    relayed: tuple[Gateway, CountingRelay],
    backend: Any,
    bucket: str,
    target: str,
    writes: Callable[[Any, str], dict[str, Any]],
    keys: list[str],
) -> None:
    """``writes(client, prefix)`` on the store and on ``target``; then the reads of ``keys`` (under the
    prefix); every observation must equal the store's."""
    expected = writes(backend, "store/")
    expected_reads = {k: reads(backend, bucket, "store/" + k) for k in keys}
    if target == "off":
        s3 = gateway.client()
        assert_same(writes(s3, "off/"), expected)
        assert_same({k: reads(s3, bucket, "off/" + k) for k in keys}, expected_reads)
        return
    gw, relay = relayed
    with drain_held(gw, relay, bucket) as s3:
        assert_same(writes(s3, "held/"), expected)
        held_reads = {k: reads(s3, bucket, "held/" + k) for k in keys}
        for k in keys:
            # Answered by the spool itself (the store is out of reach), not by a proxied request.
            assert s3.head_object(Bucket=bucket, Key="held/" + k)["ResponseMetadata"]["HTTPHeaders"].get(
                "x-s3lanes-source"
            ) == "spool" or held_reads[k]["head"].get("error")
        assert_same(held_reads, expected_reads)
    # Drained: through the gateway (proxied now), and on the store itself.
    assert_same({k: reads(s3, bucket, "held/" + k) for k in keys}, expected_reads)
    assert_same({k: reads(backend, bucket, "held/" + k) for k in keys}, expected_reads)


TARGETS = pytest.mark.parametrize("target", ["off", "held"])


# --- single PUT ------------------------------------------------------------------------------------------


@TARGETS
def test_put_checksums_are_kept_and_answered_like_the_store(
    gateway: Gateway, relayed: Any, backend: Any, bucket: str, target: str
) -> None:
    """PutObject with each algorithm: the PUT answers its checksum; HEAD/GET show it with
    x-amz-checksum-mode ENABLED only, never on a range GET. (SeaweedFS shows no x-amz-checksum-type for a
    single PUT, where AWS answers FULL_OBJECT: the store is followed.)"""

    def writes(s3: Any, prefix: str) -> dict[str, Any]:
        return {
            alg: observe(
                partial(s3.put_object, Bucket=bucket, Key=f"{prefix}{alg}", Body=SMALL, ChecksumAlgorithm=alg)
            )
            for alg in ALGORITHMS
        }

    run_targets(gateway, relayed, backend, bucket, target, writes, list(ALGORITHMS))


@TARGETS
def test_a_copy_keeps_the_checksum_like_the_store(
    gateway: Gateway, relayed: Any, backend: Any, bucket: str, target: str
) -> None:
    """CopyObject keeps the source's checksum, with the COPY and the REPLACE metadata directive alike (as
    SeaweedFS does)."""

    def writes(s3: Any, prefix: str) -> dict[str, Any]:
        s3.put_object(Bucket=bucket, Key=f"{prefix}src", Body=SMALL, ChecksumAlgorithm="SHA256")
        source = {"Bucket": bucket, "Key": f"{prefix}src"}
        s3.copy_object(Bucket=bucket, Key=f"{prefix}copy", CopySource=source)
        s3.copy_object(
            Bucket=bucket,
            Key=f"{prefix}replaced",
            CopySource=source,
            MetadataDirective="REPLACE",
            ContentType="x/y",
        )
        return {}

    run_targets(gateway, relayed, backend, bucket, target, writes, ["copy", "replaced"])


# --- multipart -------------------------------------------------------------------------------------------

# (algorithm, x-amz-checksum-type on CreateMultipartUpload or None, the object checksum Complete names)
_MULTIPART = (
    ("CRC32", None, "composite"),
    ("SHA256", None, "composite"),
    ("SHA1", "COMPOSITE", None),
    ("CRC32", "FULL_OBJECT", "full"),
    ("CRC32C", "FULL_OBJECT", None),
    ("CRC64NVME", None, "full"),
)


def _multipart(
    s3: Any, bucket: str, key: str, alg: str, kind: str | None, named: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    extra = {"ChecksumType": kind} if kind else {}
    created = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm=alg, **extra)
    out["create"] = {k: v for k, v in created.items() if k.startswith("Checksum")}
    upload_id = created["UploadId"]
    parts = []
    for number, data in ((1, PART_1), (2, PART_2)):
        resp = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data, ChecksumAlgorithm=alg
        )
        out[f"part{number}"] = observe(resp.copy)
        parts.append({"PartNumber": number, "ETag": resp["ETag"], f"Checksum{alg}": resp[f"Checksum{alg}"]})
    whole: dict[str, str] = {}
    if named == "composite":
        whole[f"Checksum{alg}"] = composite([PART_1, PART_2], alg)
    elif named == "full":
        whole[f"Checksum{alg}"] = b64(PART_1 + PART_2, alg)
    if kind:
        whole["ChecksumType"] = kind
    out["complete"] = observe(
        lambda: s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **whole
        )
    )
    return out


@TARGETS
def test_multipart_checksums_composite_and_full_object_like_the_store(
    gateway: Gateway, relayed: Any, backend: Any, bucket: str, target: str
) -> None:
    """CreateMultipartUpload answers its algorithm and type; each part answers its checksum; Complete
    answers the composite (``<base64>-<parts>``) or full-object checksum, and takes a whole-object
    x-amz-checksum-* header as the object's checksum (not the XML document's); HEAD/GET show it."""

    def writes(s3: Any, prefix: str) -> dict[str, Any]:
        return {
            f"{alg}-{kind}-{named}": _multipart(s3, bucket, f"{prefix}{alg}-{kind}-{named}", alg, kind, named)
            for alg, kind, named in _MULTIPART
        }

    run_targets(gateway, relayed, backend, bucket, target, writes, [f"{a}-{k}-{n}" for a, k, n in _MULTIPART])


def test_full_object_crc_of_the_parts_is_the_crc_of_the_object() -> None:
    """The check the tests above rely on: the combination of part CRCs is the CRC of the whole object."""
    for alg in ("CRC32", "CRC32C", "CRC64NVME"):
        crc1 = int.from_bytes(_raw(PART_1, alg), "big")
        crc2 = int.from_bytes(_raw(PART_2, alg), "big")
        assert crc_combine(alg, crc1, crc2, len(PART_2)) == int.from_bytes(_raw(PART_1 + PART_2, alg), "big")


@TARGETS
def test_complete_checksum_errors_like_the_store(
    gateway: Gateway, relayed: Any, backend: Any, bucket: str, target: str
) -> None:
    """Refusals of a checksummed multipart upload: a wrong whole-object checksum (composite or full),
    a part named without its checksum, a wrong part checksum, a part sent with another algorithm, an
    unknown algorithm or type, FULL_OBJECT with SHA256, COMPOSITE with CRC64NVME. SeaweedFS answers
    BadDigest for a part checksum that does not match (AWS documents InvalidPart)."""

    def writes(s3: Any, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, kind, part_value, whole in (
            ("wrong-composite", None, None, "AAAAAA==-2"),
            ("full-for-composite", None, None, b64(PART_1 + PART_2, "CRC32")),
            ("wrong-full", "FULL_OBJECT", None, "AAAAAA=="),
            ("composite-for-full", "FULL_OBJECT", None, composite([PART_1, PART_2], "CRC32")),
            ("part-without-checksum", None, "", None),
            ("wrong-part-checksum", None, "AAAAAA==", None),
        ):
            key = f"{prefix}{label}"
            extra = {"ChecksumType": kind} if kind else {}
            upload_id = s3.create_multipart_upload(
                Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32", **extra
            )["UploadId"]
            parts = []
            for number, data in ((1, PART_1), (2, PART_2)):
                resp = s3.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=data,
                    ChecksumAlgorithm="CRC32",
                )
                part = {"PartNumber": number, "ETag": resp["ETag"], "ChecksumCRC32": resp["ChecksumCRC32"]}
                if number == 1 and part_value is not None:
                    if part_value:
                        part["ChecksumCRC32"] = part_value
                    else:
                        del part["ChecksumCRC32"]
                parts.append(part)
            named: dict[str, str] = {"ChecksumCRC32": whole} if whole else {}
            if kind:
                named["ChecksumType"] = kind
            out[label] = observe(
                partial(
                    s3.complete_multipart_upload,
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **named,
                )
            )
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        key = f"{prefix}other-algorithm"
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")["UploadId"]
        out["part-other-algorithm"] = observe(
            lambda: s3.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=1,
                Body=PART_2,
                ChecksumAlgorithm="SHA256",
            )
        )
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        for label, alg, kind in (
            ("full-object-sha256", "SHA256", "FULL_OBJECT"),
            ("composite-crc64nvme", "CRC64NVME", "COMPOSITE"),
        ):
            out[label] = observe(
                partial(
                    s3.create_multipart_upload,
                    Bucket=bucket,
                    Key=f"{prefix}{label}",
                    ChecksumAlgorithm=alg,
                    ChecksumType=kind,
                )
            )
        return out

    run_targets(gateway, relayed, backend, bucket, target, writes, [])


def test_a_malformed_checksum_value_is_invalid_request_as_aws_answers(
    gateway: Gateway, spool_gateway: Gateway, seaweed: Any, bucket: str
) -> None:
    """A checksum value that is not the base64 of a digest of the algorithm's length: AWS answers 400
    InvalidRequest ("Value for x-amz-checksum-crc32 header is invalid."), SeaweedFS 400 BadDigest. The
    gateway follows AWS, spool on and off (a documented exception; docs/compatibility.md)."""
    for value in ("bad!", "AAAA", "AAAAAAAA"):
        store = signed_request(
            seaweed.endpoint_url,
            "PUT",
            key_path(bucket, "malformed"),
            access_key=seaweed.admin.access_key,
            secret_key=seaweed.admin.secret_key,
            body=b"hello",
            headers={"x-amz-checksum-crc32": value},
            payload_hash=UNSIGNED_PAYLOAD,
        )
        assert (store.status, error_fields(store.body)["Code"]) == (400, "BadDigest")
        for gw in (gateway, spool_gateway):
            resp = signed_request(
                gw.http_url,
                "PUT",
                key_path(bucket, "malformed"),
                access_key=gw.access_key,
                secret_key=gw.secret_key,
                body=b"hello",
                headers={"x-amz-checksum-crc32": value},
                payload_hash=UNSIGNED_PAYLOAD,
            )
            assert (resp.status, error_fields(resp.body)["Code"]) == (400, "InvalidRequest")
    client = s3_client(seaweed)
    try:
        assert "Contents" not in client.list_objects_v2(Bucket=bucket)
    finally:
        client.close()


# --- on the wire -----------------------------------------------------------------------------------------


def chunked_put(
    url: str, access_key: str, secret_key: str, bucket: str, key: str, data: bytes, **headers: str
) -> Any:
    """PUT with Transfer-Encoding: chunked and no Content-Length (no aws-chunked framing)."""
    target = key_path(bucket, key)
    hdrs = {"Transfer-Encoding": "chunked", **{k.replace("_", "-"): v for k, v in headers.items()}}
    signed = sign(
        "PUT", url, target, hdrs, access_key=access_key, secret_key=secret_key, payload_hash=UNSIGNED_PAYLOAD
    )
    return send(url, "PUT", target, signed, te_chunked(data, 64 * 1024))


@TARGETS
def test_chunked_put_without_content_length_is_accepted_like_the_store(
    gateway: Gateway, relayed: Any, seaweed: Any, backend: Any, bucket: str, target: str
) -> None:
    """Transfer-Encoding: chunked without Content-Length (AWS answers 411 MissingContentLength; SeaweedFS
    accepts it, and so does the gateway: proxied with chunked transfer coding, or spooled, its room in the
    spool reserved as it arrives). A wrong checksum still stores nothing."""
    data = os.urandom(9 * MiB + 123)  # more than one step of spool room
    admin = seaweed.admin
    store = chunked_put(seaweed.endpoint_url, admin.access_key, admin.secret_key, bucket, "store/c", data)
    store_bad = chunked_put(
        seaweed.endpoint_url,
        admin.access_key,
        admin.secret_key,
        bucket,
        "store/bad",
        data,
        **{"x-amz-checksum-crc32": crc32_b64(b"other")},
    )
    assert store.status == 200 and (store_bad.status, store_bad.error_code) == (400, "BadDigest")

    def check(gw: Gateway, prefix: str) -> None:
        good = chunked_put(gw.http_url, gw.access_key, gw.secret_key, bucket, f"{prefix}c", data)
        assert (good.status, good.header("ETag")) == (store.status, store.header("ETag"))
        bad = chunked_put(
            gw.http_url,
            gw.access_key,
            gw.secret_key,
            bucket,
            f"{prefix}bad",
            data,
            **{"x-amz-checksum-crc32": crc32_b64(b"other")},
        )
        assert (bad.status, bad.error_code) == (400, "BadDigest")
        s3 = gw.client()
        got = s3.get_object(Bucket=bucket, Key=f"{prefix}c")
        assert got["Body"].read() == data
        if prefix == "held/":
            assert got["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source") == "spool"

    if target == "off":
        check(gateway, "off/")
        keys = ["off/c"]
    else:
        gw, relay = relayed
        with drain_held(gw, relay, bucket):
            check(gw, "held/")
        keys = ["held/c"]
    for key in keys:
        assert backend.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    listed = {o["Key"] for o in backend.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert not any(k.endswith("bad") for k in listed)


@TARGETS
def test_chunked_upload_part_without_content_length_is_accepted_like_the_store(
    gateway: Gateway, relayed: Any, seaweed: Any, backend: Any, bucket: str, target: str
) -> None:
    """UploadPart with Transfer-Encoding: chunked and no Content-Length, in an upload with a checksum
    algorithm: the part's ETag and checksum, and the completed object, are the store's."""

    def upload(url: str, access_key: str, secret_key: str, s3: Any, key: str) -> dict[str, Any]:
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")["UploadId"]
        q = f"?partNumber=1&uploadId={upload_id}"
        target_path = key_path(bucket, key) + q
        hdrs = sign(
            "PUT",
            url,
            target_path,
            {"Transfer-Encoding": "chunked"},
            access_key=access_key,
            secret_key=secret_key,
            payload_hash=UNSIGNED_PAYLOAD,
        )
        part1 = send(url, "PUT", target_path, hdrs, te_chunked(PART_1, 64 * 1024))
        part2 = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=2, Body=PART_2, ChecksumAlgorithm="CRC32"
        )
        parts = [
            {
                "PartNumber": 1,
                "ETag": part1.header("ETag"),
                "ChecksumCRC32": part1.header("x-amz-checksum-crc32"),
            },
            {"PartNumber": 2, "ETag": part2["ETag"], "ChecksumCRC32": part2["ChecksumCRC32"]},
        ]
        done = observe(
            lambda: s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        )
        return {
            "part1": (part1.status, part1.header("ETag"), part1.header("x-amz-checksum-crc32")),
            "done": done,
        }

    admin = seaweed.admin
    expected = upload(seaweed.endpoint_url, admin.access_key, admin.secret_key, backend, "store/mp")
    assert expected["part1"][0] == 200
    if target == "off":
        assert_same(
            upload(gateway.http_url, gateway.access_key, gateway.secret_key, gateway.client(), "off/mp"),
            expected,
        )
        return
    gw, relay = relayed
    with drain_held(gw, relay, bucket) as s3:
        assert_same(upload(gw.http_url, gw.access_key, gw.secret_key, s3, "held/mp"), expected)
    assert backend.get_object(Bucket=bucket, Key="held/mp")["Body"].read() == PART_1 + PART_2


def test_other_operations_without_content_length_still_answer_411(gateway: Gateway, bucket: str) -> None:
    target = key_path(bucket) + "?delete="
    hdrs = sign(
        "POST",
        gateway.http_url,
        target,
        {"Transfer-Encoding": "chunked"},
        access_key=gateway.access_key,
        secret_key=gateway.secret_key,
        payload_hash=UNSIGNED_PAYLOAD,
    )
    resp = send(gateway.http_url, "POST", target, hdrs, te_chunked(b"<Delete/>"))
    assert (resp.status, resp.error_code) == (411, "MissingContentLength")


@TARGETS
def test_content_encoding_is_kept_byte_exact(
    gateway: Gateway, relayed: Any, backend: Any, bucket: str, target: str
) -> None:
    """``deflate, gzip`` comes back as sent (not ``deflate,gzip``), spooled, proxied and after the drain."""
    value = "deflate, gzip"
    backend.put_object(Bucket=bucket, Key="store/e", Body=b"x", ContentEncoding=value)
    expected = backend.head_object(Bucket=bucket, Key="store/e")["ContentEncoding"]
    assert expected == value
    if target == "off":
        s3 = gateway.client()
        s3.put_object(Bucket=bucket, Key="off/e", Body=b"x", ContentEncoding=value)
        assert s3.head_object(Bucket=bucket, Key="off/e")["ContentEncoding"] == expected
        return
    gw, relay = relayed
    with drain_held(gw, relay, bucket) as s3:
        s3.put_object(Bucket=bucket, Key="held/e", Body=b"x", ContentEncoding=value)
        assert s3.head_object(Bucket=bucket, Key="held/e")["ContentEncoding"] == expected
    assert s3.head_object(Bucket=bucket, Key="held/e")["ContentEncoding"] == expected
    assert backend.head_object(Bucket=bucket, Key="held/e")["ContentEncoding"] == expected


def test_request_id_in_a_relayed_error_body_is_the_one_in_the_header(
    gateway: Gateway, spool_gateway: Gateway, bucket: str
) -> None:
    """The store's error documents, relayed, carry the gateway's request id (also in x-amz-request-id and
    its logs); the store's own stays in x-s3lanes-backend-request-id. Spool on and off."""
    for gw in (gateway, spool_gateway):
        for target in (
            key_path(bucket, "missing"),
            key_path(bucket, "missing") + "?tagging=",
            key_path("no-such-bucket-x1") + "?list-type=2",
        ):
            hdrs = sign(
                "GET",
                gw.http_url,
                target,
                {},
                access_key=gw.access_key,
                secret_key=gw.secret_key,
                payload_hash=UNSIGNED_PAYLOAD,
            )
            resp = send(gw.http_url, "GET", target, hdrs)
            assert resp.status in (404, 400), resp.body
            fields = error_fields(resp.body)
            assert fields["RequestId"] == resp.header("x-amz-request-id"), (target, fields)
            assert resp.header("x-s3lanes-backend-request-id") not in (None, fields["RequestId"])
            assert int(resp.header("Content-Length") or -1) == len(resp.body)


def test_anonymous_reads_are_passed_to_the_store_unsigned_when_enabled(
    seaweed: Any, backend: Any, bucket: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With ``[server] anonymous_reads``, an unsigned GET/HEAD/listing goes to the store unsigned and the
    store decides: refused before the bucket has a public-read policy, answered (as by the store) after,
    also for an object still in the spool (drained first). Anonymous writes stay refused."""
    tmp = tmp_path_factory.mktemp("anonymous-gateway")
    proc, gw = start_plain_gateway(
        tmp, seaweed, backend_endpoint=seaweed.endpoint_url, server_toml="anonymous_reads = true"
    )
    try:
        s3 = gw.client()
        put = s3.put_object(Bucket=bucket, Key="pub/obj", Body=b"public bytes")
        assert put["ResponseMetadata"]["HTTPHeaders"].get("x-s3lanes-source") == "spool"

        def anonymous(url: str, method: str, target: str) -> Any:
            return send(url, method, target, {"Host": urlsplit(url).netloc})

        obj = key_path(bucket, "pub/obj")
        for url in (seaweed.endpoint_url, gw.http_url):
            assert anonymous(url, "GET", obj).status == 403
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": "*",
                    "Action": ["s3:GetObject", "s3:ListBucket"],
                    "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                }
            ],
        }
        backend.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
        s3.put_object(Bucket=bucket, Key="pub/later", Body=b"spooled, then drained")
        # Through the gateway first: it answers a read of a spooled object only once its forced drain put
        # the object on the store, so the store's own answer, read after it, is the one to compare with (read
        # before, it raced that drain). The listing comes last, once both objects are drained.
        for target in (obj, key_path(bucket, "pub/later"), key_path(bucket) + "?list-type=2&prefix=pub/"):
            through = anonymous(gw.http_url, "GET", target)
            store = anonymous(seaweed.endpoint_url, "GET", target)
            assert (through.status, through.body) == (store.status, store.body)
            assert through.status == 200
        head = anonymous(gw.http_url, "HEAD", obj)
        assert head.status == 200 and head.header("ETag") == put["ETag"]
        refused = send(
            gw.http_url, "PUT", obj, {"Host": urlsplit(gw.http_url).netloc, "Content-Length": "1"}, b"x"
        )
        assert (refused.status, refused.error_code) == (403, "AccessDenied")
        assert backend.get_object(Bucket=bucket, Key="pub/obj")["Body"].read() == b"public bytes"
    finally:
        backend.delete_bucket_policy(Bucket=bucket)
        gw.flush(bucket)
        code = stop_gateway(proc)
        assert code == 0 and "Traceback" not in gw.log_path.read_text(errors="replace")
