"""Pure pieces of wire parity: a body of unknown length through the upload pipeline, and a store's error
document given the gateway's request id."""

from __future__ import annotations

import base64
import zlib

import pytest

from s3lanes.core.body import UploadBody
from s3lanes.core.checksums import BodyVerifier
from s3lanes.errors import BadDigest, IncompleteBody
from s3lanes.http.s3xml import with_request_id


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def _body(expected: int | None, **headers: str) -> UploadBody:
    return UploadBody(
        verifier=BodyVerifier.from_headers(headers, "UNSIGNED-PAYLOAD"), decoder=None, expected_bytes=expected
    )


def test_a_body_of_unknown_length_is_held_back_and_verified_like_any_other() -> None:
    data = [b"abc", b"defg", b"h"]
    body = _body(None, **{"x-amz-checksum-crc32": crc32_b64(b"".join(data))})
    out: list[bytes] = []
    for piece in data:
        out += body.feed(piece)
    assert b"".join(out) == b"abcdefg"  # the last piece waits for the verdict
    assert body.seen_bytes == 8
    assert body.finish() == b"h"
    assert body.expected_bytes is None


def test_a_body_of_unknown_length_with_a_wrong_checksum_releases_no_tail() -> None:
    body = _body(None, **{"x-amz-checksum-crc32": crc32_b64(b"other")})
    assert body.feed(b"only piece") == []
    with pytest.raises(BadDigest):
        body.finish()


def test_a_declared_length_is_still_enforced() -> None:
    body = _body(3)
    with pytest.raises(IncompleteBody):
        body.feed(b"abcd")
    short = _body(3)
    short.feed(b"ab")
    with pytest.raises(IncompleteBody):
        short.finish()


def test_error_document_gets_the_gateway_request_id_and_nothing_else_changes() -> None:
    doc = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchKey</Code><Message>m</Message>'
        b"<RequestId>STORE123</RequestId><Key>k</Key></Error>"
    )
    assert with_request_id(doc, "GW456") == doc.replace(b"STORE123", b"GW456")
    listing = b"<ListBucketResult><RequestId>x</RequestId></ListBucketResult>"
    assert with_request_id(listing, "GW456") == listing
    assert with_request_id(b"", "GW456") == b""
