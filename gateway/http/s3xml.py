"""S3 error XML: the one place an :class:`~gateway.errors.S3Error` becomes bytes on the wire."""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

from gateway.errors import S3Error

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
