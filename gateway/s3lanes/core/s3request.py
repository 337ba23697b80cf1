"""What an incoming request is, in S3 terms: bucket, key and operation. Pure; no I/O.

Theory of operation: S3 names the target either in the path (``/bucket/key``, path-style) or in the Host
header (``bucket.<domain>/key``, virtual-hosted-style). The operation follows from the method, the
sub-resource query parameters and a few headers (``x-amz-copy-source``). The gateway forwards every request
generically, so an operation this module does not name is still proxied (as ``Unknown<Method>``); the name
only feeds classification, metrics and the few handlers that need to know (e.g. which requests carry bodies).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from s3lanes.errors import InvalidBucketName, InvalidRequest, InvalidURI

# Sub-resources that select a bucket or object operation (S3 REST API). Order does not matter.
_BUCKET_GET_SUBRESOURCES = {
    "acl": "GetBucketAcl",
    "cors": "GetBucketCors",
    "lifecycle": "GetBucketLifecycleConfiguration",
    "location": "GetBucketLocation",
    "logging": "GetBucketLogging",
    "notification": "GetBucketNotificationConfiguration",
    "policy": "GetBucketPolicy",
    "tagging": "GetBucketTagging",
    "uploads": "ListMultipartUploads",
    "versioning": "GetBucketVersioning",
    "versions": "ListObjectVersions",
    "website": "GetBucketWebsite",
    "encryption": "GetBucketEncryption",
    "object-lock": "GetObjectLockConfiguration",
    "ownershipControls": "GetBucketOwnershipControls",
    "replication": "GetBucketReplication",
    "requestPayment": "GetBucketRequestPayment",
    "accelerate": "GetBucketAccelerateConfiguration",
    "policyStatus": "GetBucketPolicyStatus",
}
# An object's operations named by a query parameter, by method, in the order they are tested; without one
# of them it is the method's plain operation (PUT: PutObject or CopyObject; a part: UploadPart(Copy)).
_OBJECT_SUBRESOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    "GET": (
        ("uploadId", "ListParts"),
        ("tagging", "GetObjectTagging"),
        ("acl", "GetObjectAcl"),
        ("attributes", "GetObjectAttributes"),
    ),
    "PUT": (("tagging", "PutObjectTagging"), ("acl", "PutObjectAcl")),
    "DELETE": (("uploadId", "AbortMultipartUpload"), ("tagging", "DeleteObjectTagging")),
    "POST": (
        ("uploads", "CreateMultipartUpload"),
        ("uploadId", "CompleteMultipartUpload"),
        ("restore", "RestoreObject"),
        ("select", "SelectObjectContent"),
    ),
}
_OBJECT_PLAIN = {"GET": "GetObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}

_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,254}$")


@dataclass(frozen=True, slots=True)
class S3Target:
    bucket: str | None
    key: str | None  # decoded UTF-8 object key, None for service- and bucket-level requests
    operation: str
    virtual_host: bool


def split_target(raw_target: str) -> tuple[str, str]:
    """Split an HTTP request target into (raw path, raw query), both still encoded."""
    path, _, query = raw_target.partition("?")
    return path, query


def query_names(raw_query: str) -> dict[str, str]:
    """Decoded query parameters (the first value of each name). Enough for operation detection."""
    out: dict[str, str] = {}
    for part in raw_query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = unquote(name.replace("+", " "))
        out.setdefault(name, unquote(value.replace("+", " ")))
    return out


def bucket_from_host(host: str, domains: tuple[str, ...]) -> str | None:
    """Return the bucket of a virtual-hosted-style Host header, or None for path-style."""
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    hostname = hostname.lower().rstrip(".")
    for domain in domains:
        suffix = "." + domain.lower()
        if hostname.endswith(suffix) and len(hostname) > len(suffix):
            return hostname[: -len(suffix)]
    return None


def parse_target(
    method: str, raw_path: str, raw_query: str, headers: Mapping[str, str], domains: tuple[str, ...]
) -> S3Target:
    """Work out bucket, key and operation. ``headers`` has lower-case names."""
    if not raw_path.startswith("/"):
        raise InvalidRequest("The request target must be an absolute path.")
    host_bucket = bucket_from_host(headers.get("host", ""), domains)
    path = raw_path[1:]
    if host_bucket is not None:
        bucket: str | None = host_bucket
        key_raw = path
    else:
        bucket_raw, sep, key_raw = path.partition("/")
        bucket = unquote(bucket_raw) if bucket_raw else None
        if not sep:
            key_raw = ""
    try:
        key = unquote(key_raw, errors="strict") if key_raw else None
    except UnicodeDecodeError:
        # S3 keys are UTF-8; a percent-encoded byte sequence that is not UTF-8 names no key.
        raise InvalidURI(f"Couldn't parse the specified URI: {raw_path[:200]}") from None
    if bucket is not None and not _BUCKET_RE.match(bucket):
        raise InvalidBucketName(
            f"The specified bucket is not valid: {bucket[:80]!r}", BucketName=bucket[:255]
        )
    q = query_names(raw_query)
    return S3Target(bucket, key, operation_name(method, bucket, key, q, headers), host_bucket is not None)


def operation_name(
    method: str, bucket: str | None, key: str | None, q: Mapping[str, str], headers: Mapping[str, str]
) -> str:
    m = method.upper()
    if bucket is None:
        return "ListBuckets" if m == "GET" else f"Unknown{m.title()}"
    if key is None:
        if m == "GET":
            if q.get("list-type") == "2":
                return "ListObjectsV2"
            for sub, name in _BUCKET_GET_SUBRESOURCES.items():
                if sub in q:
                    return name
            return "ListObjects"
        if m == "HEAD":
            return "HeadBucket"
        if m == "PUT":
            for sub, name in _BUCKET_GET_SUBRESOURCES.items():
                if sub in q:
                    return "Put" + name.removeprefix("Get")
            return "CreateBucket"
        if m == "DELETE":
            for sub, name in _BUCKET_GET_SUBRESOURCES.items():
                if sub in q:
                    return "Delete" + name.removeprefix("Get")
            return "DeleteBucket"
        if m == "POST" and "delete" in q:
            return "DeleteObjects"
        return f"Unknown{m.title()}"
    copy = "x-amz-copy-source" in headers
    if m == "PUT" and "partNumber" in q and "uploadId" in q:
        return "UploadPartCopy" if copy else "UploadPart"
    for sub, name in _OBJECT_SUBRESOURCES.get(m, ()):
        if sub in q:
            return name
    if m == "PUT":
        return "CopyObject" if copy else "PutObject"
    return _OBJECT_PLAIN.get(m, f"Unknown{m.title()}")
