"""S3 error XML: the one place an :class:`~s3lanes.errors.S3Error` becomes bytes on the wire."""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

from s3lanes.errors import S3Error

_XML_DECL = '<?xml version="1.0" encoding="UTF-8"?>\n'

# Characters XML 1.0 cannot carry at all (controls, lone surrogates, U+FFFE/U+FFFF); a hostile key must not
# make the error document invalid, or unencodable.
_INVALID_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str) -> str:
    return escape(_INVALID_XML.sub("\ufffd", value))


def error_xml(err: S3Error, *, resource: str, request_id: str) -> bytes:
    parts = [
        _XML_DECL,
        "<Error>",
        f"<Code>{_text(err.code)}</Code>",
        f"<Message>{_text(err.message)}</Message>",
    ]
    for name, value in err.extra.items():
        parts.append(f"<{name}>{_text(value)}</{name}>")
    parts.append(f"<Resource>{_text(resource)}</Resource>")
    parts.append(f"<RequestId>{_text(request_id)}</RequestId>")
    parts.append("</Error>")
    return "".join(parts).encode("utf-8")


# The RequestId element of an error document, as stores write it (no attributes, plain text).
_REQUEST_ID = re.compile(rb"<RequestId>[^<]*</RequestId>")
# An error document larger than this is relayed as it streams, untouched (S3's are well under 1 KiB).
MAX_REWRITTEN_ERROR_BYTES = 64 * 1024


def with_request_id(body: bytes, request_id: str) -> bytes:
    """A store's error document carrying the gateway's request id (the one in its x-amz-request-id header
    and its logs) instead of the store's, which the answer keeps in x-s3lanes-backend-request-id. A body
    that is not an S3 error document is returned as it is."""
    if b"<Error>" not in body[:512]:
        return body
    return _REQUEST_ID.sub(f"<RequestId>{_text(request_id)}</RequestId>".encode(), body, count=1)
