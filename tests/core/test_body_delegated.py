"""UploadBody with its hashing delegated (what the spool does: it hashes on its own I/O thread as it
writes): the same promises are checked, only later, and only on bytes the caller fed to the hashers."""

from __future__ import annotations

import base64
import hashlib
import zlib
from typing import Any

import pytest

from s3lanes.core.body import UploadBody
from s3lanes.core.checksums import BodyVerifier
from s3lanes.core.chunked import AwsChunkedDecoder
from s3lanes.core.sigv4 import STREAMING_UNSIGNED_TRAILER, UNSIGNED_PAYLOAD
from s3lanes.errors import BadDigest, IncompleteBody, XAmzContentSHA256Mismatch

BODY = bytes(range(256)) * 300


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def framed(data: bytes, crc: str) -> bytes:
    out = b""
    for i in range(0, len(data), 10_000):
        piece = data[i : i + 10_000]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    return out + f"0\r\nx-amz-checksum-crc32:{crc}\r\n\r\n".encode()


def run(body: UploadBody, raw: bytes, *, feed_hashers: bool = True) -> tuple[bytes, list[Any]]:
    """Drive the body as the spool does: hashers taken first, every decoded byte fed to them, then
    finish() and verify(). Returns the decoded bytes and the hashers."""
    hashers = body.delegate_hashing()
    out = b""
    for i in range(0, len(raw), 7_777):
        for piece in body.feed(raw[i : i + 7_777]):
            out += piece
    out += body.finish()
    if feed_hashers:
        for h in hashers:
            h.update(out)
    body.verify()
    return out, list(hashers)


def plain(headers: dict[str, str], payload_hash: str, n: int) -> UploadBody:
    return UploadBody(
        verifier=BodyVerifier.from_headers(headers, payload_hash), decoder=None, expected_bytes=n
    )


def test_a_delegated_signed_payload_is_checked_by_verify_on_what_the_caller_fed() -> None:
    good = hashlib.sha256(BODY).hexdigest()
    out, hashers = run(plain({}, good, len(BODY)), BODY)
    assert out == BODY and len(hashers) == 1
    with pytest.raises(XAmzContentSHA256Mismatch):
        run(plain({}, good, len(BODY)), BODY[:-1] + b"!")
    # The verifier itself no longer hashes: hashers the caller did not feed see an empty body.
    with pytest.raises(XAmzContentSHA256Mismatch):
        run(plain({}, good, len(BODY)), BODY, feed_hashers=False)


def test_finish_of_a_delegated_body_checks_the_length_but_leaves_the_hashes_to_verify() -> None:
    wrong = {"x-amz-checksum-crc32": crc32_b64(b"other")}
    body = plain(wrong, UNSIGNED_PAYLOAD, len(BODY))
    body.delegate_hashing()
    for _ in body.feed(BODY):
        pass
    body.finish()  # no BadDigest yet: nothing was verified
    with pytest.raises(BadDigest):
        body.verify()
    short = plain({}, UNSIGNED_PAYLOAD, len(BODY) + 1)
    short.delegate_hashing()
    list(short.feed(BODY))
    with pytest.raises(IncompleteBody):
        short.finish()


def test_a_trailer_checksum_is_kept_from_finish_for_verify() -> None:
    decoder = AwsChunkedDecoder(chain=None, trailer_names=("x-amz-checksum-crc32",), decoded_length=len(BODY))
    headers = {"x-amz-trailer": "x-amz-checksum-crc32", "x-amz-sdk-checksum-algorithm": "CRC32"}
    verifier = BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER)
    body = UploadBody(verifier=verifier, decoder=decoder, expected_bytes=len(BODY))
    out, _ = run(body, framed(BODY, crc32_b64(BODY)))
    assert out == BODY
    assert body.verified_checksum == ("x-amz-checksum-crc32", crc32_b64(BODY))

    decoder = AwsChunkedDecoder(chain=None, trailer_names=("x-amz-checksum-crc32",), decoded_length=len(BODY))
    bad = UploadBody(
        verifier=BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER),
        decoder=decoder,
        expected_bytes=len(BODY),
    )
    with pytest.raises(BadDigest):
        run(bad, framed(BODY, crc32_b64(BODY + b"x")))


def test_delegation_is_only_before_the_body_and_verify_only_for_a_delegated_finished_one() -> None:
    started = plain({"x-amz-checksum-crc32": crc32_b64(BODY)}, UNSIGNED_PAYLOAD, len(BODY))
    list(started.feed(BODY[:100]))
    with pytest.raises(AssertionError):
        started.delegate_hashing()
    not_delegated = plain({}, UNSIGNED_PAYLOAD, len(BODY))
    list(not_delegated.feed(BODY))
    not_delegated.finish()
    with pytest.raises(AssertionError):
        not_delegated.verify()
    unfinished = plain({}, UNSIGNED_PAYLOAD, len(BODY))
    unfinished.delegate_hashing()
    with pytest.raises(AssertionError):
        unfinished.verify()
