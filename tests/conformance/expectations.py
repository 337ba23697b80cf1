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
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.conformance.scenarios import COPY_RANGES, body_of

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


def _aws_chunked_not_an_encoding(observations: Observations) -> Observations:
    out = []
    for obs in observations:
        headers = obs.get("headers", {})
        read = obs.get("op") in ("get_object", "head_object")
        if read and headers.get("content-encoding") == "aws-chunked":
            obs = {**obs, "headers": {k: v for k, v in headers.items() if k != "content-encoding"}}
        out.append(obs)
    return out


def _errors_at(**steps: tuple[str, int]) -> Callable[[Observations], Observations]:
    """The store's observations with the named steps (``step=(code, status)``) answered with that error."""

    def expect(observations: Observations) -> Observations:
        out = []
        for obs in observations:
            if obs.get("step") in steps:
                code, status = steps[obs["step"]]
                kind: dict[str, Any] = {k: obs[k] for k in ("op", "raw") if k in obs}
                obs = {
                    **kind,
                    "error": code,
                    "headers": {"content-type": "application/xml"},
                    "request_id": "matches header",
                    "status": status,
                    "step": obs["step"],
                }
            out.append(obs)
        return out

    return expect


def _last_modified_moved(observations: Observations) -> Observations:
    """dates.last_modified_before_and_after_drain as it runs when the first HEAD met the object in the
    spool: Last-Modified moved at the drain, so the conditions on the earlier date answer the other way.
    Idempotent (the observations of such a run are returned unchanged)."""
    steps = {obs.get("step"): obs for obs in observations}
    moved = steps.get("Last-Modified unchanged by the drain")
    if moved is None or moved.get("note") is not True:
        return observations
    read = steps["get if-unmodified-since before"]
    swapped: dict[Any, dict[str, Any]] = {
        "Last-Modified unchanged by the drain": {**moved, "note": False},
        "get if-unmodified-since before": _errors_at(
            **{"get if-unmodified-since before": ("PreconditionFailed", 412)}
        )([read])[0],
        "get if-modified-since before": {**read, "step": "get if-modified-since before"},
    }
    return [swapped.get(obs.get("step"), obs) for obs in observations]


def _part_copy_etag_of_the_range(rng: str) -> Callable[[Observations], Observations]:
    """copy.range_*: the part's ETag is the MD5 of the copied range of the scenario's source, and the
    completed object's the multipart ETag of that one part."""
    first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
    part_md5 = hashlib.md5(body_of(1000)[first : last + 1], usedforsecurity=False).hexdigest()
    whole = hashlib.md5(bytes.fromhex(part_md5), usedforsecurity=False).hexdigest() + "-1"

    def expect(observations: Observations) -> Observations:
        out = []
        for obs in observations:
            step = obs.get("step")
            if step == "part copy" and "result" in obs:
                obs = {**obs, "result": {"CopyPartResult": {"ETag": f'"{part_md5}"'}}}
            elif step == "complete" and "result" in obs:
                obs = {**obs, "result": {**obs["result"], "ETag": f'"{whole}"'}}
            elif step == "get" and "etag" in obs.get("headers", {}):
                obs = {**obs, "headers": {**obs["headers"], "etag": f'"{whole}"'}}
            out.append(obs)
        return out

    return expect


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
    Deliberate(
        scenarios="raw.aws_chunked_trailer",
        targets=ALL,
        reason="aws-chunked is the framing of the request body, not an encoding of the object: AWS "
        "documents that it stores the object without it in Content-Encoding; SeaweedFS keeps it. The "
        "gateway decodes the framing and sends the store the object's own Content-Encoding (none here), "
        "spool on and off, so the object answers the same before and after the drain.",
        behaviour="Content-Encoding aws-chunked of the request is not stored (as AWS documents)",
        expect=_aws_chunked_not_an_encoding,
    ),
    Deliberate(
        scenarios="dates.last_modified_before_and_after_drain",
        targets=SPOOLED,
        reason="The store sets Last-Modified when it receives the object, and S3 has no way to set it: a "
        "spooled object shows the time its write was acknowledged (when the client's PUT happened) until it "
        "is drained, then the store's, the time of the drain. On spool-flushed and spool-draining the drain "
        "may put the object on the store before the scenario's first HEAD, so either form is accepted.",
        behaviour="Last-Modified moves from the acknowledgement time to the drain time; "
        "If-(Un)Modified-Since with the earlier date answer accordingly",
        expect=_last_modified_moved,
        both=True,
    ),
    *(
        Deliberate(
            scenarios=f"copy.range_{n}{suffix}",
            targets=SPOOLED,
            reason="UploadPartCopy of a part of a source: AWS answers the MD5 of the copied bytes as the "
            "part's ETag (the completed object's multipart ETag is made of the parts' MD5s); SeaweedFS "
            "answers the MD5 of the whole source (and completes with that). The spool copies a spooled "
            "source itself and answers as AWS; the drain then uploads the part's bytes, for which the store "
            "answers the same MD5, so the object keeps its ETag on the store.",
            behaviour="the part's ETag is the MD5 of the copied range (as AWS answers), and the completed "
            "object's ETag is made of it",
            expect=_part_copy_etag_of_the_range(COPY_RANGES[n]),
        )
        for n in (0, 4)
        for suffix in ("", "_settled")
    ),
    Deliberate(
        scenarios="checksum.raw_two_algorithms",
        targets=ALL,
        reason='A PutObject with two x-amz-checksum-* values: AWS refuses it (InvalidRequest, "Expecting a '
        'single x-amz-checksum- header"); SeaweedFS stores the object with one of them. The gateway checks '
        "the request before the store sees it and follows AWS, spool on and off: nothing is stored.",
        behaviour="two checksum values are 400 InvalidRequest and nothing is stored (as AWS answers)",
        expect=_errors_at(**{"put": ("InvalidRequest", 400), "head": ("404", 404)}),
    ),
    Deliberate(
        scenarios="multipart.missing_part",
        targets=SPOOLED,
        reason="CompleteMultipartUpload naming a part that was never uploaded: AWS documents InvalidPart "
        '("One or more of the specified parts could not be found"); SeaweedFS answers EntityTooSmall. '
        "The spool answers a spooled upload's completion itself and follows AWS.",
        behaviour="a part never uploaded is 400 InvalidPart (as AWS documents)",
        expect=_errors_at(**{"complete missing": ("InvalidPart", 400)}),
    ),
    Deliberate(
        scenarios="multipart.no_parts",
        targets=ALL,
        reason="CompleteMultipartUpload with an empty part list: AWS answers MalformedXML (the document "
        "does not validate against its schema); SeaweedFS answers NoSuchUpload. The gateway checks the "
        "document before the store or the spool acts on it (a store may complete an upload from a "
        "document S3 refuses), spool on and off, and follows AWS.",
        behaviour="an empty part list is 400 MalformedXML (as AWS answers)",
        expect=_errors_at(**{"complete empty": ("MalformedXML", 400)}),
    ),
    Deliberate(
        scenarios="multipart.part_number_range",
        targets=ALL,
        reason='UploadPart with partNumber 0 or 10001: AWS answers InvalidArgument ("Part number must be an '
        'integer between 1 and 10000, inclusive"); SeaweedFS answers InvalidPart. The gateway checks the '
        "argument before the store or the spool sees the body, spool on and off, and follows AWS.",
        behaviour="a part number outside 1..10000 is 400 InvalidArgument (as AWS answers)",
        expect=_errors_at(**{"part 0": ("InvalidArgument", 400), "part 10001": ("InvalidArgument", 400)}),
    ),
    Deliberate(
        scenarios="raw.errors_carry_request_ids",
        targets=ALL,
        reason="CompleteMultipartUpload that is wrong twice (an unknown upload id and a document without "
        "parts): the gateway checks the document first, before the store sees it (a store may complete "
        "an upload from a document S3 refuses), and answers MalformedXML as AWS does for such a document; "
        "SeaweedFS looks the upload up first (NoSuchUpload). AWS does not document the order of the two "
        "checks. Either is an error and nothing changes.",
        behaviour="an unknown upload id with a document without parts is 400 MalformedXML",
        expect=_errors_at(**{"bad upload id": ("MalformedXML", 400)}),
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
WHY: dict[str, str] = {}

EXPECTED_TO_DIFFER: tuple[KnownBug, ...] = ()


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
