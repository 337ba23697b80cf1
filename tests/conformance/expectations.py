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


def _malformed_checksum_is_invalid_request(observations: Observations) -> Observations:
    return [
        {**obs, "error": "InvalidRequest"} if obs.get("raw") and obs.get("error") == "BadDigest" else obs
        for obs in observations
    ]


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
        behaviour="DeleteBucket waits for the held drain (when anything of the bucket is spooled), then "
        "answers as the store does",
        expect=_delete_bucket_waits,
        both=True,
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
    *(
        Deliberate(
            scenarios=name,
            targets=ALL,
            reason="A malformed x-amz-checksum-* value (not base64, or not the algorithm's digest length): "
            "SeaweedFS answers BadDigest, AWS InvalidRequest. The gateway checks the request before the "
            "store sees it and follows AWS; both refuse it and store nothing.",
            behaviour="a malformed checksum value is 400 InvalidRequest (as AWS answers)",
            expect=_malformed_checksum_is_invalid_request,
        )
        for name in (
            "checksum.raw_crc32_malformed",
            "checksum.raw_crc32_short",
            "checksum.raw_sha1_malformed",
        )
    ),
)

# Recorded from `make conformance` as the gateway is today: bugs to fix, not exceptions
# (docs/compatibility.md). WHY: what differs, by scenario family.
WHY = {
    "checksum.raw_two_algorithms": (
        "a PUT with two x-amz-checksum-* headers is refused with InvalidRequest (as AWS does); the store"
        " accepts it and keeps the CRC32"
    ),
    "checksum.raw_algorithm_without_value": (
        "a PUT with x-amz-sdk-checksum-algorithm and no checksum value: the store computes the checksum "
        "and answers it on the PUT and HEAD, the spool does not; the spooled object's default Content-"
        "Type differs too"
    ),
    "checksum.raw_crc32_right": (
        "an object written without Content-Type: the spool answers binary/octet-stream (S3's default), "
        "the store its sniffed type"
    ),
    "cond.put_": (
        "a conditional PUT of a spooled key waits for the drain instead of being answered from the spool"
    ),
    "content.": (
        "an object written without Content-Type: the spool answers binary/octet-stream (S3's default), "
        "the store its sniffed type"
    ),
    "copy.range_": (
        "UploadPartCopy of a spooled source: the part's ETag is the MD5 of the copied range (the store "
        "answers the MD5 of the whole source), so the completed object's ETag differs too"
    ),
    "copy.multipart_source": (
        "CopyObject of a spooled multipart source: the copy's ETag is the MD5 of its bytes (the store "
        "keeps the source's multipart ETag)"
    ),
    "copy.": (
        "the Content-Type of a copy made without one differs from the store's (text/plain sniffed by the"
        " store where the source had binary/octet-stream, or the reverse)"
    ),
    "dates.": (
        "Last-Modified moves from the acknowledgement time to the drain time, so date conditions that "
        "compare with the earlier value change their answer after the drain"
    ),
    "metadata.": (
        "user metadata of a spooled object: an empty value is kept by the spool, dropped by the store"
    ),
    "multipart.concurrent_part_reupload": (
        "a part uploaded twice at once: Complete with the ETag of the upload that finished first "
        "completes the other upload's bytes"
    ),
    "multipart.missing_part": (
        "Complete naming a part never uploaded answers InvalidPart (as AWS documents); the store answers"
        " EntityTooSmall"
    ),
    "multipart.no_parts": (
        "Complete with an empty part list answers MalformedXML (as AWS does); the store answers NoSuchUpload"
    ),
    "multipart.part_number_range": (
        "UploadPart with partNumber 0 or 10001 answers InvalidArgument (as AWS does); the store answers "
        "InvalidPart"
    ),
    "object.put_get_": (
        "an object written without Content-Type: the spool answers binary/octet-stream (S3's default), "
        "the store its sniffed type"
    ),
    "range.part_number": (
        "GET/HEAD with partNumber=1 of a spooled single-PUT object: no x-amz-mp-parts-count (the store: 1)"
    ),
    "range.": (
        "HEAD with Range of a spooled object answers 206 with the range's length, or 416 for an "
        "unsatisfiable range (as AWS documents); the store ignores Range on HEAD (200, whole length)"
    ),
    "raw.errors": (
        "CompleteMultipartUpload with an unknown upload id and an empty body answers MalformedXML (the "
        "body is checked first); the store answers NoSuchUpload"
    ),
    "raw.chunked_without_length": (
        "an object written without Content-Type: the spool answers binary/octet-stream (S3's default), "
        "the store its sniffed type"
    ),
    "raw.aws_chunked_trailer": (
        "an aws-chunked PUT with a trailing checksum: the trailing checksum is not kept, and the store "
        "also keeps Content-Encoding: aws-chunked where the gateway removes it"
    ),
}

EXPECTED_TO_DIFFER: tuple[KnownBug, ...] = (
    KnownBug(
        ("checksum.raw_two_algorithms",),
        frozenset({OFF}),
        WHY["checksum.raw_two_algorithms"],
    ),
    KnownBug(
        ("checksum.raw_two_algorithms",),
        frozenset({HELD}),
        WHY["checksum.raw_two_algorithms"],
    ),
    KnownBug(
        ("checksum.raw_two_algorithms",),
        frozenset({FLUSHED}),
        WHY["checksum.raw_two_algorithms"],
    ),
    KnownBug(
        ("checksum.raw_algorithm_without_value",),
        frozenset({HELD}),
        WHY["checksum.raw_algorithm_without_value"],
    ),
    KnownBug(
        ("checksum.raw_algorithm_without_value",),
        frozenset({FLUSHED}),
        WHY["checksum.raw_algorithm_without_value"],
    ),
    KnownBug(
        ("checksum.raw_crc32_right",),
        frozenset({HELD}),
        WHY["checksum.raw_crc32_right"],
    ),
    KnownBug(
        (
            "cond.put_match_right",
            "cond.put_match_right_settled",
        ),
        frozenset({HELD}),
        WHY["cond.put_"],
    ),
    KnownBug(
        (
            "content.cache_control",
            "content.default_type",
            "content.disposition",
            "content.encoding_gzip",
            "content.encoding_list",
            "content.expires",
            "content.language",
            "content.multipart_cache_control",
            "content.multipart_default_type",
            "content.multipart_disposition",
            "content.multipart_encoding_gzip",
            "content.multipart_encoding_list",
            "content.multipart_expires",
            "content.multipart_language",
        ),
        frozenset({HELD}),
        WHY["content."],
    ),
    KnownBug(
        (
            "copy.range_0",
            "copy.range_0_settled",
            "copy.range_4",
            "copy.range_4_settled",
        ),
        frozenset({HELD}),
        WHY["copy.range_"],
    ),
    KnownBug(
        (
            "copy.range_0",
            "copy.range_0_settled",
            "copy.range_4",
            "copy.range_4_settled",
        ),
        frozenset({FLUSHED}),
        WHY["copy.range_"],
    ),
    KnownBug(
        ("copy.multipart_source",),
        frozenset({HELD}),
        WHY["copy.multipart_source"],
    ),
    KnownBug(
        ("copy.multipart_source",),
        frozenset({FLUSHED}),
        WHY["copy.multipart_source"],
    ),
    KnownBug(
        ("copy.object_content_headers_settled",),
        frozenset({DRAINING}),
        WHY["copy."],
        strict=False,
    ),
    KnownBug(
        (
            "copy.errors",
            "copy.object_content_headers",
        ),
        frozenset({FLUSHED}),
        WHY["copy."],
    ),
    KnownBug(
        ("dates.last_modified_before_and_after_drain",),
        frozenset({HELD}),
        WHY["dates."],
    ),
    # On spool-flushed the drain runs freely before the scenario's own drain step: whether its first HEAD
    # meets the object in the spool (the ack time) or already on the store decides whether it differs.
    KnownBug(
        ("dates.last_modified_before_and_after_drain",),
        frozenset({FLUSHED}),
        WHY["dates."],
        strict=False,
    ),
    KnownBug(
        ("metadata.empty_value",),
        frozenset({HELD}),
        WHY["metadata."],
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
        frozenset({FLUSHED}),
        WHY["multipart.concurrent_part_reupload"],
        strict=False,
    ),
    KnownBug(
        ("multipart.missing_part",),
        frozenset({HELD}),
        WHY["multipart.missing_part"],
    ),
    KnownBug(
        ("multipart.missing_part",),
        frozenset({FLUSHED}),
        WHY["multipart.missing_part"],
    ),
    KnownBug(
        ("multipart.no_parts",),
        frozenset({OFF}),
        WHY["multipart.no_parts"],
    ),
    KnownBug(
        ("multipart.no_parts",),
        frozenset({HELD}),
        WHY["multipart.no_parts"],
    ),
    KnownBug(
        ("multipart.no_parts",),
        frozenset({FLUSHED}),
        WHY["multipart.no_parts"],
    ),
    KnownBug(
        ("multipart.part_number_range",),
        frozenset({OFF}),
        WHY["multipart.part_number_range"],
    ),
    KnownBug(
        ("multipart.part_number_range",),
        frozenset({HELD}),
        WHY["multipart.part_number_range"],
    ),
    KnownBug(
        ("multipart.part_number_range",),
        frozenset({FLUSHED}),
        WHY["multipart.part_number_range"],
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
        ("range.part_number_1",),
        frozenset({HELD}),
        WHY["range.part_number"],
    ),
    KnownBug(
        (
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
        frozenset({FLUSHED}),
        WHY["raw.errors"],
    ),
    KnownBug(
        ("raw.chunked_without_length",),
        frozenset({HELD}),
        WHY["raw.chunked_without_length"],
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
        frozenset({FLUSHED}),
        WHY["raw.aws_chunked_trailer"],
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
