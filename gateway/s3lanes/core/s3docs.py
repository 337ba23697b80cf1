"""Request documents the gateway checks itself before anything reaches the store.

DeleteObjects and CompleteMultipartUpload documents are validated as strictly as S3 does, whether or not the
spool holds any of their keys or parts: stores are more lenient (SeaweedFS deletes the keys of a document
whose root is not ``Delete``, or that has a ``Key`` outside any ``Object``, and completes an upload from a
document whose root is not ``CompleteMultipartUpload``), and a request S3 refuses must change nothing
through the gateway either.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from s3lanes.errors import MalformedXML

# The largest request document read into memory (CompleteMultipartUpload with 10,000 parts, DeleteObjects
# with 1,000 keys of 1 KiB, with room for namespaces and whitespace).
MAX_XML_BODY_BYTES = 4 * 1024 * 1024

MAX_DELETE_OBJECTS = 1000
_OBJECT_FIELDS = frozenset({"Key", "VersionId", "ETag", "LastModifiedTime", "Size"})
MAX_COMPLETE_PARTS = 10_000
_PART_FIELDS = frozenset(
    {
        "PartNumber",
        "ETag",
        "ChecksumCRC32",
        "ChecksumCRC32C",
        "ChecksumCRC64NVME",
        "ChecksumSHA1",
        "ChecksumSHA256",
    }
)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _parse(body: bytes) -> ET.Element:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedXML() from exc
    try:
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise MalformedXML() from exc


def _leaf_fields(el: ET.Element, allowed: frozenset[str]) -> dict[str, str]:
    """The text of each child of ``el``: every child a leaf, named in ``allowed``, at most once."""
    fields: dict[str, str] = {}
    for child in el:
        field = _local(child.tag)
        if field not in allowed or field in fields or len(child):
            raise MalformedXML()
        fields[field] = child.text or ""
    return fields


def delete_objects_keys(body: bytes) -> list[str]:
    """The keys a DeleteObjects document deletes (current versions only), or MalformedXML (checked as
    :func:`delete_objects_targets` checks it)."""
    return [key for key, version_id in delete_objects_targets(body) if version_id is None]


def delete_objects_targets(body: bytes) -> list[tuple[str, str | None]]:
    """Each ``(key, VersionId or None)`` a DeleteObjects document names, in order, or MalformedXML.

    Checked: UTF-8, well-formed, root ``Delete``, only ``Quiet`` (true/false) and ``Object`` children, each
    ``Object`` with a ``Key`` and only S3's fields, 1 to 1,000 objects. expat expands no external entity
    and stops entity amplification, so a hostile document is a parse error."""
    root = _parse(body)
    if _local(root.tag) != "Delete":
        raise MalformedXML()
    targets: list[tuple[str, str | None]] = []
    objects = 0
    for el in root:
        name = _local(el.tag)
        if name == "Quiet":
            if len(el) or (el.text or "").strip().lower() not in ("true", "false"):
                raise MalformedXML()
        elif name == "Object":
            objects += 1
            fields = _leaf_fields(el, _OBJECT_FIELDS)
            if "Key" not in fields:
                raise MalformedXML()
            targets.append((fields["Key"], fields.get("VersionId")))
        else:
            raise MalformedXML()
    if not 1 <= objects <= MAX_DELETE_OBJECTS:
        raise MalformedXML()
    return targets


def complete_multipart_parts(body: bytes) -> list[tuple[int, str]]:
    """The (part number, ETag) list of a CompleteMultipartUpload document, in document order, or MalformedXML.

    Checked: UTF-8, well-formed, root ``CompleteMultipartUpload``, only ``Part`` children, each with one
    ``PartNumber`` (decimal digits) and one ``ETag`` and otherwise only S3's checksum fields, 1 to 10,000
    parts. The order of the numbers, their range and the ETags are the upload's business (InvalidPartOrder,
    InvalidPart: the store, or the spool for an upload it holds)."""
    root = _parse(body)
    if _local(root.tag) != "CompleteMultipartUpload":
        raise MalformedXML()
    parts: list[tuple[int, str]] = []
    for el in root:
        if _local(el.tag) != "Part" or len(parts) == MAX_COMPLETE_PARTS:
            raise MalformedXML()
        fields = _leaf_fields(el, _PART_FIELDS)
        number = fields.get("PartNumber", "").strip()
        if "ETag" not in fields or not (number.isascii() and number.isdigit()):
            raise MalformedXML()
        parts.append((int(number), fields["ETag"].strip()))
    if not parts:
        raise MalformedXML()
    return parts


def complete_multipart_checksums(body: bytes) -> list[dict[str, str]]:
    """Per ``Part`` of a CompleteMultipartUpload document (one already accepted by
    :func:`complete_multipart_parts`), in document order: its ``Checksum<ALGORITHM>`` fields as
    ``{"CRC32": "<base64>", ...}``."""
    out: list[dict[str, str]] = []
    for el in _parse(body):
        fields = _leaf_fields(el, _PART_FIELDS)
        out.append(
            {
                name.removeprefix("Checksum"): value
                for name, value in fields.items()
                if name.startswith("Checksum")
            }
        )
    return out
