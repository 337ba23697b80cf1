"""The conformance corpus: S3 operation sequences, each a function of a :class:`Target`.

A scenario makes its calls through ``t.call``/``t.raw`` (each records one normalized observation) and
``t.note`` (a derived fact), and calls ``t.settle()`` after its writes (the "after flush" target flushes the
spool there). Families are generated from parameter tables (each checksum algorithm x single/multipart,
each condition x match/mismatch, ...). :data:`FAST` names the subset the normal test suite runs; ``make
conformance`` runs all of them.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import gzip
import hashlib
import io
import itertools
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.conformance.harness import Target
from tests.e2e import s3raw

MIB = 1024 * 1024
PART_BYTES = 5 * MIB  # S3's smallest part but the last
PAST = datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC)
FUTURE = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Target], None]
    fast: bool
    group: str


SCENARIOS: dict[str, Scenario] = {}


def add(name: str, run: Callable[[Target], None]) -> None:
    assert name not in SCENARIOS, name
    SCENARIOS[name] = Scenario(name, run, False, name.split(".", 1)[0])


def scenario() -> Callable[[Callable[[Target], None]], Callable[[Target], None]]:
    def deco(fn: Callable[[Target], None]) -> Callable[[Target], None]:
        add(fn.__name__.replace("__", "."), fn)
        return fn

    return deco


def body_of(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(f"{seed}".encode()).digest() * 2048  # 64 KiB, seed-specific
    return (block * (size // len(block) + 1))[:size]


def http_date(when: datetime.datetime) -> str:
    return when.strftime("%a, %d %b %Y %H:%M:%S GMT")


# ---- objects: put / get / head / delete ----------------------------------------------------------------
for size in (0, 1, 17, 64 * 1024, 256 * 1024 + 1, 3 * MIB + 5):

    def put_get(t: Target, size: int = size) -> None:
        t.content_type = None
        t.call("put", "put_object", Key="obj", Body=body_of(size))
        t.settle()
        t.call("head", "head_object", Key="obj")
        t.call("get", "get_object", Key="obj")
        t.call("list", "list_objects_v2")

    add(f"object.put_get_{size}", put_get)

for settle_between in (False, True):

    def overwrite(t: Target, settle_between: bool = settle_between) -> None:
        t.call("put 1", "put_object", Key="k", Body=b"first version", Metadata={"v": "1"})
        if settle_between:
            t.settle()
        t.call("put 2", "put_object", Key="k", Body=b"second", ContentType="text/plain")
        t.settle()
        t.call("get", "get_object", Key="k")
        t.call("head", "head_object", Key="k")
        t.call("list", "list_objects_v2")

    def delete(t: Target, settle_between: bool = settle_between) -> None:
        t.call("put", "put_object", Key="k", Body=b"to be deleted")
        if settle_between:
            t.settle()
        t.call("delete", "delete_object", Key="k")
        t.settle()
        t.call("get", "get_object", Key="k")
        t.call("head", "head_object", Key="k")
        t.call("delete again", "delete_object", Key="k")
        t.call("list", "list_objects_v2")
        t.call("list v1", "list_objects")

    def delete_then_put(t: Target, settle_between: bool = settle_between) -> None:
        t.call("put", "put_object", Key="k", Body=b"one")
        t.call("delete", "delete_object", Key="k")
        if settle_between:
            t.settle()
        t.call("put again", "put_object", Key="k", Body=b"two")
        t.settle()
        t.call("get", "get_object", Key="k")

    suffix = "settled" if settle_between else "spooled"
    add(f"object.overwrite_{suffix}", overwrite)
    add(f"object.delete_{suffix}", delete)
    add(f"object.delete_then_put_{suffix}", delete_then_put)


@scenario()
def object__missing(t: Target) -> None:
    t.call("get", "get_object", Key="nope")
    t.call("head", "head_object", Key="nope")
    t.call("delete", "delete_object", Key="nope")
    t.call("get other bucket", "get_object", Bucket=t.bucket + "-none", Key="k")
    t.call("put other bucket", "put_object", Bucket=t.bucket + "-none", Key="k", Body=b"x")


@scenario()
def object__delete_bucket_not_empty(t: Target) -> None:
    t.call("put", "put_object", Key="k", Body=b"x")
    t.call("delete bucket", "delete_bucket")
    t.call("get", "get_object", Key="k")


for n, key in enumerate(
    ["a b", "ü/ñ/日本", "a+b=c&d", "x%41y", "dir/", "a//b", "~t!l'd(e)*", "k" * 900, "sp ace/ end "]
):

    def odd_key(t: Target, key: str = key) -> None:
        t.call("put", "put_object", Key=key, Body=b"odd key")
        t.settle()
        t.call("get", "get_object", Key=key)
        t.call("head", "head_object", Key=key)
        t.call("list", "list_objects_v2")
        t.call("list url", "list_objects_v2", EncodingType="url")
        t.call("delete", "delete_object", Key=key)
        t.call("list after", "list_objects_v2")

    add(f"object.key_{n}", odd_key)


# ---- metadata and content headers ---------------------------------------------------------------------
METADATA_CASES: dict[str, dict[str, str]] = {
    "simple": {"a": "1"},
    "empty_value": {"empty": ""},
    "mixed_case": {"MiXed-Case": "Value With Spaces"},
    "many": {f"m{i}": f"v{i}" for i in range(20)},
    "spaces": {"s": "  padded  "},
    "dashes": {"x-y-z": "a-b"},
}
for case, meta in METADATA_CASES.items():

    def metadata(t: Target, meta: dict[str, str] = meta) -> None:
        t.call("put", "put_object", Key="m", Body=b"meta", Metadata=meta)
        t.settle()
        t.call("head", "head_object", Key="m")
        t.call("get", "get_object", Key="m")
        t.call("copy", "copy_object", Key="m2", CopySource={"Bucket": t.bucket, "Key": "m"})
        t.settle()
        t.call("head copy", "head_object", Key="m2")

    add(f"metadata.{case}", metadata)

CONTENT_CASES: dict[str, dict[str, Any]] = {
    "type": {"ContentType": "application/x-custom; charset=utf-8"},
    "encoding_gzip": {"ContentEncoding": "gzip"},
    "encoding_list": {"ContentEncoding": "deflate, gzip"},
    "disposition": {"ContentDisposition": 'attachment; filename="a b.txt"'},
    "language": {"ContentLanguage": "de-CH"},
    "expires": {"Expires": datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)},
    "cache_control": {"CacheControl": "max-age=3600, must-revalidate"},
    "all": {
        "ContentType": "text/csv",
        "ContentEncoding": "identity",
        "ContentDisposition": "inline",
        "ContentLanguage": "en",
        "CacheControl": "no-cache",
        "Expires": datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC),
    },
    "default_type": {},
}
for case, headers in CONTENT_CASES.items():

    def content(t: Target, headers: dict[str, Any] = headers) -> None:
        t.content_type = None
        t.call("put", "put_object", Key="c", Body=b"content", **headers)
        t.settle()
        t.call("head", "head_object", Key="c")
        t.call("get", "get_object", Key="c")

    def content_multipart(t: Target, headers: dict[str, Any] = headers) -> None:
        t.content_type = None
        up = t.call("create", "create_multipart_upload", Key="c", **headers)
        p = t.call("part", "upload_part", Key="c", UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 10)
        t.call(
            "complete",
            "complete_multipart_upload",
            Key="c",
            UploadId=up["UploadId"],
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p.get("ETag", "")}]},
        )
        t.settle()
        t.call("head", "head_object", Key="c")

    add(f"content.{case}", content)
    add(f"content.multipart_{case}", content_multipart)


@scenario()
def content__gzip_body(t: Target) -> None:
    """An object stored gzip-compressed (Content-Encoding: gzip) must come back byte for byte, not decoded."""
    data = gzip.compress(b"compressed object " * 100, mtime=0)
    t.call("put", "put_object", Key="z.gz", Body=data, ContentEncoding="gzip", ContentType="text/plain")
    t.settle()
    t.call("get", "get_object", Key="z.gz")
    t.call("head", "head_object", Key="z.gz")


RESPONSE_OVERRIDES: dict[str, dict[str, str]] = {
    "type": {"ResponseContentType": "image/png"},
    "disposition": {"ResponseContentDisposition": "attachment"},
    "all": {
        "ResponseContentType": "a/b",
        "ResponseContentLanguage": "fr",
        "ResponseContentEncoding": "br",
        "ResponseCacheControl": "no-store",
        "ResponseContentDisposition": "inline",
        "ResponseExpires": "Thu, 01 Jan 2037 00:00:00 GMT",
    },
}
for case, params in RESPONSE_OVERRIDES.items():

    def override(t: Target, params: dict[str, str] = params) -> None:
        t.call("put", "put_object", Key="o", Body=b"override", ContentType="text/plain")
        t.settle()
        t.call("get", "get_object", Key="o", **params)
        t.call("head", "head_object", Key="o", **params)

    add(f"content.response_{case}", override)


# ---- ranges and partNumber reads ----------------------------------------------------------------------
RANGES = [
    "bytes=0-0",
    "bytes=0-99",
    "bytes=100-",
    "bytes=-100",
    "bytes=-2000",
    "bytes=999-",
    "bytes=999-5000",
    "bytes=1000-",
    "bytes=1000-2000",
    "bytes=5-2",
    "bytes=0-99,200-299",
    "bytes=abc",
    "bytes=-0",
    "items=0-9",
]
for n, rng in enumerate(RANGES):

    def ranged(t: Target, rng: str = rng) -> None:
        t.call("put", "put_object", Key="r", Body=body_of(1000))
        t.settle()
        t.call("get", "get_object", Key="r", Range=rng)
        t.call("head", "head_object", Key="r", Range=rng)

    add(f"range.r{n}", ranged)

for n, rng in enumerate(["bytes=0-0", "bytes=-1", "bytes=0-", "bytes=-0"]):

    def ranged_empty(t: Target, rng: str = rng) -> None:
        t.call("put", "put_object", Key="e", Body=b"")
        t.settle()
        t.call("get", "get_object", Key="e", Range=rng)

    add(f"range.empty_{n}", ranged_empty)


def _multipart(t: Target, key: str, sizes: list[int], **create: Any) -> dict[str, Any]:
    up = t.call("create", "create_multipart_upload", Key=key, **create)
    parts = []
    for i, size in enumerate(sizes, start=1):
        p = t.call(
            f"part {i}", "upload_part", Key=key, UploadId=up["UploadId"], PartNumber=i, Body=body_of(size, i)
        )
        parts.append({"PartNumber": i, "ETag": p.get("ETag", "")})
    return t.call(
        "complete",
        "complete_multipart_upload",
        Key=key,
        UploadId=up["UploadId"],
        MultipartUpload={"Parts": parts},
    )


for part in (1, 2, 3, 4):

    def part_read(t: Target, part: int = part) -> None:
        _multipart(
            t,
            "mp",
            [
                PART_BYTES,
                1000,
            ],
        )
        t.call("put single", "put_object", Key="single", Body=body_of(100))
        t.settle()
        t.call("get part", "get_object", Key="mp", PartNumber=part)
        t.call("head part", "head_object", Key="mp", PartNumber=part)
        t.call("head single part", "head_object", Key="single", PartNumber=part)
        t.call("get single part", "get_object", Key="single", PartNumber=part)

    add(f"range.part_number_{part}", part_read)


# ---- listings ------------------------------------------------------------------------------------------
LIST_KEYS = ["a", "a/b", "a/b/c", "a/c", "b", "b/x y", "c%d", "d/", "e&f", "z"]


def _put_keys(t: Target, half_settled: bool) -> None:
    for n, key in enumerate(LIST_KEYS):
        # A key ending in "/" is written empty, as folder markers are (SeaweedFS keeps no bytes under such a
        # key: object.key_4 shows that on its own).
        t.call(f"put {key}", "put_object", Key=key, Body=b"" if key.endswith("/") else body_of(n + 1))
        if half_settled and n == len(LIST_KEYS) // 2:
            t.drain()  # the first half on the store, the rest (on a spooling gateway) still in the spool
    t.settle()


LIST_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "prefix": {"Prefix": "a/"},
    "prefix_none": {"Prefix": "nope"},
    "delimiter": {"Delimiter": "/"},
    "prefix_delimiter": {"Prefix": "a/", "Delimiter": "/"},
    "max1": {"MaxKeys": 1},
    "max2_delim": {"MaxKeys": 2, "Delimiter": "/"},
    "max0": {"MaxKeys": 0},
    "url": {"EncodingType": "url"},
    "url_delim": {"EncodingType": "url", "Delimiter": "/"},
    "odd_delimiter": {"Delimiter": "b"},
}
V2_ONLY: dict[str, dict[str, Any]] = {
    "start_after": {"StartAfter": "a/b"},
    "start_after_prefix": {"StartAfter": "a/b", "Prefix": "a/"},
    "fetch_owner": {"FetchOwner": True},
    "fetch_owner_false": {"FetchOwner": False},
    "empty_token": {"ContinuationToken": ""},
}
V1_ONLY: dict[str, dict[str, Any]] = {
    "marker": {"Marker": "a/b"},
    "marker_delim": {"Marker": "a", "Delimiter": "/"},
    "marker_past_end": {"Marker": "zz"},
}
for (case, params), half in itertools.product({**LIST_CASES, **V2_ONLY, **V1_ONLY}.items(), (False, True)):
    ops = (
        ["list_objects_v2"]
        if case in V2_ONLY
        else ["list_objects"]
        if case in V1_ONLY
        else ["list_objects_v2", "list_objects"]
    )

    def listing(t: Target, params: dict[str, Any] = params, half: bool = half, ops: list[str] = ops) -> None:
        _put_keys(t, half)
        for op in ops:
            t.call(op, op, **params)

    add(
        f"list.{case}{'_mixed' if half else ''}",
        listing,
    )

for page, half in itertools.product((1, 2, 3), (False, True)):

    def paginate(t: Target, page: int = page, half: bool = half) -> None:
        _put_keys(t, half)
        token: str | None = None
        for n in range(20):
            params: dict[str, Any] = {"MaxKeys": page}
            if token:
                params["ContinuationToken"] = token
            resp = t.call(f"page {n}", "list_objects_v2", **params)
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated"):
                break
        marker: str | None = None
        for n in range(20):
            params = {"MaxKeys": page, "Delimiter": "/"}
            if marker:
                params["Marker"] = marker
            resp = t.call(f"v1 page {n}", "list_objects", **params)
            if not resp.get("IsTruncated"):
                break
            marker = resp.get("NextMarker") or (resp.get("Contents") or [{}])[-1].get("Key")

    add(f"list.paginate_{page}{'_mixed' if half else ''}", paginate)


@scenario()
def list__overwritten_and_deleted(t: Target) -> None:
    t.call("put a", "put_object", Key="a", Body=b"1")
    t.call("put b", "put_object", Key="b", Body=b"22")
    t.drain()
    t.call("overwrite a", "put_object", Key="a", Body=b"333")
    t.call("delete b", "delete_object", Key="b")
    t.call("put c", "put_object", Key="c", Body=b"4444")
    t.settle()
    t.call("list", "list_objects_v2")
    t.call("list v1", "list_objects")
    t.call("versions", "list_object_versions")


# ---- versions, DeleteObjects, DeleteBucket -------------------------------------------------------------
for settled, count in itertools.product((False, True), (1, 5)):

    def empty_bucket(t: Target, settled: bool = settled, count: int = count) -> None:
        for i in range(count):
            t.call(f"put {i}", "put_object", Key=f"k{i}", Body=body_of(10 + i))
        if settled:
            t.settle()
        versions = t.call("list versions", "list_object_versions")
        objects = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in versions.get("Versions", [])]
        objects += [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in versions.get("DeleteMarkers", [])]
        if objects:
            t.call("delete objects", "delete_objects", Delete={"Objects": objects})
        t.call("list after", "list_objects_v2")
        t.call("delete bucket", "delete_bucket")
        t.call("head bucket", "head_bucket")

    add(f"versions.empty_bucket_{count}{'_settled' if settled else ''}", empty_bucket)

for settled in (False, True):

    def delete_each_then_bucket(t: Target, settled: bool = settled) -> None:
        for i in range(3):
            t.call(f"put {i}", "put_object", Key=f"k{i}", Body=b"x")
        if settled:
            t.settle()
        for i in range(3):
            t.call(f"delete {i}", "delete_object", Key=f"k{i}")
        t.call("delete bucket", "delete_bucket")

    def delete_objects_quiet(t: Target, settled: bool = settled) -> None:
        for i in range(3):
            t.call(f"put {i}", "put_object", Key=f"k{i}", Body=b"x")
        if settled:
            t.settle()
        objects = [{"Key": f"k{i}"} for i in range(4)]
        t.call("delete objects", "delete_objects", Delete={"Objects": objects, "Quiet": False})
        t.call("delete objects quiet", "delete_objects", Delete={"Objects": objects, "Quiet": True})
        t.call("list", "list_objects_v2")
        t.call("delete bucket", "delete_bucket")

    tag = "_settled" if settled else ""
    add(f"versions.delete_each_then_bucket{tag}", delete_each_then_bucket)
    add(f"versions.delete_objects{tag}", delete_objects_quiet)


@scenario()
def versions__list_params(t: Target) -> None:
    _put_keys(t, False)
    t.call("versions prefix", "list_object_versions", Prefix="a/")
    t.call("versions delim", "list_object_versions", Delimiter="/")
    t.call("versions max", "list_object_versions", MaxKeys=2)
    t.call("versions key marker", "list_object_versions", KeyMarker="b")


# ---- multipart -----------------------------------------------------------------------------------------
@scenario()
def multipart__basic(t: Target) -> None:
    _multipart(t, "mp", [PART_BYTES, 1234])
    t.settle()
    t.call("head", "head_object", Key="mp")
    t.call("get", "get_object", Key="mp")
    t.call("list", "list_objects_v2")


@scenario()
def multipart__repeated_complete(t: Target) -> None:
    up = t.call("create", "create_multipart_upload", Key="mp")
    p = t.call("part", "upload_part", Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=b"only part")
    doc = {"Parts": [{"PartNumber": 1, "ETag": p.get("ETag", "")}]}
    t.call("complete", "complete_multipart_upload", Key="mp", UploadId=up["UploadId"], MultipartUpload=doc)
    t.call(
        "complete again", "complete_multipart_upload", Key="mp", UploadId=up["UploadId"], MultipartUpload=doc
    )
    t.settle()
    t.call(
        "complete after settle",
        "complete_multipart_upload",
        Key="mp",
        UploadId=up["UploadId"],
        MultipartUpload=doc,
    )
    t.call("get", "get_object", Key="mp")


@scenario()
def multipart__list_parts_and_uploads(t: Target) -> None:
    a = t.call("create a", "create_multipart_upload", Key="a")
    b = t.call("create b", "create_multipart_upload", Key="b/c", ContentType="x/y")
    for i, size in enumerate((PART_BYTES, 10), start=1):
        t.call(
            f"part {i}", "upload_part", Key="a", UploadId=a["UploadId"], PartNumber=i, Body=body_of(size, i)
        )
    t.call("list parts", "list_parts", Key="a", UploadId=a["UploadId"])
    t.call("list parts max", "list_parts", Key="a", UploadId=a["UploadId"], MaxParts=1)
    t.call("list parts marker", "list_parts", Key="a", UploadId=a["UploadId"], PartNumberMarker=1)
    t.call("list uploads", "list_multipart_uploads")
    t.call("list uploads prefix", "list_multipart_uploads", Prefix="b/")
    t.call("list uploads delim", "list_multipart_uploads", Delimiter="/")
    t.call("abort b", "abort_multipart_upload", Key="b/c", UploadId=b["UploadId"])
    t.call("list uploads after abort", "list_multipart_uploads")
    t.call("list parts aborted", "list_parts", Key="b/c", UploadId=b["UploadId"])
    t.call("abort a", "abort_multipart_upload", Key="a", UploadId=a["UploadId"])
    t.call("abort again", "abort_multipart_upload", Key="a", UploadId=a["UploadId"])
    t.call("list uploads empty", "list_multipart_uploads")


@scenario()
def multipart__uploads_after_complete(t: Target) -> None:
    _multipart(t, "done", [PART_BYTES, 1])
    t.call("list uploads", "list_multipart_uploads")
    t.settle()
    t.call("list uploads settled", "list_multipart_uploads")


MP_ERRORS: dict[str, Callable[[Target, str, list[dict[str, Any]]], None]] = {}


def _mp_error(name: str) -> Callable[[Callable[[Target, str, list[dict[str, Any]]], None]], None]:
    def deco(fn: Callable[[Target, str, list[dict[str, Any]]], None]) -> None:
        def run(t: Target) -> None:
            up = t.call("create", "create_multipart_upload", Key="mp")
            parts = []
            for i, size in enumerate((PART_BYTES, 100), start=1):
                p = t.call(
                    f"part {i}",
                    "upload_part",
                    Key="mp",
                    UploadId=up["UploadId"],
                    PartNumber=i,
                    Body=body_of(size, i),
                )
                parts.append({"PartNumber": i, "ETag": p.get("ETag", "")})
            fn(t, up["UploadId"], parts)
            t.settle()
            t.call("get after", "get_object", Key="mp")

        add(f"multipart.{name}", run)

    return deco


def _complete(
    t: Target, label: str, upload_id: str, parts: list[dict[str, Any]], **kw: Any
) -> dict[str, Any]:
    return t.call(
        label,
        "complete_multipart_upload",
        Key="mp",
        UploadId=upload_id,
        MultipartUpload={"Parts": parts},
        **kw,
    )


@_mp_error("wrong_etag")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    _complete(
        t, "complete wrong etag", upload_id, [parts[0], {"PartNumber": 2, "ETag": '"' + "0" * 32 + '"'}]
    )
    _complete(t, "complete", upload_id, parts)


@_mp_error("out_of_order")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    _complete(t, "complete reversed", upload_id, list(reversed(parts)))
    _complete(t, "complete", upload_id, parts)


@_mp_error("missing_part")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    _complete(t, "complete missing", upload_id, [*parts, {"PartNumber": 3, "ETag": parts[0]["ETag"]}])


@_mp_error("subset")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    _complete(t, "complete first only", upload_id, parts[:1])


@_mp_error("no_parts")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    _complete(t, "complete empty", upload_id, [])


@_mp_error("after_abort")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    t.call("abort", "abort_multipart_upload", Key="mp", UploadId=upload_id)
    _complete(t, "complete", upload_id, parts)
    t.call("part after abort", "upload_part", Key="mp", UploadId=upload_id, PartNumber=3, Body=b"late")


@_mp_error("wrong_key")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    t.call(
        "complete other key",
        "complete_multipart_upload",
        Key="other",
        UploadId=upload_id,
        MultipartUpload={"Parts": parts},
    )
    _complete(t, "complete", upload_id, parts)


@_mp_error("reupload_part")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    p = t.call("part 2 again", "upload_part", Key="mp", UploadId=upload_id, PartNumber=2, Body=b"replacement")
    _complete(t, "complete with old etag", upload_id, parts)
    _complete(
        t, "complete with new etag", upload_id, [parts[0], {"PartNumber": 2, "ETag": p.get("ETag", "")}]
    )


@_mp_error("small_part")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    p = t.call("part 3", "upload_part", Key="mp", UploadId=upload_id, PartNumber=3, Body=b"tail")
    _complete(t, "complete small middle", upload_id, [*parts, {"PartNumber": 3, "ETag": p.get("ETag", "")}])


@_mp_error("bad_upload_id")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    t.call("part bad id", "upload_part", Key="mp", UploadId="not-an-upload", PartNumber=1, Body=b"x")
    t.call(
        "complete bad id",
        "complete_multipart_upload",
        Key="mp",
        UploadId="not-an-upload",
        MultipartUpload={"Parts": parts},
    )
    t.call("abort bad id", "abort_multipart_upload", Key="mp", UploadId="not-an-upload")
    t.call("list parts bad id", "list_parts", Key="mp", UploadId="not-an-upload")
    _complete(t, "complete", upload_id, parts)


@_mp_error("part_number_range")
def _(t: Target, upload_id: str, parts: list[dict[str, Any]]) -> None:
    t.call("part 0", "upload_part", Key="mp", UploadId=upload_id, PartNumber=0, Body=b"x")
    t.call("part 10001", "upload_part", Key="mp", UploadId=upload_id, PartNumber=10001, Body=b"x")
    _complete(t, "complete", upload_id, parts)


class _SlowBody(io.BytesIO):
    """A request body read out slowly (about 1 ms per 8 KiB block): an upload that is still running."""

    def __init__(self, data: bytes, started: threading.Event) -> None:
        super().__init__(data)
        self._started = started

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return super().read()
        chunk = super().read(min(size, 8192))
        if chunk:
            self._started.set()
            time.sleep(0.003)
        return chunk


@scenario()
def multipart__concurrent_part_reupload(t: Target) -> None:
    """The same part number uploaded twice at once: Complete with the ETag of the upload that finished first,
    then with the other one."""
    up = t.call("create", "create_multipart_upload", Key="mp")
    bodies = {"slow": body_of(3 * MIB, 7), "fast": b"fast part"}
    etags: dict[str, str] = {}
    order: list[str] = []
    lock = threading.Lock()
    slow_started = threading.Event()

    def upload(name: str) -> None:
        body: Any = bodies[name]
        if name == "slow":  # sent over about a second, so that the other one starts and ends meanwhile
            body = _SlowBody(body, slow_started)
        resp = t.s3.upload_part(Bucket=t.bucket, Key="mp", UploadId=up["UploadId"], PartNumber=1, Body=body)
        with lock:
            etags[name] = resp["ETag"]
            order.append(name)

    threads = [threading.Thread(target=upload, args=(n,)) for n in bodies]
    threads[0].start()
    slow_started.wait(10)
    threads[1].start()
    for th in threads:
        th.join()
    t.note("the small upload ended first", order[0])
    first = order[0]
    t.note("etags differ", etags["slow"] != etags["fast"])
    t.call(
        "complete first finished",
        "complete_multipart_upload",
        Key="mp",
        UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etags[first]}]},
    )
    t.settle()
    t.call("get", "get_object", Key="mp")


# ---- conditional requests ------------------------------------------------------------------------------
def _cond_value(t: Target, kind: str, match: bool, etag: str) -> Any:
    if kind in ("IfMatch", "CopySourceIfMatch"):
        return etag if match else '"' + "f" * 32 + '"'
    if kind in ("IfNoneMatch", "CopySourceIfNoneMatch"):
        return etag if match else '"' + "f" * 32 + '"'
    if kind in ("IfModifiedSince", "CopySourceIfModifiedSince"):
        return PAST if match else FUTURE
    return FUTURE if match else PAST  # IfUnmodifiedSince: "match" = the condition holds


READ_CONDITIONS = ("IfMatch", "IfNoneMatch", "IfModifiedSince", "IfUnmodifiedSince")
for (kind, match), settled in itertools.product(
    itertools.product(READ_CONDITIONS, (True, False)), (False, True)
):

    def conditional_read(t: Target, kind: str = kind, match: bool = match, settled: bool = settled) -> None:
        put = t.call("put", "put_object", Key="c", Body=b"conditional")
        if settled:
            t.settle()
        value = _cond_value(t, kind, match, put.get("ETag", ""))
        t.call("get", "get_object", Key="c", **{kind: value})
        t.call("head", "head_object", Key="c", **{kind: value})
        t.call("get missing", "get_object", Key="missing", **{kind: value})

    add(
        f"cond.read_{kind}_{'match' if match else 'mismatch'}{'_settled' if settled else ''}",
        conditional_read,
    )


@scenario()
def cond__read_combinations(t: Target) -> None:
    put = t.call("put", "put_object", Key="c", Body=b"combo")
    etag = put.get("ETag", "")
    t.call("match + unmodified past", "get_object", Key="c", IfMatch=etag, IfUnmodifiedSince=PAST)
    t.call(
        "none-match other + modified future",
        "get_object",
        Key="c",
        IfNoneMatch='"ab"',
        IfModifiedSince=FUTURE,
    )
    t.call("none-match star", "get_object", Key="c", IfNoneMatch="*")
    t.call("match star", "head_object", Key="c", IfMatch="*")
    t.call("match list", "head_object", Key="c", IfMatch=f'"x", {etag}')


WRITE_CONDITIONS = {
    "none_match_star_absent": ("IfNoneMatch", "*", False),
    "none_match_star_present": ("IfNoneMatch", "*", True),
    "match_right": ("IfMatch", "<etag>", True),
    "match_wrong": ("IfMatch", '"' + "e" * 32 + '"', True),
    "match_absent": ("IfMatch", '"' + "e" * 32 + '"', False),
}
for (case, (kind, value, exists)), (op, settled) in itertools.product(
    WRITE_CONDITIONS.items(), itertools.product(("put", "complete"), (False, True))
):

    def conditional_write(
        t: Target,
        kind: str = kind,
        value: str = value,
        exists: bool = exists,
        op: str = op,
        settled: bool = settled,
    ) -> None:
        etag = ""
        if exists:
            etag = t.call("put existing", "put_object", Key="w", Body=b"existing").get("ETag", "")
            if settled:
                t.settle()
        cond = {kind: etag if value == "<etag>" else value}
        if op == "put":
            t.call("conditional put", "put_object", Key="w", Body=b"new body", **cond)
        else:
            up = t.call("create", "create_multipart_upload", Key="w")
            p = t.call(
                "part", "upload_part", Key="w", UploadId=up["UploadId"], PartNumber=1, Body=b"new mp body"
            )
            parts = {"Parts": [{"PartNumber": 1, "ETag": p.get("ETag", "")}]}
            t.call(
                "conditional complete",
                "complete_multipart_upload",
                Key="w",
                UploadId=up["UploadId"],
                MultipartUpload=parts,
                **cond,
            )
        t.settle()
        t.call("get", "get_object", Key="w")

    add(
        f"cond.{op}_{case}{'_settled' if settled else ''}",
        conditional_write,
    )


# ---- copies --------------------------------------------------------------------------------------------
COPY_CONDITIONS = (
    "CopySourceIfMatch",
    "CopySourceIfNoneMatch",
    "CopySourceIfModifiedSince",
    "CopySourceIfUnmodifiedSince",
)
for (kind, match), settled in itertools.product(
    itertools.product(COPY_CONDITIONS, (True, False)), (False, True)
):

    def copy_cond(t: Target, kind: str = kind, match: bool = match, settled: bool = settled) -> None:
        put = t.call("put source", "put_object", Key="src", Body=b"copy source", Metadata={"s": "1"})
        if settled:
            t.settle()
        value = _cond_value(t, kind, match, put.get("ETag", ""))
        src = {"Bucket": t.bucket, "Key": "src"}
        t.call("copy", "copy_object", Key="dst", CopySource=src, **{kind: value})
        up = t.call("create", "create_multipart_upload", Key="dst2")
        t.call(
            "part copy",
            "upload_part_copy",
            Key="dst2",
            UploadId=up["UploadId"],
            PartNumber=1,
            CopySource=src,
            **{kind: value},
        )
        t.call("abort", "abort_multipart_upload", Key="dst2", UploadId=up["UploadId"])
        t.settle()
        t.call("get copy", "get_object", Key="dst")

    add(
        f"copy.{kind}_{'match' if match else 'mismatch'}{'_settled' if settled else ''}",
        copy_cond,
    )

COPY_RANGES = [
    "bytes=0-99",
    "bytes=0-999",
    "bytes=500-1500",
    "bytes=1000-1000",
    "bytes=999-999",
    "bytes=10-5",
    "bytes=-10",
    "bytes=5-",
]
for (n, rng), settled in itertools.product(enumerate(COPY_RANGES), (False, True)):

    def copy_range(t: Target, rng: str = rng, settled: bool = settled) -> None:
        t.call("put source", "put_object", Key="src", Body=body_of(1000))
        if settled:
            t.settle()
        up = t.call("create", "create_multipart_upload", Key="dst")
        part = t.call(
            "part copy",
            "upload_part_copy",
            Key="dst",
            UploadId=up["UploadId"],
            PartNumber=1,
            CopySource={"Bucket": t.bucket, "Key": "src"},
            CopySourceRange=rng,
        )
        etag = part.get("CopyPartResult", {}).get("ETag")
        if etag:
            t.call(
                "complete",
                "complete_multipart_upload",
                Key="dst",
                UploadId=up["UploadId"],
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
            )
            t.settle()
            t.call("get", "get_object", Key="dst")
        else:
            t.call("abort", "abort_multipart_upload", Key="dst", UploadId=up["UploadId"])

    add(
        f"copy.range_{n}{'_settled' if settled else ''}",
        copy_range,
    )

COPY_CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "replace_meta": {"MetadataDirective": "REPLACE", "Metadata": {"new": "v"}, "ContentType": "x/new"},
    "copy_meta_with_meta": {"MetadataDirective": "COPY", "Metadata": {"ignored": "v"}},
    "content_headers": {
        "MetadataDirective": "REPLACE",
        "CacheControl": "no-cache",
        "ContentDisposition": "inline",
    },
}
for (case, params), settled in itertools.product(COPY_CASES.items(), (False, True)):

    def copy_object(t: Target, params: dict[str, Any] = params, settled: bool = settled) -> None:
        t.call(
            "put source",
            "put_object",
            Key="src",
            Body=b"source",
            Metadata={"orig": "1"},
            ContentType="x/orig",
        )
        if settled:
            t.settle()
        t.call("copy", "copy_object", Key="dst", CopySource={"Bucket": t.bucket, "Key": "src"}, **params)
        t.settle()
        t.call("head", "head_object", Key="dst")
        t.call("get", "get_object", Key="dst")

    add(
        f"copy.object_{case}{'_settled' if settled else ''}",
        copy_object,
    )


@scenario()
def copy__errors(t: Target) -> None:
    t.call("put", "put_object", Key="src", Body=b"s")
    t.call("copy missing", "copy_object", Key="d", CopySource={"Bucket": t.bucket, "Key": "missing"})
    t.call("copy onto itself", "copy_object", Key="src", CopySource={"Bucket": t.bucket, "Key": "src"})
    t.call(
        "copy onto itself replace",
        "copy_object",
        Key="src",
        CopySource={"Bucket": t.bucket, "Key": "src"},
        MetadataDirective="REPLACE",
        Metadata={"a": "b"},
    )
    t.settle()
    t.call("head", "head_object", Key="src")


@scenario()
def copy__multipart_source(t: Target) -> None:
    _multipart(t, "src", [PART_BYTES, 10])
    t.call("copy", "copy_object", Key="dst", CopySource={"Bucket": t.bucket, "Key": "src"})
    t.settle()
    t.call("head", "head_object", Key="dst")


# ---- checksums -----------------------------------------------------------------------------------------
ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
for algo, mode in itertools.product(ALGORITHMS, ("single", "multipart_composite", "multipart_full")):
    if mode == "multipart_full" and algo in ("SHA1", "SHA256"):
        continue  # S3: full-object multipart checksums are CRCs only

    def checksum(t: Target, algo: str = algo, mode: str = mode) -> None:
        if mode == "single":
            t.call("put", "put_object", Key="c", Body=body_of(3000), ChecksumAlgorithm=algo)
        else:
            kind = "COMPOSITE" if mode == "multipart_composite" else "FULL_OBJECT"
            up = t.call(
                "create", "create_multipart_upload", Key="c", ChecksumAlgorithm=algo, ChecksumType=kind
            )
            parts = []
            for i, size in enumerate((PART_BYTES, 100), start=1):
                p = t.call(
                    f"part {i}",
                    "upload_part",
                    Key="c",
                    UploadId=up["UploadId"],
                    PartNumber=i,
                    Body=body_of(size, i),
                    ChecksumAlgorithm=algo,
                )
                parts.append(
                    {
                        "PartNumber": i,
                        "ETag": p.get("ETag", ""),
                        f"Checksum{algo}": p.get(f"Checksum{algo}", ""),
                    }
                )
            t.call("list parts", "list_parts", Key="c", UploadId=up["UploadId"])
            t.call(
                "complete",
                "complete_multipart_upload",
                Key="c",
                UploadId=up["UploadId"],
                MultipartUpload={"Parts": parts},
            )
        t.settle()
        t.call("head", "head_object", Key="c", ChecksumMode="ENABLED")
        t.call("get", "get_object", Key="c", ChecksumMode="ENABLED")
        t.call("head plain", "head_object", Key="c")
        t.call(
            "attributes",
            "get_object_attributes",
            Key="c",
            ObjectAttributes=["ETag", "Checksum", "ObjectParts", "ObjectSize"],
        )

    add(f"checksum.{algo}_{mode}", checksum)


def _crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


BAD_CHECKSUMS: dict[str, dict[str, str]] = {
    "crc32_wrong": {"x-amz-checksum-crc32": _crc32(b"something else")},
    "crc32_malformed": {"x-amz-checksum-crc32": "not base64!"},
    "crc32_short": {"x-amz-checksum-crc32": "AAAA"},
    "sha256_wrong": {"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(b"x").digest()).decode()},
    "sha1_malformed": {"x-amz-checksum-sha1": "%%%"},
    "md5_wrong": {"Content-MD5": base64.b64encode(hashlib.md5(b"x").digest()).decode()},
    "md5_malformed": {"Content-MD5": "zzz"},
    "two_algorithms": {
        "x-amz-checksum-crc32": _crc32(b"payload!"),
        "x-amz-checksum-sha1": base64.b64encode(hashlib.sha1(b"payload!").digest()).decode(),
    },
    "crc32_right": {"x-amz-checksum-crc32": _crc32(b"payload!")},
    "algorithm_without_value": {"x-amz-sdk-checksum-algorithm": "CRC32"},
}
for case, headers in BAD_CHECKSUMS.items():

    def bad_checksum(t: Target, headers: dict[str, str] = headers) -> None:
        t.raw("put", "PUT", "k", headers=headers, body=b"payload!")
        t.settle()
        t.call("head", "head_object", Key="k", ChecksumMode="ENABLED")

    add(f"checksum.raw_{case}", bad_checksum)

for case in ("composite_right", "full_right", "wrong", "malformed"):

    def complete_checksum(t: Target, case: str = case) -> None:
        kind = "FULL_OBJECT" if case == "full_right" else "COMPOSITE"
        up = t.call(
            "create", "create_multipart_upload", Key="c", ChecksumAlgorithm="CRC32", ChecksumType=kind
        )
        data = [body_of(PART_BYTES, 1), b"tail"]
        parts = []
        for i, body in enumerate(data, start=1):
            p = t.call(
                f"part {i}",
                "upload_part",
                Key="c",
                UploadId=up["UploadId"],
                PartNumber=i,
                Body=body,
                ChecksumAlgorithm="CRC32",
            )
            parts.append(
                {"PartNumber": i, "ETag": p.get("ETag", ""), "ChecksumCRC32": p.get("ChecksumCRC32", "")}
            )
        if case == "composite_right":
            crcs = b"".join(base64.b64decode(p["ChecksumCRC32"] or "AAAAAA==") for p in parts)
            value = _crc32(crcs) + "-2"
        elif case == "full_right":
            value = _crc32(b"".join(data))
        elif case == "wrong":
            value = _crc32(b"wrong")
        else:
            value = "@@"
        t.call(
            "complete",
            "complete_multipart_upload",
            Key="c",
            UploadId=up["UploadId"],
            MultipartUpload={"Parts": parts},
            ChecksumCRC32=value,
            ChecksumType=kind,
        )
        t.settle()
        t.call("head", "head_object", Key="c", ChecksumMode="ENABLED")

    add(f"checksum.complete_{case}", complete_checksum)


# ---- raw transfers -------------------------------------------------------------------------------------
@scenario()
def raw__chunked_without_length(t: Target) -> None:
    data = body_of(100_000, 3)
    t.raw(
        "put chunked",
        "PUT",
        "k",
        headers={"Transfer-Encoding": "chunked"},
        body=s3raw.te_chunked(data),
        payload_hash=s3raw.UNSIGNED_PAYLOAD,
        content_length=False,
    )
    t.settle()
    t.call("get", "get_object", Key="k")


@scenario()
def raw__aws_chunked_trailer(t: Target) -> None:
    data = body_of(70_000, 4)
    framed = s3raw.aws_chunked(data, trailers=[("x-amz-checksum-crc32", _crc32(data))])
    t.raw(
        "put aws-chunked",
        "PUT",
        "k",
        headers=s3raw.aws_chunked_headers(len(data)),
        body=framed,
        payload_hash=s3raw.STREAMING_UNSIGNED_TRAILER,
    )
    t.settle()
    t.call("head", "head_object", Key="k", ChecksumMode="ENABLED")
    t.call("get", "get_object", Key="k")


@scenario()
def raw__errors_carry_request_ids(t: Target) -> None:
    t.raw("get missing", "GET", "missing")
    t.raw("get missing bucket", "GET", "k", bucket=t.bucket + "-absent")
    t.raw("bad range", "GET", "missing", headers={"Range": "bytes=9-1"})
    t.raw("bad query", "GET", query={"list-type": "2", "max-keys": "-1"})
    t.raw("bad upload id", "POST", "k", query={"uploadId": "nope"}, body=b"<CompleteMultipartUpload/>")
    t.raw("list versions", "GET", query="versions")


# ---- dates ---------------------------------------------------------------------------------------------
@scenario()
def dates__last_modified_before_and_after_drain(t: Target) -> None:
    t.call("put", "put_object", Key="k", Body=b"dated")
    before = t.s3.head_object(Bucket=t.bucket, Key="k")["LastModified"]
    listed = t.s3.list_objects_v2(Bucket=t.bucket)["Contents"][0]["LastModified"]
    t.note("listing agrees with HEAD", listed.replace(microsecond=0) == before.replace(microsecond=0))
    time.sleep(1.1)
    t.drain()
    after = t.s3.head_object(Bucket=t.bucket, Key="k")["LastModified"]
    t.note("Last-Modified unchanged by the drain", after == before)
    t.call("get if-unmodified-since before", "get_object", Key="k", IfUnmodifiedSince=before)
    t.call("get if-modified-since before", "get_object", Key="k", IfModifiedSince=before)


@scenario()
def dates__overwrite_moves_last_modified(t: Target) -> None:
    t.call("put", "put_object", Key="k", Body=b"one")
    first = t.s3.head_object(Bucket=t.bucket, Key="k")["LastModified"]
    time.sleep(1.1)
    t.call("put again", "put_object", Key="k", Body=b"two")
    t.settle()
    second = t.s3.head_object(Bucket=t.bucket, Key="k")["LastModified"]
    t.note("later", second > first)


# ---- the same reads once the object is on the store ----------------------------------------------------
def _drained_variant(scn: Scenario) -> Callable[[Target], None]:
    def run(t: Target) -> None:
        t.settle_hook = (
            t.drain_hook
        )  # every settle() puts the scenario's writes on the store, on every target
        scn.run(t)

    return run


for _scn in [
    s
    for s in SCENARIOS.values()
    if s.name.startswith(("range.r", "metadata.", "object.key_", "cond.read_I", "content.response_"))
    or (s.group == "content" and "multipart" not in s.name and "response" not in s.name)
]:
    add(f"{_scn.name}_drained", _drained_variant(_scn))


# The subset the normal test suite runs (about a minute on two cores): one or two of every family, picked
# where the spool and the store are most likely to part.
FAST = frozenset(
    {
        "object.put_get_262145",
        "object.overwrite_spooled",
        "object.delete_spooled",
        "object.missing",
        "object.key_0",
        "metadata.empty_value",
        "content.encoding_list",
        "content.default_type",
        "content.response_all",
        "range.r2",
        "range.r7",
        "range.part_number_2",
        "list.delimiter_mixed",
        "list.fetch_owner",
        "list.empty_token",
        "list.marker",
        "list.paginate_2_mixed",
        "list.url",
        "versions.empty_bucket_5",
        "versions.delete_each_then_bucket",
        "multipart.basic",
        "multipart.repeated_complete",
        "multipart.list_parts_and_uploads",
        "multipart.reupload_part",
        "cond.read_IfNoneMatch_match",
        "cond.complete_none_match_star_present",
        "cond.put_match_wrong",
        "copy.CopySourceIfNoneMatch_match",
        "copy.range_2",
        "checksum.CRC32_single",
        "checksum.CRC32_multipart_composite",
        "checksum.raw_crc32_malformed",
        "raw.chunked_without_length",
        "raw.errors_carry_request_ids",
        "dates.last_modified_before_and_after_drain",
    }
)
assert set(SCENARIOS) >= FAST, FAST - set(SCENARIOS)
SCENARIOS.update({name: dataclasses.replace(scn, fast=name in FAST) for name, scn in SCENARIOS.items()})
