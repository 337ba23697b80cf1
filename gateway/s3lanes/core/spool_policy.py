"""The write spool's pure policy: which writes it may take, what it keeps of them, and the small S3
documents it answers with (no I/O; the HTTP front, :mod:`s3lanes.http.spool_front`, carries it out)."""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from urllib.parse import parse_qsl, unquote
from xml.sax.saxutils import escape

from s3lanes.core.checksums import without_aws_chunked
from s3lanes.core.objectread import CONTENT_HEADERS, DEFAULT_CONTENT_TYPE, StoredObject
from s3lanes.core.spool_state import Entry
from s3lanes.errors import InvalidArgument

WRITE_THROUGH_HEADER = "x-s3lanes-write-through"

# Request headers kept with a spooled object and sent with its upload to the backend.
_KEEP_HEADERS = frozenset(
    {
        *CONTENT_HEADERS,
        "x-amz-tagging",
        "x-amz-storage-class",
        "x-amz-website-redirect-location",
        "x-amz-acl",
        "x-amz-grant-full-control",
        "x-amz-grant-read",
        "x-amz-grant-read-acp",
        "x-amz-grant-write-acp",
        "x-amz-server-side-encryption",
        "x-amz-server-side-encryption-aws-kms-key-id",
        "x-amz-server-side-encryption-context",
        "x-amz-server-side-encryption-bucket-key-enabled",
    }
)
# Of those, the ones GET/HEAD show (besides Content-Type and x-amz-meta-*).
_SERVED_HEADERS = frozenset(
    {*CONTENT_HEADERS, "x-amz-website-redirect-location", "x-amz-server-side-encryption"} - {"content-type"}
)
# Requests with these cannot be answered from local disk honestly: they go to the backend.
WRITE_THROUGH_ONLY = (
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "if-match",
    "if-none-match",
)
_TRUE = frozenset({"1", "true", "yes", "on"})


def upload_meta(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name.startswith("x-amz-meta-") or name in _KEEP_HEADERS:
            if name.startswith("x-amz-meta-") and not value.strip():
                continue  # the store drops user metadata with an empty value (it would after the drain)
            if name == "content-encoding":
                value = without_aws_chunked(value)
                if not value.strip():
                    continue
            out.append((name, value))
    return sorted(out)


def not_checksum_meta(meta: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers of a copied object: a multipart source's checksum algorithm and type do not carry over to
    the single object the copy is (its own checksum value, of the same bytes, does)."""
    return [(k, v) for k, v in meta if k not in ("x-amz-checksum-algorithm", "x-amz-checksum-type")]


def stored_object(entry: Entry) -> StoredObject:
    meta = dict(entry.meta)
    served = (
        tuple(
            (k, v)
            for k, v in entry.meta
            if k.startswith("x-amz-meta-")
            or k in _SERVED_HEADERS
            or (k == "x-amz-storage-class" and v != "STANDARD")
        )
        + entry.checksum
    )
    tagging = meta.get("x-amz-tagging", "")
    return StoredObject(
        size=entry.size,
        etag=entry.etag,
        last_modified=entry.acked_at,
        content_type=meta.get("content-type", DEFAULT_CONTENT_TYPE),
        headers=served,
        tag_count=len([t for t in tagging.split("&") if t]),
        part_sizes=entry.part_sizes,
    )


def xml_document(root: str, fields: list[tuple[str, str]]) -> bytes:
    inner = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in fields)
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"{inner}</{root}>"
    ).encode()


def tagging_xml(tagging: str) -> bytes:
    """GetObjectTagging's answer for an object stored with ``x-amz-tagging`` (a URL query: k=v&k2=v2)."""
    tags = "".join(
        f"<Tag><Key>{escape(k)}</Key><Value>{escape(v)}</Value></Tag>"
        for k, v in parse_qsl(tagging, keep_blank_values=True)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Tagging xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<TagSet>{tags}</TagSet></Tagging>"
    ).encode()


def odd_path_segments(key: str) -> bool:
    """Empty, "." or ".." path segments (backslashes count as separators: some stores map them to "/")."""
    segments = key.replace("\\", "/").split("/")
    return any(seg in ("", ".", "..") for seg in segments[:-1]) or segments[-1] in (".", "..")


def parse_copy_source(value: str) -> tuple[str, str]:
    """``x-amz-copy-source``: ``[/]bucket/key[?versionId=...]``, URL-encoded."""
    raw = value.split("?", 1)[0]
    raw = raw[1:] if raw.startswith("/") else raw
    bucket, sep, key = raw.partition("/")
    if not sep or not bucket or not key:
        raise InvalidArgument("Copy Source must mention the source bucket and key: sourcebucket/sourcekey.")
    return unquote(bucket), unquote(key)


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # surrogates: bytes that were not UTF-8 on the wire
        return False
    return True


def _key_storable(key: str) -> bool:
    """S3 keys are at most 1,024 bytes of UTF-8; stores refuse NUL and path segments over 255 bytes."""
    raw = key.encode("utf-8", "surrogatepass")
    return len(raw) <= 1024 and b"\x00" not in raw and all(len(seg) <= 255 for seg in raw.split(b"/"))


_STORAGE_CLASSES = frozenset(
    {
        "STANDARD",
        "REDUCED_REDUNDANCY",
        "STANDARD_IA",
        "ONEZONE_IA",
        "INTELLIGENT_TIERING",
        "GLACIER",
        "DEEP_ARCHIVE",
        "OUTPOSTS",
        "GLACIER_IR",
        "SNOW",
        "EXPRESS_ONEZONE",
    }
)


def _headers_storable(h: Mapping[str, str]) -> bool:
    """Headers a store would refuse (so the spool could acknowledge a write that never drains): a bad
    ``x-amz-tagging`` query, an ``Expires`` that is not an HTTP date, an unknown storage class."""
    tagging = h.get("x-amz-tagging")
    if tagging is not None:
        try:
            pairs = parse_qsl(tagging, keep_blank_values=True, strict_parsing=bool(tagging), errors="strict")
        except (ValueError, UnicodeDecodeError):
            return False
        if len(pairs) > 10 or any(not k or len(k) > 128 or len(v) > 256 for k, v in pairs):
            return False
        if any("%" in k + v for k, v in pairs):  # a '%' left over: not valid percent-encoding
            return False
    expires = h.get("expires")
    if expires is not None:
        try:
            email.utils.parsedate_to_datetime(expires)
        except (TypeError, ValueError, IndexError):
            return False
    sc = h.get("x-amz-storage-class")
    return sc is None or sc in _STORAGE_CLASSES


def copy_conditions(headers: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("if-match", "if-none-match", "if-modified-since", "if-unmodified-since"):
        value = headers.get("x-amz-copy-source-" + name)
        if value is not None:
            out[name] = value
    return out


def write_through_reason(key: str, h: Mapping[str, str]) -> str | None:
    """Why a write of ``key`` with the (lower-case) headers ``h`` goes to the store instead of the spool,
    judged by the key and headers alone (the metric's ``reason``), or None: they allow it."""
    if key.endswith("/"):
        # SeaweedFS stores a key ending in "/" as a directory (its bytes dropped, Content-Length 0): let
        # the store answer it from the start, so that the object does not change at the drain.
        return "key"
    if odd_path_segments(key):
        # Stores disagree on keys with "."/".." or empty segments (SeaweedFS refuses or folds them):
        # let the backend answer such writes itself rather than acknowledge what may never drain.
        return "key"
    if h.get(WRITE_THROUGH_HEADER, "").strip().lower() in _TRUE:
        return "requested"
    if not all(_utf8(v) for v in h.values()) or not _key_storable(key) or not _headers_storable(h):
        # Header bytes that are not UTF-8 (the spool stores headers as text), or a key the store will
        # refuse: let the backend answer such a write itself rather than acknowledge what cannot drain.
        return "unstorable"
    if "x-amz-server-side-encryption-customer-algorithm" in h:
        return "sse_c"
    if any(name.startswith("x-amz-object-lock-") for name in h):
        return "object_lock"
    return None


def writes_key(op: str) -> bool:
    """Operations that change an object (its data, tags, ACL, or whether it exists)."""
    return op in ("PutObject", "CopyObject", "CreateMultipartUpload", "DeleteObject", "RestoreObject") or (
        op.startswith(("Put", "Delete", "Complete", "UploadPart"))
    )
