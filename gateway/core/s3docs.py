"""Request documents the gateway checks itself before anything reaches the store.

A DeleteObjects document is validated as strictly as S3 does, whether or not the spool holds any of its keys:
stores are more lenient (SeaweedFS deletes the keys of a document whose root is not ``Delete``, or that has a
``Key`` outside any ``Object``), and a request S3 refuses must delete nothing through the gateway either.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from gateway.errors import MalformedXML

# The largest request document read into memory (CompleteMultipartUpload with 10,000 parts, DeleteObjects
# with 1,000 keys of 1 KiB, with room for namespaces and whitespace).
MAX_XML_BODY_BYTES = 4 * 1024 * 1024

MAX_DELETE_OBJECTS = 1000
_OBJECT_FIELDS = frozenset({"Key", "VersionId", "ETag", "LastModifiedTime", "Size"})


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def delete_objects_keys(body: bytes) -> list[str]:
    """The keys a DeleteObjects document deletes (current versions only), or MalformedXML.

    Checked: UTF-8, well-formed, root ``Delete``, only ``Quiet`` (true/false) and ``Object`` children, each
    ``Object`` with a ``Key`` and only S3's fields, 1 to 1,000 objects. expat expands no external entity
    and stops entity amplification, so a hostile document is a parse error."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedXML() from exc
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise MalformedXML() from exc
    if _local(root.tag) != "Delete":
        raise MalformedXML()
    keys: list[str] = []
    objects = 0
    for el in root:
        name = _local(el.tag)
        if name == "Quiet":
            if len(el) or (el.text or "").strip().lower() not in ("true", "false"):
                raise MalformedXML()
        elif name == "Object":
            objects += 1
            fields: dict[str, str] = {}
            for child in el:
                field = _local(child.tag)
                if field not in _OBJECT_FIELDS or field in fields or len(child):
                    raise MalformedXML()
                fields[field] = child.text or ""
            if "Key" not in fields:
                raise MalformedXML()
            if "VersionId" not in fields:  # deleting one version leaves the current object alone
                keys.append(fields["Key"])
        else:
            raise MalformedXML()
    if not 1 <= objects <= MAX_DELETE_OBJECTS:
        raise MalformedXML()
    return keys
