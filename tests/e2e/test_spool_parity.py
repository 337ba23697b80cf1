"""S3 parity of spooled objects: the gateway with its spool on answers as the store does.

Each test makes the same calls through a spooling gateway (whose drain is held back for the keys under
``held/``) and straight to SeaweedFS, and compares status, error code and the fields S3 documents. The
gateway here is ``held_gateway``: its backend is a :class:`FaultyBackend` in front of SeaweedFS that answers
every drain PUT of a key under ``held/`` (an object, or a part of a multipart upload) with 503 SlowDown, so
those entries stay in the spool (the drain retries them with a short backoff) until the test releases them
with :meth:`Held.release`. Reads, listings, deletes and everything else pass through unchanged.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.handlers
import pytest
from botocore.exceptions import ClientError

from tests.conftest import s3_client
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_and_check
from tests.e2e.faulty_backend import FaultyBackend
from tests.e2e.test_spool import write_through_count

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
SOURCE_HEADER = "x-s3lanes-source"
HELD = "held/"

# A drain request cut after its last byte (its entry superseded meanwhile) is in doubt and holds its key for
# read_timeout_s: short here, so that the flush after each test does not wait for the default.
HELD_TOML = """
read_timeout_s = 5

[spool]
retry_base_s = 0.05
retry_max_s = 0.3
"""


def _held_write(method: str, raw_path: str) -> bool:
    # PUTs only (objects and parts): a refused CreateMultipartUpload would leave a drain intent that a
    # flush counts until the janitor resolves it.
    path = raw_path.partition("?")[0]
    return method == "PUT" and f"/{HELD}" in path


@dataclass
class Held:
    gw: Gateway
    proxy: FaultyBackend

    def hold(self) -> None:
        self.proxy.errors("slowdown", 1.0, match=_held_write)

    def release(self) -> None:
        self.proxy.pass_through()


@pytest.fixture(scope="module")
def held_gateway(seaweed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Held]:
    tmp: Path = tmp_path_factory.mktemp("held-spool-gateway")
    proxy = FaultyBackend(seaweed.endpoint_url, seed=23)
    proxy.start()
    proc, gw = start_plain_gateway(tmp, seaweed, backend_endpoint=proxy.url, extra_toml=HELD_TOML)
    try:
        yield Held(gw, proxy)
    finally:
        proxy.pass_through()
        stop_and_check(proc, gw)
        proxy.stop()


@pytest.fixture
def held(held_gateway: Held, bucket: str) -> Iterator[Held]:
    """The held gateway, drain held for ``held/`` keys; released and the bucket drained afterwards."""
    held_gateway.hold()
    try:
        yield held_gateway
    finally:
        held_gateway.release()
        held_gateway.gw.flush(bucket)


@pytest.fixture
def store_bucket(seaweed: Any) -> Iterator[str]:
    """A second fresh bucket, used straight on the store as the reference."""
    client = s3_client(seaweed)
    name = f"ref-{os.urandom(6).hex()}"
    client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        _empty_and_delete(client, name)
        client.close()


def _empty_and_delete(client: Any, bucket: str) -> None:
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            for up in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=obj["Key"])
        client.delete_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "NoSuchBucket":
            raise


def source(resp: dict[str, Any]) -> str | None:
    headers: dict[str, str] = resp["ResponseMetadata"]["HTTPHeaders"]
    return headers.get(SOURCE_HEADER)


def outcome(call: Any, **kwargs: Any) -> tuple[int, str]:
    """(HTTP status, error code or "") of a boto3 call."""
    try:
        resp = call(**kwargs)
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]
    return resp["ResponseMetadata"]["HTTPStatusCode"], ""


def assert_spooled(gw: Gateway, store: Any, bucket: str, key: str) -> None:
    """The key is answered from the spool and the store does not have it yet: the test is not vacuous."""
    head = gw.client().head_object(Bucket=bucket, Key=key)
    assert source(head) == "spool", f"{key} is not held in the spool"
    try:
        on_store = store.head_object(Bucket=bucket, Key=key)["ETag"]
    except ClientError:
        on_store = None
    assert on_store != head["ETag"], f"{key} already drained"


# --- ListObjectVersions ------------------------------------------------------------------------------------


def version_view(page: dict[str, Any]) -> dict[str, Any]:
    """The documented fields of a ListObjectVersions answer, without times and bucket name."""
    return {
        "versions": [
            (v["Key"], v["VersionId"], v["IsLatest"], v["ETag"], v["Size"], v["StorageClass"], v.get("Owner"))
            for v in page.get("Versions", [])
        ],
        "markers": [(m["Key"], m["VersionId"], m["IsLatest"]) for m in page.get("DeleteMarkers", [])],
        "prefixes": [p["Prefix"] for p in page.get("CommonPrefixes", [])],
        "truncated": page["IsTruncated"],
        "next": (page.get("NextKeyMarker"), page.get("NextVersionIdMarker")),
    }


def all_version_pages(client: Any, bucket: str, **kwargs: Any) -> list[dict[str, Any]]:
    pages = []
    args = dict(kwargs)
    while True:
        page = client.list_object_versions(Bucket=bucket, **args)
        pages.append(version_view(page))
        if not page["IsTruncated"]:
            return pages
        args["KeyMarker"] = page["NextKeyMarker"]
        if page.get("NextVersionIdMarker"):
            args["VersionIdMarker"] = page["NextVersionIdMarker"]
        else:
            args.pop("VersionIdMarker", None)


def test_list_object_versions_shows_spooled_keys_as_the_store_shows_the_same_objects(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    on_store = {"a": b"store-a", f"{HELD}old": b"old", f"{HELD}gone": b"gone", "dir/x": b"x", "dir2/y": b"y"}
    for key, body in on_store.items():
        backend.put_object(Bucket=bucket, Key=key, Body=body)
    spooled = {f"{HELD}old": b"new", f"{HELD}new": b"n" * 10, f"{HELD}sub/deep": b"deep", f"{HELD}z": b"z"}
    for key, body in spooled.items():
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=body)) == "spool"
    s3.delete_object(Bucket=bucket, Key=f"{HELD}gone")  # a tombstone over a backend key
    s3.delete_object(Bucket=bucket, Key="dir2/y")  # not spooled: deleted on the store
    # The reference: the same calls straight to the store.
    for key, body in {**on_store, **spooled}.items():
        backend.put_object(Bucket=store_bucket, Key=key, Body=body)
    backend.delete_object(Bucket=store_bucket, Key=f"{HELD}gone")
    backend.delete_object(Bucket=store_bucket, Key="dir2/y")
    for key in spooled:
        assert_spooled(held.gw, backend, bucket, key)

    for kwargs in (
        {},
        {"Prefix": HELD},
        {"Delimiter": "/"},
        {"Prefix": HELD, "Delimiter": "/"},
        {"MaxKeys": 2},
        {"MaxKeys": 1, "Delimiter": "/"},
        {"KeyMarker": f"{HELD}new"},
        {"KeyMarker": f"{HELD}new", "VersionIdMarker": "null"},
        {"Prefix": "dir"},
    ):
        got = all_version_pages(s3, bucket, **kwargs)
        want = all_version_pages(backend, store_bucket, **kwargs)
        assert got == want, kwargs
    assert source(s3.head_object(Bucket=bucket, Key=f"{HELD}new")) == "spool", "drained during the test"


def _listing_view(page: dict[str, Any]) -> dict[str, Any]:
    return {
        "keys": [(o["Key"], o["Size"], o["ETag"]) for o in page.get("Contents", [])],
        "prefixes": [p["Prefix"] for p in page.get("CommonPrefixes", [])],
        **{k: page.get(k) for k in ("IsTruncated", "KeyCount", "NextMarker", "Marker", "StartAfter")},
        "Prefix": page.get("Prefix"),
    }


def _all_listing_pages(client: Any, bucket: str, op: str, **kwargs: Any) -> list[dict[str, Any]]:
    pages = []
    args = dict(kwargs)
    for _ in range(30):
        page = getattr(client, op)(Bucket=bucket, **args)
        pages.append(_listing_view(page))
        if not page["IsTruncated"]:
            return pages
        if op == "list_objects_v2":
            args["ContinuationToken"] = page["NextContinuationToken"]
        else:
            args["Marker"] = page["NextMarker"]
    raise AssertionError("the listing did not end")


def _raw_listings(client: Any) -> Any:
    """The client without botocore's own encoding-type=url (and its decoding): values as sent, so that a
    V1 NextMarker holding a "+" (sent unencoded, by the store too) is not decoded into a space."""
    for op in ("ListObjects", "ListObjectsV2"):
        client.meta.events.unregister(
            f"before-parameter-build.s3.{op}", botocore.handlers.set_list_objects_encoding_type_url
        )
    return client


def test_merged_listings_page_order_and_encode_as_the_store_with_directory_shaped_keys(
    held: Held, backend: Any, seaweed: Any, bucket: str, store_bucket: str
) -> None:
    """SeaweedFS lists a directory tree depth first (held/a/b before held/a-c), skips the directory a
    start-after names (held/a/b/c after held/a/b), continues a page that ends on a key with children inside
    them, and url-encodes a space as %20 in directories and + in the last segment: the merge answers alike."""
    s3 = held.gw.client()
    keys = ["a", "a/b", "a/b/c", "a-c", "a b/c d", "b", "b/x y", "p+q/r=s", "z"]
    on_store = {f"{HELD}{k}": f"store {k}".encode() for k in keys[::2]}
    spooled = {f"{HELD}{k}": f"spooled {k}".encode() for k in keys[1::2]}
    for key, body in on_store.items():
        backend.put_object(Bucket=bucket, Key=key, Body=body)
    for key, body in spooled.items():
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=body)) == "spool"
    for key, body in {**on_store, **spooled}.items():
        backend.put_object(Bucket=store_bucket, Key=key, Body=body)
    assert_spooled(held.gw, backend, bucket, f"{HELD}a/b")

    cases: list[dict[str, Any]] = [
        {},
        {"Delimiter": "/"},
        {"Prefix": f"{HELD}a/", "Delimiter": "/"},
        {"MaxKeys": 1},
        {"MaxKeys": 1, "Delimiter": "/"},
        {"MaxKeys": 2, "Prefix": HELD, "Delimiter": "/"},
        {"EncodingType": "url"},
        {"EncodingType": "url", "Delimiter": "/"},
    ]
    raw_gateway, raw_store = _raw_listings(held.gw.client()), _raw_listings(s3_client(seaweed))
    for op in ("list_objects_v2", "list_objects"):
        for kwargs in [*cases, {"StartAfter" if op == "list_objects_v2" else "Marker": f"{HELD}a/b"}]:
            args = {"Prefix": HELD, **kwargs}
            got = _all_listing_pages(raw_gateway, bucket, op, **args)
            want = _all_listing_pages(raw_store, store_bucket, op, **args)
            assert [_without_bucket(p) for p in got] == [_without_bucket(p) for p in want], (op, kwargs)
    raw_store.close()
    assert source(s3.head_object(Bucket=bucket, Key=f"{HELD}a/b")) == "spool", "drained during the test"


def test_a_key_ending_in_slash_goes_to_the_store_which_keeps_it_as_a_directory(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    """SeaweedFS drops the bytes of a key ending in "/" (a directory); were it spooled, GET would answer them
    until the drain. Written through, it reads the same at once as straight on the store. (Not under held/:
    the held backend refuses every PUT there, the store's own included.)"""
    s3 = held.gw.client()
    before = write_through_count(held.gw, "key")
    put = s3.put_object(Bucket=bucket, Key="dir/", Body=b"odd key")
    assert source(put) is None
    assert write_through_count(held.gw, "key") == before + 1
    backend.put_object(Bucket=store_bucket, Key="dir/", Body=b"odd key")
    got = s3.get_object(Bucket=bucket, Key="dir/")
    want = backend.get_object(Bucket=store_bucket, Key="dir/")
    assert (got["Body"].read(), got["ETag"], got["ContentLength"]) == (
        want["Body"].read(),
        want["ETag"],
        want["ContentLength"],
    )


def _without_bucket(page: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in page.items() if k != "Name"}


def test_list_versions_delete_them_then_delete_bucket_works_while_keys_are_spooled(
    held: Held, backend: Any, seaweed: Any
) -> None:
    """The clean-up tools do: list every version, DeleteObjects over them, DeleteBucket."""
    name = f"rb-{os.urandom(6).hex()}"
    backend.create_bucket(Bucket=name)
    try:
        s3 = held.gw.client()
        backend.put_object(Bucket=name, Key="on-store", Body=b"s")
        for n in range(3):
            assert source(s3.put_object(Bucket=name, Key=f"{HELD}k{n}", Body=b"spooled")) == "spool"
        assert_spooled(held.gw, backend, name, f"{HELD}k0")
        listed = s3.list_object_versions(Bucket=name)
        objects = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in listed.get("Versions", [])]
        assert sorted(o["Key"] for o in objects) == ["held/k0", "held/k1", "held/k2", "on-store"]
        # The drain's DELETEs of the spooled deletes are held too: DeleteBucket must not wait for them.
        held.proxy.stall(lambda method, path: method == "DELETE" and f"/{HELD}" in path.partition("?")[0])
        result = s3.delete_objects(Bucket=name, Delete={"Objects": objects})
        assert not result.get("Errors"), result
        assert sorted(d["Key"] for d in result["Deleted"]) == sorted(o["Key"] for o in objects)
        assert s3.list_object_versions(Bucket=name).get("Versions") is None
        assert s3.list_objects_v2(Bucket=name)["KeyCount"] == 0
        started = time.monotonic()
        status, code = outcome(s3.delete_bucket, Bucket=name)
        assert (status, code) == (204, "")
        assert time.monotonic() - started < 5
        assert outcome(backend.head_bucket, Bucket=name)[0] == 404
    finally:
        held.proxy.unstall()
        _empty_and_delete(backend, name)
    held.gw.flush(name)  # the spooled deletes drain against the deleted bucket: nothing left to do


def test_delete_bucket_waits_for_spooled_deletes_of_keys_the_store_still_has(
    held: Held, backend: Any
) -> None:
    """A key drained before its delete was acknowledged stays on the store until that delete drains: the
    store's BucketNotEmpty would be wrong for a bucket the client has emptied, so the gateway drains the
    spooled deletes and asks again (the store answers 204, as it does when the deletes reached it first)."""
    name = f"rb-{os.urandom(6).hex()}"
    backend.create_bucket(Bucket=name)
    timer: threading.Timer | None = None
    try:
        s3 = held.gw.client()
        assert source(s3.put_object(Bucket=name, Key=f"{HELD}k", Body=b"drained")) == "spool"
        backend.put_object(Bucket=name, Key=f"{HELD}k", Body=b"drained")  # as its drain would have
        held.proxy.stall(lambda method, path: method == "DELETE" and f"/{HELD}" in path.partition("?")[0])
        assert source(s3.delete_object(Bucket=name, Key=f"{HELD}k")) == "spool"
        assert s3.list_objects_v2(Bucket=name)["KeyCount"] == 0
        timer = threading.Timer(1.0, held.proxy.unstall)  # the spooled delete drains only after a while
        timer.start()
        assert outcome(s3.delete_bucket, Bucket=name) == (204, "")
        assert outcome(backend.head_bucket, Bucket=name)[0] == 404
    finally:
        if timer is not None:
            timer.join()
        held.proxy.unstall()
        _empty_and_delete(backend, name)
    held.gw.flush(name)


def test_delete_object_of_the_null_version_of_a_spooled_key_deletes_it(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    assert source(s3.put_object(Bucket=bucket, Key=f"{HELD}v", Body=b"x")) == "spool"
    backend.put_object(Bucket=store_bucket, Key=f"{HELD}v", Body=b"x")
    got = s3.delete_object(Bucket=bucket, Key=f"{HELD}v", VersionId="null")
    want = backend.delete_object(Bucket=store_bucket, Key=f"{HELD}v", VersionId="null")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == want["ResponseMetadata"]["HTTPStatusCode"]
    assert got.get("VersionId") == want.get("VersionId")
    assert outcome(s3.head_object, Bucket=bucket, Key=f"{HELD}v") == (404, "404")
    held.release()
    held.gw.flush(bucket)
    assert outcome(backend.head_object, Bucket=bucket, Key=f"{HELD}v")[0] == 404


# --- listings: empty continuation token, Owner -------------------------------------------------------------


def test_merged_listings_take_an_empty_continuation_token_and_show_owners_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    backend.put_object(Bucket=bucket, Key=f"{HELD}a", Body=b"a")
    backend.put_object(Bucket=store_bucket, Key=f"{HELD}a", Body=b"a")
    assert source(s3.put_object(Bucket=bucket, Key=f"{HELD}b", Body=b"b")) == "spool"
    backend.put_object(Bucket=store_bucket, Key=f"{HELD}b", Body=b"b")
    assert_spooled(held.gw, backend, bucket, f"{HELD}b")

    def view(page: dict[str, Any]) -> Any:
        return (
            [(o["Key"], o["ETag"], o["Size"], o.get("Owner")) for o in page.get("Contents", [])],
            page.get("ContinuationToken"),
            page["IsTruncated"],
        )

    for kwargs in ({"ContinuationToken": ""}, {"FetchOwner": True}, {}):
        got = outcome(s3.list_objects_v2, Bucket=bucket, Prefix=HELD, **kwargs)
        want = outcome(backend.list_objects_v2, Bucket=store_bucket, Prefix=HELD, **kwargs)
        assert got == want, kwargs
        assert view(s3.list_objects_v2(Bucket=bucket, Prefix=HELD, **kwargs)) == view(
            backend.list_objects_v2(Bucket=store_bucket, Prefix=HELD, **kwargs)
        ), kwargs
    got_v1 = s3.list_objects(Bucket=bucket, Prefix=HELD)["Contents"]
    want_v1 = backend.list_objects(Bucket=store_bucket, Prefix=HELD)["Contents"]
    assert [(o["Key"], o.get("Owner")) for o in got_v1] == [(o["Key"], o.get("Owner")) for o in want_v1]
    assert all(o.get("Owner") for o in got_v1)


# --- CompleteMultipartUpload: repeated, conditional ---------------------------------------------------------


def start_upload(client: Any, bucket: str, key: str, body: bytes = b"part-one") -> tuple[str, list[Any]]:
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=body)["ETag"]
    return upload_id, [{"PartNumber": 1, "ETag": etag}]


def complete(client: Any, bucket: str, key: str, upload_id: str, parts: list[Any], **kw: Any) -> Any:
    try:
        resp = client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}, **kw
        )
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]
    return resp["ResponseMetadata"]["HTTPStatusCode"], resp["ETag"]


def test_a_repeated_complete_of_a_spooled_upload_answers_the_same_result_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    key = f"{HELD}mpu"
    upload_id, parts = start_upload(s3, bucket, key)
    assert upload_id.startswith("s3lanes-"), "the upload is not held by the spool"
    ref_id, ref_parts = start_upload(backend, store_bucket, key)
    first = complete(s3, bucket, key, upload_id, parts)
    assert first == complete(backend, store_bucket, key, ref_id, ref_parts)
    # Location: the object's absolute URL at the endpoint asked, as the store answers it.
    location = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )["Location"]
    assert location == f"{held.gw.http_url}/{bucket}/{key}"
    ref_location = backend.complete_multipart_upload(
        Bucket=store_bucket, Key=key, UploadId=ref_id, MultipartUpload={"Parts": ref_parts}
    )["Location"]
    assert ref_location == f"{backend.meta.endpoint_url}/{store_bucket}/{key}"
    assert_spooled(held.gw, backend, bucket, key)
    # Again, while spooled: 200 and the same ETag (the store answers so too, whatever the parts named).
    assert complete(s3, bucket, key, upload_id, parts) == first
    assert complete(backend, store_bucket, key, ref_id, ref_parts) == first
    # ListParts of the completed upload: NoSuchUpload on both; Abort: 204 on both, the object stays.
    assert outcome(s3.list_parts, Bucket=bucket, Key=key, UploadId=upload_id) == (404, "NoSuchUpload")
    assert outcome(backend.list_parts, Bucket=store_bucket, Key=key, UploadId=ref_id) == (404, "NoSuchUpload")
    assert outcome(s3.abort_multipart_upload, Bucket=bucket, Key=key, UploadId=upload_id) == (204, "")
    assert outcome(backend.abort_multipart_upload, Bucket=store_bucket, Key=key, UploadId=ref_id) == (204, "")
    assert s3.head_object(Bucket=bucket, Key=key)["ETag"] == first[1]
    # After the drain, still the same answer.
    held.release()
    held.gw.flush(bucket)
    assert complete(s3, bucket, key, upload_id, parts) == first
    # Once the key holds another object, the upload is gone (the store: NoSuchUpload).
    s3.put_object(Bucket=bucket, Key=key, Body=b"other")
    backend.put_object(Bucket=store_bucket, Key=key, Body=b"other")
    assert complete(s3, bucket, key, upload_id, parts) == (404, "NoSuchUpload")
    assert complete(backend, store_bucket, key, ref_id, ref_parts) == (404, "NoSuchUpload")


@pytest.mark.parametrize("where", ["spool", "store", "absent", "deleted"])
def test_conditional_complete_of_a_spooled_upload_is_evaluated_as_the_store_does(
    held: Held, backend: Any, bucket: str, store_bucket: str, where: str
) -> None:
    """If-None-Match: * must not overwrite an existing object (create-only commits); If-Match must name it."""
    s3 = held.gw.client()
    key = f"{HELD}cond-{where}"
    if where == "spool":
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=b"existing")) == "spool"
        assert_spooled(held.gw, backend, bucket, key)
    elif where in ("store", "deleted"):
        backend.put_object(Bucket=bucket, Key=key, Body=b"existing")
        if where == "deleted":
            s3.put_object(Bucket=bucket, Key=key, Body=b"spooled")
            s3.delete_object(Bucket=bucket, Key=key)  # a tombstone: no object, though the store has one
    if where in ("spool", "store"):
        backend.put_object(Bucket=store_bucket, Key=key, Body=b"existing")
    existing = '"' + hashlib.md5(b"existing").hexdigest() + '"'
    for cond in (
        {"IfNoneMatch": "*"},
        {"IfMatch": '"0123456789abcdef0123456789abcdef"'},
        {"IfMatch": existing},
    ):
        upload_id, parts = start_upload(s3, bucket, key)
        assert upload_id.startswith("s3lanes-")
        ref_id, ref_parts = start_upload(backend, store_bucket, key)
        got = complete(s3, bucket, key, upload_id, parts, **cond)
        want = complete(backend, store_bucket, key, ref_id, ref_parts, **cond)
        assert got == want, (where, cond)
        if got[0] == 200:  # both wrote: put the state back for the next condition
            s3.put_object(Bucket=bucket, Key=key, Body=b"existing")
            backend.put_object(Bucket=store_bucket, Key=key, Body=b"existing")
            if where in ("absent", "deleted"):
                s3.delete_object(Bucket=bucket, Key=key)
                backend.delete_object(Bucket=store_bucket, Key=key)
        else:
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            backend.abort_multipart_upload(Bucket=store_bucket, Key=key, UploadId=ref_id)
    got_head = outcome(s3.head_object, Bucket=bucket, Key=key)
    assert got_head == outcome(backend.head_object, Bucket=store_bucket, Key=key)


def test_conditional_put_over_a_spooled_key_that_fails_is_refused_at_once(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    """The spool's own write decides it: no wait for the drain (which is held here)."""
    s3 = held.gw.client()
    key = f"{HELD}cput"
    assert source(s3.put_object(Bucket=bucket, Key=key, Body=b"existing")) == "spool"
    backend.put_object(Bucket=store_bucket, Key=key, Body=b"existing")
    for cond in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
        got = outcome(s3.put_object, Bucket=bucket, Key=key, Body=b"new", **cond)
        assert got == outcome(backend.put_object, Bucket=store_bucket, Key=key, Body=b"new", **cond)
        assert got == (412, "PreconditionFailed")
    assert_spooled(held.gw, backend, bucket, key)


# --- CopyObject / UploadPartCopy from a spooled source ---------------------------------------------------


def copy_cases(etag: str) -> list[dict[str, Any]]:
    past = datetime.now(UTC) - timedelta(days=1)
    future = datetime.now(UTC) + timedelta(days=1)
    return [
        {"CopySourceIfMatch": etag},
        {"CopySourceIfMatch": '"0123456789abcdef0123456789abcdef"'},
        {"CopySourceIfNoneMatch": etag},
        {"CopySourceIfNoneMatch": '"0123456789abcdef0123456789abcdef"'},
        {"CopySourceIfModifiedSince": future},
        {"CopySourceIfModifiedSince": past},
        {"CopySourceIfUnmodifiedSince": past},
        {"CopySourceIfUnmodifiedSince": future},
        {"CopySourceIfMatch": etag, "CopySourceIfUnmodifiedSince": past},
        {"CopySourceIfNoneMatch": '"0123456789abcdef0123456789abcdef"', "CopySourceIfModifiedSince": future},
    ]


def test_copy_object_from_a_spooled_source_evaluates_every_copy_source_condition_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    src = f"{HELD}src"
    body = b"0123456789"
    assert source(s3.put_object(Bucket=bucket, Key=src, Body=body)) == "spool"
    backend.put_object(Bucket=store_bucket, Key=src, Body=body)
    etag = s3.head_object(Bucket=bucket, Key=src)["ETag"]
    for n, cond in enumerate(copy_cases(etag)):
        dst = f"dst-{n}"
        got = outcome(
            s3.copy_object, Bucket=bucket, Key=dst, CopySource={"Bucket": bucket, "Key": src}, **cond
        )
        want = outcome(
            backend.copy_object,
            Bucket=store_bucket,
            Key=dst,
            CopySource={"Bucket": store_bucket, "Key": src},
            **cond,
        )
        assert got == want, cond
        assert outcome(s3.head_object, Bucket=bucket, Key=dst)[0] == (200 if got[0] == 200 else 404), cond
    assert_spooled(held.gw, backend, bucket, src)


@pytest.mark.parametrize("src_where", ["spool", "store"])
def test_upload_part_copy_refuses_ranges_and_conditions_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str, src_where: str
) -> None:
    s3 = held.gw.client()
    src = f"{HELD}src" if src_where == "spool" else "store-src"
    body = b"0123456789"
    if src_where == "spool":
        assert source(s3.put_object(Bucket=bucket, Key=src, Body=body)) == "spool"
    else:
        backend.put_object(Bucket=bucket, Key=src, Body=body)
    backend.put_object(Bucket=store_bucket, Key=src, Body=body)
    etag = s3.head_object(Bucket=bucket, Key=src)["ETag"]
    key = f"{HELD}mpu-copy"
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    assert upload_id.startswith("s3lanes-")
    ref_id = backend.create_multipart_upload(Bucket=store_bucket, Key=key)["UploadId"]
    cases: list[dict[str, Any]] = [
        {"CopySourceRange": r}
        for r in ("bytes=0-4", "bytes=5-20", "bytes=10-12", "bytes=3-2", "bytes=-3", "bytes=0-")
    ]
    cases += copy_cases(etag)[:8]
    for cond in cases:
        got = s3_part_copy(s3, bucket, key, upload_id, src, cond)
        want = s3_part_copy(backend, store_bucket, key, ref_id, src, cond)
        assert got == want, cond
    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    backend.abort_multipart_upload(Bucket=store_bucket, Key=key, UploadId=ref_id)


def s3_part_copy(client: Any, bucket: str, key: str, upload_id: str, src: str, cond: dict[str, Any]) -> Any:
    """(status, error code), or (200, "") for a copied part: the store's CopyPartResult ETag is the source
    object's (SeaweedFS), where S3 and the gateway answer the part's own MD5."""
    try:
        resp = client.upload_part_copy(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=1,
            CopySource={"Bucket": bucket, "Key": src},
            **cond,
        )
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]
    assert resp["CopyPartResult"]["ETag"]
    return 200, ""


# --- ListMultipartUploads ---------------------------------------------------------------------------------


def test_list_multipart_uploads_shows_the_clients_uploads_not_the_drains(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    """While the drain has a multipart upload of its own open on the store, a client listing the bucket's
    uploads through the gateway sees what it created, as on the store: the spool's open upload, not the
    drain's."""
    s3 = held.gw.client()
    big = os.urandom(5 * MiB)
    drained_key = f"{HELD}draining"
    upload_id, parts = start_upload(s3, bucket, drained_key, body=big)
    assert upload_id.startswith("s3lanes-")
    etag2 = s3.upload_part(Bucket=bucket, Key=drained_key, UploadId=upload_id, PartNumber=2, Body=b"t")[
        "ETag"
    ]
    # The drain's first part PUT is held by the store until unstalled: its upload stays open there.
    held.release()
    held.proxy.stall(lambda method, path: method == "PUT" and "partNumber=" in path and "draining" in path)
    try:
        parts.append({"PartNumber": 2, "ETag": etag2})
        complete(s3, bucket, drained_key, upload_id, parts)
        open_id, _ = start_upload(s3, bucket, f"{HELD}open")
        ref_id, _ = start_upload(backend, store_bucket, f"{HELD}open")
        deadline = time.monotonic() + 10
        while held.proxy.stalled == 0:
            assert time.monotonic() < deadline, "the drain did not start its multipart upload"
            time.sleep(0.01)
        on_store = backend.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        assert [u["Key"] for u in on_store] == [drained_key], "the drain's upload is not open on the store"
        got = s3.list_multipart_uploads(Bucket=bucket)
        want = backend.list_multipart_uploads(Bucket=store_bucket)
        assert [u["Key"] for u in got.get("Uploads", [])] == [u["Key"] for u in want.get("Uploads", [])]
        assert [u["UploadId"] for u in got["Uploads"]] == [open_id]
        assert ref_id
    finally:
        held.proxy.unstall()
    s3.abort_multipart_upload(Bucket=bucket, Key=f"{HELD}open", UploadId=open_id)


# --- s3lanes_spool_write_through_total -------------------------------------------------------------------


def test_writes_of_a_spooled_lane_sent_to_the_store_are_counted_by_reason(held: Held, bucket: str) -> None:
    s3 = held.gw.client()
    before = {r: write_through_count(held.gw, r) for r in ("requested", "conditional", "key")}
    put = s3.put_object(Bucket=bucket, Key="wt-1", Body=b"x", IfNoneMatch="*")
    assert source(put) is None

    def write_through(request: Any, **_: Any) -> None:
        request.headers["x-s3lanes-write-through"] = "true"

    s3.meta.events.register("before-sign.s3.PutObject", write_through)
    assert source(s3.put_object(Bucket=bucket, Key="wt-2", Body=b"x")) is None
    s3_plain = held.gw.client()
    outcome(s3_plain.put_object, Bucket=bucket, Key="a/./b", Body=b"x")  # the store answers it (it refuses)
    assert source(s3_plain.put_object(Bucket=bucket, Key=f"{HELD}spooled", Body=b"x")) == "spool"
    after = {r: write_through_count(held.gw, r) for r in before}
    assert after == {r: before[r] + 1 for r in before}


# --- Last-Modified ----------------------------------------------------------------------------------------


def test_last_modified_agrees_between_head_get_and_listings_while_spooled_and_after_the_drain(
    held: Held, backend: Any, bucket: str
) -> None:
    """Spooled: the acknowledgement time everywhere; drained: the store's time everywhere (docs/spool.md)."""
    s3 = held.gw.client()
    key = f"{HELD}lm"
    assert source(s3.put_object(Bucket=bucket, Key=key, Body=b"x")) == "spool"

    def seen() -> set[datetime]:
        head = s3.head_object(Bucket=bucket, Key=key)["LastModified"]
        get = s3.get_object(Bucket=bucket, Key=key)
        get["Body"].read()
        v2 = s3.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"][0]["LastModified"]
        v1 = s3.list_objects(Bucket=bucket, Prefix=key)["Contents"][0]["LastModified"]
        versions = s3.list_object_versions(Bucket=bucket, Prefix=key)["Versions"][0]["LastModified"]
        return {head, get["LastModified"], v2, v1, versions}

    time.sleep(1.1)  # the drain, once released, lands in a later second than the acknowledgement
    spooled = seen()
    assert len(spooled) == 1, spooled
    assert_spooled(held.gw, backend, bucket, key)
    held.release()
    held.gw.flush(bucket)
    drained = seen()
    assert len(drained) == 1, drained
    assert drained == {backend.head_object(Bucket=bucket, Key=key)["LastModified"]}
    assert drained != spooled  # documented: the store sets it when the object lands


# --- a part uploaded twice at once --------------------------------------------------------------------------


def slow_put(url: str, data: bytes, pause_s: float) -> tuple[int, str]:
    """PUT ``data`` to a presigned URL, pausing ``pause_s`` after its first bytes; (status, ETag)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        conn.putrequest("PUT", f"{parts.path}?{parts.query}", skip_accept_encoding=True)
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders()
        conn.send(data[:10])
        time.sleep(pause_s)
        conn.send(data[10:])
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("ETag") or ""
    finally:
        conn.close()


def racing_parts(client: Any, bucket: str, key: str) -> tuple[str, dict[str, tuple[int, str]]]:
    """Part 1 uploaded twice at once: "slow" starts first and finishes last, "fast" in between."""
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    url = client.generate_presigned_url(
        "upload_part", Params={"Bucket": bucket, "Key": key, "UploadId": upload_id, "PartNumber": 1}
    )
    done: dict[str, tuple[int, str]] = {}

    def run(name: str, data: bytes, pause_s: float) -> None:
        done[name] = slow_put(url, data, pause_s)

    slow = threading.Thread(target=run, args=("slow", b"s" * 1000, 1.5))
    slow.start()
    time.sleep(0.3)
    run("fast", b"f" * 1000, 0.0)
    slow.join(30)
    assert done["slow"][0] == done["fast"][0] == 200, done
    return upload_id, done


def test_a_part_uploaded_twice_at_once_completes_with_the_etag_of_either_as_on_the_store(
    held: Held, backend: Any, seaweed: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client(signature_version="s3v4")
    store = s3_client(seaweed, signature_version="s3v4")
    try:
        key = f"{HELD}race"
        upload_id, got = racing_parts(s3, bucket, key)
        assert upload_id.startswith("s3lanes-")
        ref_id, want = racing_parts(store, store_bucket, key)
        # The upload that finished first: the store completes with it, and so does the gateway.
        parts = [{"PartNumber": 1, "ETag": got["fast"][1]}]
        ref_parts = [{"PartNumber": 1, "ETag": want["fast"][1]}]
        assert complete(s3, bucket, key, upload_id, parts) == complete(
            backend, store_bucket, key, ref_id, ref_parts
        )
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"f" * 1000
        assert backend.get_object(Bucket=store_bucket, Key=key)["Body"].read() == b"f" * 1000
    finally:
        store.close()


# --- Content-Encoding: the body is stored as sent ---------------------------------------------------------


@pytest.mark.parametrize("spooled", [True, False])
def test_a_body_with_content_encoding_gzip_is_stored_byte_for_byte_as_on_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str, spooled: bool
) -> None:
    """S3 stores what it is sent: Content-Encoding is the object's metadata, the gateway does not inflate."""
    s3 = held.gw.client()
    if not spooled:

        def write_through(request: Any, **_: Any) -> None:
            request.headers["x-s3lanes-write-through"] = "true"

        s3.meta.events.register("before-sign.s3.PutObject", write_through)
    key = f"{HELD}gz" if spooled else "gz"
    for n, body in enumerate((gzip.compress(b"hello world" * 100), b"not gzip at all")):
        put = s3.put_object(Bucket=bucket, Key=f"{key}{n}", Body=body, ContentEncoding="gzip")
        ref = backend.put_object(Bucket=store_bucket, Key=f"{key}{n}", Body=body, ContentEncoding="gzip")
        assert source(put) == ("spool" if spooled else None)
        assert put["ETag"] == ref["ETag"]
        got = s3.get_object(Bucket=bucket, Key=f"{key}{n}")
        assert got["Body"].read() == body
        assert got["ContentEncoding"] == "gzip"


def test_list_multipart_uploads_lists_spooled_and_store_uploads_together_in_key_order(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    through = held.gw.client()

    def write_through(request: Any, **_: Any) -> None:
        request.headers["x-s3lanes-write-through"] = "true"

    through.meta.events.register("before-sign.s3.CreateMultipartUpload", write_through)
    ids = {}
    for key in (f"{HELD}c", f"{HELD}a"):
        ids[key] = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        assert ids[key].startswith("s3lanes-")
    ids[f"{HELD}b"] = through.create_multipart_upload(Bucket=bucket, Key=f"{HELD}b")["UploadId"]
    assert not ids[f"{HELD}b"].startswith("s3lanes-"), "not created on the store"
    for key in (f"{HELD}c", f"{HELD}a", f"{HELD}b"):
        backend.create_multipart_upload(Bucket=store_bucket, Key=key)
    for kwargs in ({}, {"Prefix": HELD}, {"Delimiter": "/"}):
        got = s3.list_multipart_uploads(Bucket=bucket, **kwargs)
        want = backend.list_multipart_uploads(Bucket=store_bucket, **kwargs)
        # The same uploads; in key order, as AWS lists them (SeaweedFS lists them by upload id, whose prefix
        # is the SHA-1 of the key: docs/compatibility.md).
        got_keys = [u["Key"] for u in got.get("Uploads", [])]
        assert got_keys == sorted(u["Key"] for u in want.get("Uploads", [])), kwargs
        assert [p["Prefix"] for p in got.get("CommonPrefixes", [])] == [
            p["Prefix"] for p in want.get("CommonPrefixes", [])
        ]
    for key, upload_id in ids.items():
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)


# --- GetObjectTagging ------------------------------------------------------------------------------------


def test_get_object_tagging_of_a_spooled_object_answers_at_once_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    for key, tagging in ((f"{HELD}t1", "k=v&a%20b=c%26d&empty="), (f"{HELD}t2", None)):
        extra = {"Tagging": tagging} if tagging is not None else {}
        assert source(s3.put_object(Bucket=bucket, Key=key, Body=b"x", **extra)) == "spool"
        backend.put_object(Bucket=store_bucket, Key=key, Body=b"x", **extra)
        started = time.monotonic()
        got = s3.get_object_tagging(Bucket=bucket, Key=key)
        assert time.monotonic() - started < 5, "waited for the drain"
        want = backend.get_object_tagging(Bucket=store_bucket, Key=key)
        assert sorted((t["Key"], t["Value"]) for t in got["TagSet"]) == sorted(
            (t["Key"], t["Value"]) for t in want["TagSet"]
        )
        assert_spooled(held.gw, backend, bucket, key)
    s3.delete_object(Bucket=bucket, Key=f"{HELD}t2")
    backend.delete_object(Bucket=store_bucket, Key=f"{HELD}t2")
    got_gone = outcome(s3.get_object_tagging, Bucket=bucket, Key=f"{HELD}t2")
    assert got_gone == outcome(backend.get_object_tagging, Bucket=store_bucket, Key=f"{HELD}t2")


def test_get_object_attributes_of_a_spooled_object_answers_at_once_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    s3 = held.gw.client()
    single = f"{HELD}attr"
    assert source(s3.put_object(Bucket=bucket, Key=single, Body=b"hello")) == "spool"
    backend.put_object(Bucket=store_bucket, Key=single, Body=b"hello")
    multi = f"{HELD}mattr"
    bodies = [os.urandom(5 * MiB), b"tail"]
    for client, name in ((s3, bucket), (backend, store_bucket)):
        upload_id = client.create_multipart_upload(Bucket=name, Key=multi)["UploadId"]
        parts = [
            {
                "PartNumber": n,
                "ETag": client.upload_part(Bucket=name, Key=multi, UploadId=upload_id, PartNumber=n, Body=b)[
                    "ETag"
                ],
            }
            for n, b in enumerate(bodies, start=1)
        ]
        client.complete_multipart_upload(
            Bucket=name, Key=multi, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    attributes = ["ETag", "ObjectParts", "StorageClass", "ObjectSize"]

    def view(resp: dict[str, Any]) -> Any:
        return {k: v for k, v in resp.items() if k not in ("ResponseMetadata", "LastModified")}

    for key, extra in ((single, {}), (multi, {}), (multi, {"MaxParts": 1}), (multi, {"PartNumberMarker": 1})):
        started = time.monotonic()
        got = s3.get_object_attributes(Bucket=bucket, Key=key, ObjectAttributes=attributes, **extra)
        assert time.monotonic() - started < 5, "waited for the drain"
        want = backend.get_object_attributes(
            Bucket=store_bucket, Key=key, ObjectAttributes=attributes, **extra
        )
        assert view(got) == view(want), (key, extra)
        assert source(got) == "spool"
    assert got["LastModified"] == s3.head_object(Bucket=bucket, Key=multi)["LastModified"]
    assert_spooled(held.gw, backend, bucket, single)


def test_an_unsatisfiable_range_of_a_spooled_object_names_its_size_as_the_store(
    held: Held, backend: Any, bucket: str, store_bucket: str
) -> None:
    """A 416 of GET with a Range beyond the object carries ``Content-Range: bytes */size`` (also for an empty
    object), as the store answers it for the same object."""
    s3 = held.gw.client()
    for n, body in enumerate((b"", b"x" * 1000)):
        key = f"{HELD}r{n}"
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        backend.put_object(Bucket=store_bucket, Key=key, Body=body)
        assert_spooled(held.gw, backend, bucket, key)
        for rng in ("bytes=1000-", "bytes=5000-6000", "bytes=-0"):
            seen = []
            for client, name in ((s3, bucket), (backend, store_bucket)):
                with pytest.raises(ClientError) as exc:
                    client.get_object(Bucket=name, Key=key, Range=rng)
                resp = exc.value.response
                seen.append(
                    (
                        resp["ResponseMetadata"]["HTTPStatusCode"],
                        resp["Error"]["Code"],
                        resp["ResponseMetadata"]["HTTPHeaders"].get("content-range"),
                    )
                )
            assert seen[0] == seen[1] == (416, "InvalidRange", f"bytes */{len(body)}"), (rng, seen)
