"""Every difference between the store and a gateway target that the conformance run accepts, in one place.

Two tables, both mirrored in docs/compatibility.md:

* :data:`DELIBERATE`: documented, justified exceptions. The gateway differs on purpose (it follows AWS where
  the store does not, ...); the entry names the behaviour the gateway shows instead, and the run checks it.
* :data:`EXPECTED_TO_DIFFER`: differences believed to be bugs, recorded as they are today **until fixed**.
  Strict: a listed scenario that no longer differs fails the run, so the entry is removed when the fix lands.
  Not strict where the difference depends on timing: on ``spool-draining`` (the drain races the scenario,
  so it may also show what ``spool-held`` or ``spool-flushed`` shows) and for concurrent uploads.

Anything else that differs fails the run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OFF, HELD, DRAINING, FLUSHED = "spool-off", "spool-held", "spool-draining", "spool-flushed"
SPOOLED = frozenset({HELD, DRAINING, FLUSHED})
ALL = frozenset({OFF}) | SPOOLED
Observations = list[dict[str, Any]]


@dataclass(frozen=True)
class Deliberate:
    """``expect`` turns the store's observations into the documented behaviour of the gateway; the gateway's
    observations must then equal them exactly. ``both``: the gateway may show either form, so ``expect``
    is applied to its observations too (used only where the gateway relays the store's form)."""

    scenarios: str  # fnmatch pattern over scenario names
    targets: frozenset[str]
    reason: str
    behaviour: str
    expect: Callable[[Observations], Observations]
    both: bool = False


@dataclass(frozen=True)
class KnownBug:
    scenarios: tuple[str, ...]  # exact names: each must still differ (strict)
    targets: frozenset[str]
    what: str
    strict: bool = True


def _quote_copy_etag(observations: Observations) -> Observations:
    out = []
    for obs in observations:
        result = obs.get("result", {})
        inner = result.get("CopyObjectResult") or result.get("CopyPartResult")
        if obs.get("op") in ("copy_object", "upload_part_copy") and inner and "ETag" in inner:
            etag = inner["ETag"]
            if not etag.startswith('"'):
                key = "CopyObjectResult" if "CopyObjectResult" in result else "CopyPartResult"
                obs = {**obs, "result": {**result, key: {**inner, "ETag": f'"{etag}"'}}}
        out.append(obs)
    return out


def _delete_bucket_waits(observations: Observations) -> Observations:
    return [
        {**obs, "blocked": "until the held drain was let run"} if obs.get("op") == "delete_bucket" else obs
        for obs in observations
    ]


DELIBERATE: tuple[Deliberate, ...] = (
    Deliberate(
        scenarios="*",
        targets=frozenset({HELD}),
        reason="Spooled objects are objects of the bucket: DeleteBucket first waits for them to reach the "
        "store (then the store answers, BucketNotEmpty or not): with the drain held it waits for the drain.",
        behaviour="DeleteBucket waits for the held drain, then answers as the store does",
        expect=_delete_bucket_waits,
    ),
    Deliberate(
        scenarios="*",
        targets=SPOOLED,
        reason="SeaweedFS writes the ETag in a CopyObjectResult without its quotes; S3 quotes it (as "
        "everywhere else). The spool answers a copy of a spooled source as S3 does and relays the store's "
        "answer for a stored source, so both forms are accepted there.",
        behaviour="CopyObjectResult/CopyPartResult ETag quoted (or as the store wrote it)",
        expect=_quote_copy_etag,
        both=True,
    ),
)

# Recorded from `make conformance` as the gateway is today: bugs to fix, not exceptions
# (docs/compatibility.md). WHY: what differs, by scenario family.
WHY = {
    "checksum.": (
        "x-amz-checksum-*: values verified but not kept by the spool (HEAD/GET with ChecksumMode, "
        "GetObjectAttributes) nor sent to the store by the drain; CreateMultipartUpload does not answer "
        "the algorithm; no composite checksum; a malformed value answers InvalidRequest (store: "
        "BadDigest); the whole-object checksum of CompleteMultipartUpload is checked as the checksum of "
        "the XML body"
    ),
    "cond.complete_": (
        "If-Match/If-None-Match on CompleteMultipartUpload of a spooled upload are not evaluated (If-"
        "None-Match: * overwrites an existing object)"
    ),
    "cond.put_": ("a conditional PUT of a spooled key waits for the drain instead of being answered"),
    "cond.read_": (
        "conditional GET/HEAD of a spooled object: Last-Modified is the ack time, so the date conditions "
        "compare against another time than after the drain"
    ),
    "content.multipart_encoding_list": ("Content-Encoding `deflate, gzip` comes back as `deflate,gzip`"),
    "content.encoding_list": ("Content-Encoding `deflate, gzip` comes back as `deflate,gzip`"),
    "content.encoding_gzip": (
        "a body sent with Content-Encoding: gzip is decoded by the gateway's HTTP server (500 "
        "InternalError and a traceback when it is not valid gzip)"
    ),
    "content.gzip_body": (
        "a body sent with Content-Encoding: gzip is decoded by the gateway's HTTP server (a valid gzip "
        "body is refused with IncompleteBody)"
    ),
    "content.": (
        "an object written without Content-Type: the spool answers binary/octet-stream (S3's default), "
        "the store its sniffed type"
    ),
    "copy.range_": (
        "UploadPartCopy of a spooled source: an out-of-range copy range is clamped instead of answering "
        "InvalidRange; the part's ETag is the MD5 of the range (store: of the whole source)"
    ),
    "copy.CopySource": ("CopyObject/UploadPartCopy ignore x-amz-copy-source-if-* for a spooled source"),
    "copy.": ("CopyObject of a spooled source differs (see the diff)"),
    "list.": (
        "merged listings: no <Owner> in ListObjects V1 or with fetch-owner, an empty continuation-token "
        "refused, encoding-type=url encodes a space as %20 (store: +)"
    ),
    "metadata.": (
        "user metadata of a spooled object (an empty value is kept by the spool, dropped by the store)"
    ),
    "multipart.repeated_complete": (
        "a repeated CompleteMultipartUpload of a spooled upload answers NoSuchUpload"
    ),
    "multipart.concurrent_part_reupload": (
        "a part uploaded twice at once: Complete with the ETag of the upload that finished first is refused"
    ),
    "multipart.reupload_part": (
        "a re-uploaded part: Complete with the replaced part's ETag is refused (store: accepted)"
    ),
    "multipart.": (
        "multipart error codes and listings of spooled uploads (ListParts MaxParts, StorageClass in "
        "ListMultipartUploads, AbortMultipartUpload twice, error codes)"
    ),
    "object.put_get_": (
        "an object written without Content-Type: the spool answers binary/octet-stream (S3's default), "
        "the store its sniffed type"
    ),
    "object.key_": (
        "keys: encoding-type=url encodes a space as %20 (store: +); a key ending in / keeps its bytes in "
        "the spool (SeaweedFS stores it as a directory and drops them)"
    ),
    "object.": ("see the diff"),
    "range.empty_": ("a 416 on an empty spooled object has no Content-Range"),
    "range.": ("HEAD with Range of a spooled object answers 206 (the store ignores Range on HEAD)"),
    "versions.": (
        "ListObjectVersions is proxied and misses undrained keys, so emptying a bucket from it leaves "
        "objects and DeleteBucket answers BucketNotEmpty"
    ),
    "dates.": ("Last-Modified moves from the ack time to the drain time"),
    "raw.errors": ("the RequestId in a relayed store error body differs from the x-amz-request-id header"),
    "raw.chunked_without_length": ("a chunked PUT without Content-Length is refused with 411"),
    "raw.aws_chunked_trailer": ("the trailing checksum of an aws-chunked PUT is not kept"),
}

EXPECTED_TO_DIFFER: tuple[KnownBug, ...] = (
    KnownBug(
        (
            "checksum.complete_composite_right",
            "checksum.complete_full_right",
            "checksum.complete_malformed",
            "checksum.raw_crc32_malformed",
            "checksum.raw_crc32_short",
            "checksum.raw_sha1_malformed",
            "checksum.raw_two_algorithms",
        ),
        frozenset({OFF}),
        WHY["checksum."],
    ),
    KnownBug(
        (
            "checksum.CRC32C_multipart_composite",
            "checksum.CRC32C_multipart_full",
            "checksum.CRC32C_single",
            "checksum.CRC32_multipart_composite",
            "checksum.CRC32_multipart_full",
            "checksum.CRC32_single",
            "checksum.CRC64NVME_multipart_composite",
            "checksum.CRC64NVME_multipart_full",
            "checksum.CRC64NVME_single",
            "checksum.SHA1_multipart_composite",
            "checksum.SHA1_single",
            "checksum.SHA256_multipart_composite",
            "checksum.SHA256_single",
            "checksum.complete_composite_right",
            "checksum.complete_full_right",
            "checksum.complete_malformed",
            "checksum.complete_wrong",
            "checksum.raw_algorithm_without_value",
            "checksum.raw_crc32_malformed",
            "checksum.raw_crc32_right",
            "checksum.raw_crc32_short",
            "checksum.raw_sha1_malformed",
            "checksum.raw_two_algorithms",
        ),
        frozenset({HELD}),
        WHY["checksum."],
    ),
    KnownBug(
        (
            "checksum.CRC32C_multipart_composite",
            "checksum.CRC32C_multipart_full",
            "checksum.CRC32C_single",
            "checksum.CRC32_multipart_composite",
            "checksum.CRC32_multipart_full",
            "checksum.CRC32_single",
            "checksum.CRC64NVME_multipart_composite",
            "checksum.CRC64NVME_multipart_full",
            "checksum.CRC64NVME_single",
            "checksum.SHA1_multipart_composite",
            "checksum.SHA1_single",
            "checksum.SHA256_multipart_composite",
            "checksum.SHA256_single",
            "checksum.complete_composite_right",
            "checksum.complete_full_right",
            "checksum.complete_malformed",
            "checksum.complete_wrong",
            "checksum.raw_algorithm_without_value",
            "checksum.raw_crc32_malformed",
            "checksum.raw_crc32_right",
            "checksum.raw_crc32_short",
            "checksum.raw_sha1_malformed",
            "checksum.raw_two_algorithms",
        ),
        frozenset({DRAINING}),
        WHY["checksum."],
        strict=False,
    ),
    KnownBug(
        (
            "checksum.CRC32C_multipart_composite",
            "checksum.CRC32C_multipart_full",
            "checksum.CRC32C_single",
            "checksum.CRC32_multipart_composite",
            "checksum.CRC32_multipart_full",
            "checksum.CRC32_single",
            "checksum.CRC64NVME_multipart_composite",
            "checksum.CRC64NVME_multipart_full",
            "checksum.CRC64NVME_single",
            "checksum.SHA1_multipart_composite",
            "checksum.SHA1_single",
            "checksum.SHA256_multipart_composite",
            "checksum.SHA256_single",
            "checksum.complete_composite_right",
            "checksum.complete_full_right",
            "checksum.complete_malformed",
            "checksum.complete_wrong",
            "checksum.raw_algorithm_without_value",
            "checksum.raw_crc32_malformed",
            "checksum.raw_crc32_right",
            "checksum.raw_crc32_short",
            "checksum.raw_sha1_malformed",
            "checksum.raw_two_algorithms",
        ),
        frozenset({FLUSHED}),
        WHY["checksum."],
    ),
    KnownBug(
        (
            "cond.complete_match_absent",
            "cond.complete_match_absent_settled",
            "cond.complete_match_wrong",
            "cond.complete_match_wrong_settled",
            "cond.complete_none_match_star_present",
            "cond.complete_none_match_star_present_settled",
        ),
        frozenset({HELD}),
        WHY["cond.complete_"],
    ),
    KnownBug(
        (
            "cond.complete_match_absent",
            "cond.complete_match_absent_settled",
            "cond.complete_match_wrong",
            "cond.complete_match_wrong_settled",
            "cond.complete_none_match_star_present",
            "cond.complete_none_match_star_present_settled",
        ),
        frozenset({DRAINING}),
        WHY["cond.complete_"],
        strict=False,
    ),
    KnownBug(
        (
            "cond.complete_match_absent",
            "cond.complete_match_absent_settled",
            "cond.complete_match_wrong",
            "cond.complete_match_wrong_settled",
            "cond.complete_none_match_star_present",
            "cond.complete_none_match_star_present_settled",
        ),
        frozenset({FLUSHED}),
        WHY["cond.complete_"],
    ),
    KnownBug(
        (
            "cond.put_match_right",
            "cond.put_match_right_settled",
            "cond.put_match_wrong",
            "cond.put_match_wrong_settled",
            "cond.put_none_match_star_present",
            "cond.put_none_match_star_present_settled",
        ),
        frozenset({HELD}),
        WHY["cond.put_"],
    ),
    KnownBug(
        (
            "content.cache_control",
            "content.default_type",
            "content.disposition",
            "content.expires",
            "content.language",
            "content.multipart_cache_control",
            "content.multipart_default_type",
            "content.multipart_disposition",
            "content.multipart_encoding_gzip",
            "content.multipart_expires",
            "content.multipart_language",
        ),
        frozenset({HELD}),
        WHY["content."],
    ),
    KnownBug(
        (
            "content.cache_control",
            "content.default_type",
            "content.disposition",
            "content.expires",
            "content.language",
            "content.multipart_cache_control",
            "content.multipart_default_type",
            "content.multipart_disposition",
            "content.multipart_encoding_gzip",
            "content.multipart_expires",
            "content.multipart_language",
        ),
        frozenset({DRAINING}),
        WHY["content."],
        strict=False,
    ),
    KnownBug(
        (
            "content.encoding_gzip",
            "content.encoding_gzip_drained",
        ),
        frozenset({OFF}),
        WHY["content.encoding_gzip"],
    ),
    KnownBug(
        (
            "content.encoding_gzip",
            "content.encoding_gzip_drained",
        ),
        frozenset({HELD}),
        WHY["content.encoding_gzip"],
    ),
    KnownBug(
        (
            "content.encoding_gzip",
            "content.encoding_gzip_drained",
        ),
        frozenset({DRAINING}),
        WHY["content.encoding_gzip"],
        strict=False,
    ),
    KnownBug(
        (
            "content.encoding_gzip",
            "content.encoding_gzip_drained",
        ),
        frozenset({FLUSHED}),
        WHY["content.encoding_gzip"],
    ),
    KnownBug(
        (
            "content.encoding_list",
            "content.encoding_list_drained",
        ),
        frozenset({OFF}),
        WHY["content.encoding_list"],
    ),
    KnownBug(
        (
            "content.encoding_list",
            "content.encoding_list_drained",
        ),
        frozenset({HELD}),
        WHY["content.encoding_list"],
    ),
    KnownBug(
        (
            "content.encoding_list",
            "content.encoding_list_drained",
        ),
        frozenset({DRAINING}),
        WHY["content.encoding_list"],
        strict=False,
    ),
    KnownBug(
        (
            "content.encoding_list",
            "content.encoding_list_drained",
        ),
        frozenset({FLUSHED}),
        WHY["content.encoding_list"],
    ),
    KnownBug(
        (
            "content.gzip_body",
            "content.gzip_body_drained",
        ),
        frozenset({OFF}),
        WHY["content.gzip_body"],
    ),
    KnownBug(
        (
            "content.gzip_body",
            "content.gzip_body_drained",
        ),
        frozenset({HELD}),
        WHY["content.gzip_body"],
    ),
    KnownBug(
        (
            "content.gzip_body",
            "content.gzip_body_drained",
        ),
        frozenset({DRAINING}),
        WHY["content.gzip_body"],
        strict=False,
    ),
    KnownBug(
        (
            "content.gzip_body",
            "content.gzip_body_drained",
        ),
        frozenset({FLUSHED}),
        WHY["content.gzip_body"],
    ),
    KnownBug(
        ("content.multipart_encoding_list",),
        frozenset({OFF}),
        WHY["content.multipart_encoding_list"],
    ),
    KnownBug(
        ("content.multipart_encoding_list",),
        frozenset({HELD}),
        WHY["content.multipart_encoding_list"],
    ),
    KnownBug(
        ("content.multipart_encoding_list",),
        frozenset({DRAINING}),
        WHY["content.multipart_encoding_list"],
        strict=False,
    ),
    KnownBug(
        ("content.multipart_encoding_list",),
        frozenset({FLUSHED}),
        WHY["content.multipart_encoding_list"],
    ),
    KnownBug(
        ("copy.multipart_source",),
        frozenset({HELD}),
        WHY["copy."],
    ),
    KnownBug(
        (
            "copy.multipart_source",
            "copy.object_content_headers",
            "copy.object_content_headers_settled",
        ),
        frozenset({DRAINING}),
        WHY["copy."],
        strict=False,
    ),
    KnownBug(
        (
            "copy.errors",
            "copy.multipart_source",
            "copy.object_content_headers",
        ),
        frozenset({FLUSHED}),
        WHY["copy."],
    ),
    KnownBug(
        (
            "copy.CopySourceIfModifiedSince_mismatch",
            "copy.CopySourceIfModifiedSince_mismatch_settled",
            "copy.CopySourceIfNoneMatch_match",
            "copy.CopySourceIfNoneMatch_match_settled",
        ),
        frozenset({HELD}),
        WHY["copy.CopySource"],
    ),
    KnownBug(
        (
            "copy.CopySourceIfModifiedSince_mismatch",
            "copy.CopySourceIfModifiedSince_mismatch_settled",
            "copy.CopySourceIfNoneMatch_match",
            "copy.CopySourceIfNoneMatch_match_settled",
        ),
        frozenset({DRAINING}),
        WHY["copy.CopySource"],
        strict=False,
    ),
    KnownBug(
        (
            "copy.CopySourceIfModifiedSince_mismatch",
            "copy.CopySourceIfNoneMatch_match",
        ),
        frozenset({FLUSHED}),
        WHY["copy.CopySource"],
    ),
    KnownBug(
        (
            "copy.range_0",
            "copy.range_0_settled",
            "copy.range_2",
            "copy.range_2_settled",
            "copy.range_4",
            "copy.range_4_settled",
            "copy.range_5",
            "copy.range_5_settled",
            "copy.range_6",
            "copy.range_6_settled",
            "copy.range_7",
            "copy.range_7_settled",
        ),
        frozenset({HELD}),
        WHY["copy.range_"],
    ),
    KnownBug(
        (
            "copy.range_0",
            "copy.range_0_settled",
            "copy.range_2",
            "copy.range_2_settled",
            "copy.range_4",
            "copy.range_4_settled",
            "copy.range_5",
            "copy.range_5_settled",
            "copy.range_6",
            "copy.range_6_settled",
            "copy.range_7",
            "copy.range_7_settled",
        ),
        frozenset({DRAINING}),
        WHY["copy.range_"],
        strict=False,
    ),
    KnownBug(
        (
            "copy.range_0",
            "copy.range_0_settled",
            "copy.range_2",
            "copy.range_2_settled",
            "copy.range_3_settled",
            "copy.range_4",
            "copy.range_4_settled",
            "copy.range_5",
            "copy.range_5_settled",
            "copy.range_6",
            "copy.range_6_settled",
            "copy.range_7",
            "copy.range_7_settled",
        ),
        frozenset({FLUSHED}),
        WHY["copy.range_"],
    ),
    KnownBug(
        ("dates.last_modified_before_and_after_drain",),
        frozenset({HELD}),
        WHY["dates."],
    ),
    KnownBug(
        (
            "list.delimiter",
            "list.delimiter_mixed",
            "list.empty_token",
            "list.empty_token_mixed",
            "list.fetch_owner",
            "list.fetch_owner_mixed",
            "list.marker",
            "list.marker_delim",
            "list.marker_delim_mixed",
            "list.marker_mixed",
            "list.max1",
            "list.max1_mixed",
            "list.max2_delim",
            "list.max2_delim_mixed",
            "list.odd_delimiter",
            "list.odd_delimiter_mixed",
            "list.overwritten_and_deleted",
            "list.paginate_1",
            "list.paginate_1_mixed",
            "list.paginate_2",
            "list.paginate_2_mixed",
            "list.paginate_3",
            "list.paginate_3_mixed",
            "list.plain",
            "list.plain_mixed",
            "list.prefix",
            "list.prefix_delimiter",
            "list.start_after",
            "list.start_after_mixed",
            "list.start_after_prefix",
            "list.url",
            "list.url_delim",
            "list.url_delim_mixed",
            "list.url_mixed",
        ),
        frozenset({HELD}),
        WHY["list."],
    ),
    KnownBug(
        (
            "list.delimiter",
            "list.empty_token",
            "list.empty_token_mixed",
            "list.fetch_owner",
            "list.fetch_owner_mixed",
            "list.marker",
            "list.marker_delim",
            "list.marker_delim_mixed",
            "list.marker_mixed",
            "list.max1",
            "list.max2_delim",
            "list.max2_delim_mixed",
            "list.odd_delimiter",
            "list.odd_delimiter_mixed",
            "list.paginate_1",
            "list.paginate_2",
            "list.paginate_3",
            "list.plain",
            "list.start_after",
            "list.start_after_mixed",
            "list.url",
            "list.url_delim",
            "list.url_mixed",
        ),
        frozenset({DRAINING}),
        WHY["list."],
        strict=False,
    ),
    KnownBug(
        ("metadata.empty_value",),
        frozenset({HELD}),
        WHY["metadata."],
    ),
    KnownBug(
        ("metadata.empty_value",),
        frozenset({DRAINING}),
        WHY["metadata."],
        strict=False,
    ),
    KnownBug(
        (
            "multipart.no_parts",
            "multipart.part_number_range",
        ),
        frozenset({OFF}),
        WHY["multipart."],
    ),
    KnownBug(
        (
            "multipart.list_parts_and_uploads",
            "multipart.missing_part",
            "multipart.no_parts",
            "multipart.part_number_range",
        ),
        frozenset({HELD}),
        WHY["multipart."],
    ),
    KnownBug(
        (
            "multipart.list_parts_and_uploads",
            "multipart.missing_part",
            "multipart.no_parts",
            "multipart.part_number_range",
            "multipart.uploads_after_complete",
        ),
        frozenset({DRAINING}),
        WHY["multipart."],
        strict=False,
    ),
    KnownBug(
        (
            "multipart.list_parts_and_uploads",
            "multipart.missing_part",
            "multipart.no_parts",
            "multipart.part_number_range",
            "multipart.uploads_after_complete",
        ),
        frozenset({FLUSHED}),
        WHY["multipart."],
    ),
    KnownBug(
        ("multipart.concurrent_part_reupload",),
        frozenset({OFF}),
        WHY["multipart.concurrent_part_reupload"],
        strict=False,
    ),
    KnownBug(
        ("multipart.concurrent_part_reupload",),
        frozenset({HELD}),
        WHY["multipart.concurrent_part_reupload"],
        strict=False,
    ),
    KnownBug(
        ("multipart.concurrent_part_reupload",),
        frozenset({DRAINING}),
        WHY["multipart.concurrent_part_reupload"],
        strict=False,
    ),
    KnownBug(
        ("multipart.concurrent_part_reupload",),
        frozenset({FLUSHED}),
        WHY["multipart.concurrent_part_reupload"],
        strict=False,
    ),
    KnownBug(
        ("multipart.repeated_complete",),
        frozenset({HELD}),
        WHY["multipart.repeated_complete"],
    ),
    KnownBug(
        ("multipart.repeated_complete",),
        frozenset({DRAINING}),
        WHY["multipart.repeated_complete"],
        strict=False,
    ),
    KnownBug(
        ("multipart.repeated_complete",),
        frozenset({FLUSHED}),
        WHY["multipart.repeated_complete"],
    ),
    KnownBug(
        ("multipart.reupload_part",),
        frozenset({HELD}),
        WHY["multipart.reupload_part"],
    ),
    KnownBug(
        ("multipart.reupload_part",),
        frozenset({DRAINING}),
        WHY["multipart.reupload_part"],
        strict=False,
    ),
    KnownBug(
        ("multipart.reupload_part",),
        frozenset({FLUSHED}),
        WHY["multipart.reupload_part"],
    ),
    KnownBug(
        (
            "object.key_0",
            "object.key_4",
            "object.key_8",
        ),
        frozenset({HELD}),
        WHY["object.key_"],
    ),
    KnownBug(
        (
            "object.key_0",
            "object.key_4",
            "object.key_8",
        ),
        frozenset({DRAINING}),
        WHY["object.key_"],
        strict=False,
    ),
    KnownBug(
        (
            "object.put_get_0",
            "object.put_get_1",
            "object.put_get_17",
            "object.put_get_262145",
            "object.put_get_3145733",
            "object.put_get_65536",
        ),
        frozenset({HELD}),
        WHY["object.put_get_"],
    ),
    KnownBug(
        (
            "object.put_get_1",
            "object.put_get_17",
            "object.put_get_262145",
            "object.put_get_3145733",
            "object.put_get_65536",
        ),
        frozenset({DRAINING}),
        WHY["object.put_get_"],
        strict=False,
    ),
    KnownBug(
        (
            "range.part_number_1",
            "range.r0",
            "range.r1",
            "range.r12",
            "range.r2",
            "range.r3",
            "range.r4",
            "range.r5",
            "range.r6",
            "range.r7",
            "range.r8",
            "range.r9",
        ),
        frozenset({HELD}),
        WHY["range."],
    ),
    KnownBug(
        (
            "range.part_number_1",
            "range.r0",
            "range.r1",
            "range.r12",
            "range.r2",
            "range.r3",
            "range.r4",
            "range.r5",
            "range.r6",
            "range.r7",
            "range.r8",
            "range.r9",
        ),
        frozenset({DRAINING}),
        WHY["range."],
        strict=False,
    ),
    KnownBug(
        (
            "range.empty_0",
            "range.empty_1",
            "range.empty_2",
            "range.empty_3",
        ),
        frozenset({HELD}),
        WHY["range.empty_"],
    ),
    KnownBug(
        (
            "range.empty_0",
            "range.empty_1",
            "range.empty_2",
        ),
        frozenset({DRAINING}),
        WHY["range.empty_"],
        strict=False,
    ),
    KnownBug(
        ("raw.aws_chunked_trailer",),
        frozenset({OFF}),
        WHY["raw.aws_chunked_trailer"],
    ),
    KnownBug(
        ("raw.aws_chunked_trailer",),
        frozenset({HELD}),
        WHY["raw.aws_chunked_trailer"],
    ),
    KnownBug(
        ("raw.aws_chunked_trailer",),
        frozenset({DRAINING}),
        WHY["raw.aws_chunked_trailer"],
        strict=False,
    ),
    KnownBug(
        ("raw.aws_chunked_trailer",),
        frozenset({FLUSHED}),
        WHY["raw.aws_chunked_trailer"],
    ),
    KnownBug(
        ("raw.chunked_without_length",),
        frozenset({OFF}),
        WHY["raw.chunked_without_length"],
    ),
    KnownBug(
        ("raw.chunked_without_length",),
        frozenset({HELD}),
        WHY["raw.chunked_without_length"],
    ),
    KnownBug(
        ("raw.chunked_without_length",),
        frozenset({DRAINING}),
        WHY["raw.chunked_without_length"],
        strict=False,
    ),
    KnownBug(
        ("raw.chunked_without_length",),
        frozenset({FLUSHED}),
        WHY["raw.chunked_without_length"],
    ),
    KnownBug(
        ("raw.errors_carry_request_ids",),
        frozenset({OFF}),
        WHY["raw.errors"],
    ),
    KnownBug(
        ("raw.errors_carry_request_ids",),
        frozenset({HELD}),
        WHY["raw.errors"],
    ),
    KnownBug(
        ("raw.errors_carry_request_ids",),
        frozenset({DRAINING}),
        WHY["raw.errors"],
        strict=False,
    ),
    KnownBug(
        ("raw.errors_carry_request_ids",),
        frozenset({FLUSHED}),
        WHY["raw.errors"],
    ),
    KnownBug(
        (
            "versions.empty_bucket_1",
            "versions.empty_bucket_1_settled",
            "versions.empty_bucket_5",
            "versions.empty_bucket_5_settled",
            "versions.list_params",
        ),
        frozenset({HELD}),
        WHY["versions."],
    ),
    KnownBug(
        (
            "versions.empty_bucket_1",
            "versions.empty_bucket_1_settled",
            "versions.empty_bucket_5",
            "versions.empty_bucket_5_settled",
            "versions.list_params",
        ),
        frozenset({DRAINING}),
        WHY["versions."],
        strict=False,
    ),
    KnownBug(
        (
            "versions.empty_bucket_1",
            "versions.empty_bucket_5",
        ),
        frozenset({FLUSHED}),
        WHY["versions."],
    ),
)


def deliberate_for(scenario: str, target: str) -> list[Deliberate]:
    return [d for d in DELIBERATE if target in d.targets and fnmatch.fnmatchcase(scenario, d.scenarios)]


def known_bugs_for(scenario: str, target: str) -> list[KnownBug]:
    """The listed bugs of a scenario on a target. While the drain runs, a read may find the object in the
    spool or on the store, so ``spool-draining`` may also show, not strictly, what ``spool-held`` or
    ``spool-flushed`` shows."""
    own = [b for b in EXPECTED_TO_DIFFER if target in b.targets and scenario in b.scenarios]
    if target != DRAINING:
        return own
    racing = [
        dataclasses.replace(b, strict=False)
        for b in EXPECTED_TO_DIFFER
        if b.targets & {HELD, FLUSHED} and scenario in b.scenarios
    ]
    return own + racing
