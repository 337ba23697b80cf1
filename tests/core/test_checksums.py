"""Checksums and body verification, against botocore's own checksum implementations."""

from __future__ import annotations

import base64
import hashlib
import zlib

import botocore.httpchecksum as boto_checksums
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core.checksums import ALGORITHMS, BodyVerifier, check_content_md5, header_for, new_checksum
from s3lanes.core.sigv4 import STREAMING_SIGNED, STREAMING_UNSIGNED_TRAILER, UNSIGNED_PAYLOAD
from s3lanes.errors import (
    BadDigest,
    InvalidArgument,
    InvalidDigest,
    InvalidRequest,
    MalformedTrailerError,
    XAmzContentSHA256Mismatch,
)
from tests.budget import examples

BODY = b"The quick brown fox jumps over the lazy dog" * 100


def botocore_b64(algorithm: str, data: bytes) -> str:
    checksum = boto_checksums._CHECKSUM_CLS[algorithm.lower()]()
    checksum.update(data)
    return str(checksum.b64digest())


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


# --------------------------------------------------------------------------------------------------
# Checksums


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_empty_checksum_matches_botocore(algorithm: str) -> None:
    assert new_checksum(algorithm).digest_b64() == botocore_b64(algorithm, b"")


@settings(max_examples=examples(200), deadline=None)
@given(
    algorithm=st.sampled_from(ALGORITHMS),
    data=st.binary(max_size=5000),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
)
def test_incremental_checksum_matches_botocore(algorithm: str, data: bytes, cuts: list[int]) -> None:
    checksum = new_checksum(algorithm)
    start = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        checksum.update(data[start:cut])
        start = cut
    assert checksum.digest_b64() == botocore_b64(algorithm, data)


def test_crc32_is_zlib_crc32_big_endian() -> None:
    checksum = new_checksum("crc32")
    checksum.update(BODY)
    assert checksum.digest() == zlib.crc32(BODY).to_bytes(4, "big")


def test_known_values() -> None:
    # CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720 / iSCSI); CRC-32 is 0xCBF43926.
    crc32c = new_checksum("CRC32C")
    crc32c.update(b"123456789")
    assert crc32c.digest().hex() == "e3069283"
    crc32 = new_checksum("CRC32")
    crc32.update(b"123456789")
    assert crc32.digest().hex() == "cbf43926"


@pytest.mark.parametrize(
    ("algorithm", "header"),
    [
        ("CRC32", "x-amz-checksum-crc32"),
        ("crc32c", "x-amz-checksum-crc32c"),
        ("CRC64NVME", "x-amz-checksum-crc64nvme"),
        ("Sha1", "x-amz-checksum-sha1"),
        ("SHA256", "x-amz-checksum-sha256"),
    ],
)
def test_header_for(algorithm: str, header: str) -> None:
    assert header_for(algorithm) == header


@pytest.mark.parametrize("algorithm", ["MD5", "CRC64", "", "sha-256"])
def test_unknown_algorithm_is_invalid_request(algorithm: str) -> None:
    with pytest.raises(InvalidRequest):
        new_checksum(algorithm)
    with pytest.raises(InvalidRequest):
        header_for(algorithm)


# --------------------------------------------------------------------------------------------------
# BodyVerifier


def verified(verifier: BodyVerifier, data: bytes, trailers: dict[str, str] | None = None) -> BodyVerifier:
    for start in range(0, len(data), 1000):
        verifier.update(data[start : start + 1000])
    verifier.finish(trailers or {})
    return verifier


def test_nothing_promised_computes_nothing() -> None:
    verifier = BodyVerifier.from_headers({}, UNSIGNED_PAYLOAD)
    assert not verifier.computes_anything
    verified(verifier, BODY)
    assert verifier.verified_checksum is None


def test_sdk_algorithm_alone_promises_nothing() -> None:
    assert not BodyVerifier.from_headers(
        {"x-amz-sdk-checksum-algorithm": "CRC32"}, UNSIGNED_PAYLOAD
    ).computes_anything


def test_streaming_payload_hash_is_not_a_body_hash() -> None:
    assert not BodyVerifier.from_headers({}, STREAMING_SIGNED).computes_anything


def test_payload_sha256_is_checked() -> None:
    good = hashlib.sha256(BODY).hexdigest()
    verifier = BodyVerifier.from_headers({}, good)
    assert verifier.computes_anything
    verified(verifier, BODY)
    verified(BodyVerifier.from_headers({}, good.upper()), BODY)
    with pytest.raises(XAmzContentSHA256Mismatch) as caught:
        verified(BodyVerifier.from_headers({}, good), BODY + b"!")
    assert caught.value.extra == {
        "ClientComputedContentSHA256": good,
        "S3ComputedContentSHA256": hashlib.sha256(BODY + b"!").hexdigest(),
    }


@pytest.mark.parametrize(
    "payload_hash", ["UNSIGNED", "abc", "g" * 64, "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"]
)
def test_malformed_payload_hash_is_invalid_argument(payload_hash: str) -> None:
    with pytest.raises(InvalidArgument):
        BodyVerifier.from_headers({}, payload_hash)


def test_content_md5_is_checked() -> None:
    verified(BodyVerifier.from_headers({"content-md5": md5_b64(BODY)}, UNSIGNED_PAYLOAD), BODY)
    with pytest.raises(BadDigest) as caught:
        verified(BodyVerifier.from_headers({"content-md5": md5_b64(b"other")}, UNSIGNED_PAYLOAD), BODY)
    assert caught.value.message == "The Content-MD5 you specified did not match what we received."


def test_a_taken_md5_check_is_the_callers_and_the_rest_is_still_verified() -> None:
    crc = base64.b64encode(zlib.crc32(BODY).to_bytes(4, "big")).decode()
    headers = {"content-md5": md5_b64(b"other"), "x-amz-checksum-crc32": crc}
    verifier = BodyVerifier.from_headers(headers, UNSIGNED_PAYLOAD)
    assert verifier.take_md5_check() == md5_b64(b"other")
    verified(verifier, BODY)  # the wrong Content-MD5 is no longer this verifier's to check ...
    with pytest.raises(BadDigest) as caught:  # ... but the caller's, with the digest it computed
        check_content_md5(md5_b64(b"other"), hashlib.md5(BODY).digest())
    assert caught.value.extra == {"ExpectedDigest": md5_b64(b"other"), "CalculatedDigest": md5_b64(BODY)}
    check_content_md5(md5_b64(BODY), hashlib.md5(BODY).digest())
    # The other promises stay: a wrong CRC32 still fails here.
    wrong = base64.b64encode((zlib.crc32(BODY) ^ 1).to_bytes(4, "big")).decode()
    bad_crc = BodyVerifier.from_headers({**headers, "x-amz-checksum-crc32": wrong}, UNSIGNED_PAYLOAD)
    bad_crc.take_md5_check()
    with pytest.raises(BadDigest):
        verified(bad_crc, BODY)
    # No Content-MD5: nothing to take; and taking it once the body started is a bug.
    assert BodyVerifier.from_headers({}, UNSIGNED_PAYLOAD).take_md5_check() is None
    started = BodyVerifier.from_headers({"content-md5": md5_b64(BODY)}, UNSIGNED_PAYLOAD)
    started.update(BODY[:10])
    with pytest.raises(AssertionError):
        started.take_md5_check()


@pytest.mark.parametrize("value", ["", "not base64!", "AAAA", base64.b64encode(b"x" * 17).decode(), "ü"])
def test_malformed_content_md5_is_invalid_digest(value: str) -> None:
    with pytest.raises(InvalidDigest):
        BodyVerifier.from_headers({"content-md5": value}, UNSIGNED_PAYLOAD)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_checksum_header_is_checked(algorithm: str) -> None:
    header = header_for(algorithm)
    headers = {header: botocore_b64(algorithm, BODY), "x-amz-sdk-checksum-algorithm": algorithm}
    verifier = verified(BodyVerifier.from_headers(headers, UNSIGNED_PAYLOAD), BODY)
    assert verifier.verified_checksum == (header, headers[header])
    with pytest.raises(BadDigest) as caught:
        verified(BodyVerifier.from_headers(headers, UNSIGNED_PAYLOAD), BODY[:-1])
    assert caught.value.message == f"The {algorithm} you specified did not match the calculated checksum."


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_checksum_trailer_is_checked(algorithm: str) -> None:
    header = header_for(algorithm)
    headers = {"x-amz-trailer": header, "x-amz-sdk-checksum-algorithm": algorithm.lower()}
    trailers = {header: botocore_b64(algorithm, BODY)}
    verified(BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER), BODY, trailers)
    with pytest.raises(BadDigest):
        verified(BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER), BODY + b"x", trailers)
    with pytest.raises(MalformedTrailerError):
        verified(BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER), BODY, {})
    with pytest.raises(InvalidRequest) as caught:
        verified(BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER), BODY, {header: "AAAA"})
    assert caught.value.message == f"Value for {header} trailing header is invalid."


@pytest.mark.parametrize("value", ["", "AAAA", "AAAAAAAA", "!!!!!!==", "AAAAAA=="[:-1]])
def test_malformed_checksum_header_is_invalid_request(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        BodyVerifier.from_headers({"x-amz-checksum-crc32": value}, UNSIGNED_PAYLOAD)
    assert caught.value.message == "Value for x-amz-checksum-crc32 header is invalid."


def test_two_checksum_headers_are_invalid_request() -> None:
    headers = {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-crc32c": "AAAAAA=="}
    with pytest.raises(InvalidRequest):
        BodyVerifier.from_headers(headers, UNSIGNED_PAYLOAD)


def test_checksum_header_and_trailer_together_are_invalid_request() -> None:
    headers = {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-trailer": "x-amz-checksum-crc32"}
    with pytest.raises(InvalidRequest):
        BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER)


@pytest.mark.parametrize(
    "headers",
    [
        {"x-amz-sdk-checksum-algorithm": "CRC32", "x-amz-checksum-crc32c": "AAAAAA=="},
        {"x-amz-sdk-checksum-algorithm": "SHA1", "x-amz-trailer": "x-amz-checksum-crc32"},
        {"x-amz-sdk-checksum-algorithm": "MD5"},
    ],
)
def test_sdk_algorithm_must_agree_with_the_value_sent(headers: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest):
        BodyVerifier.from_headers(headers, STREAMING_UNSIGNED_TRAILER)


@pytest.mark.parametrize(
    "trailer", ["x-amz-checksum-md5", "content-md5", "x-amz-checksum-crc32,x-amz-checksum-sha1"]
)
def test_unsupported_trailer_is_invalid_request(trailer: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        BodyVerifier.from_headers({"x-amz-trailer": trailer}, STREAMING_UNSIGNED_TRAILER)
    assert caught.value.message == "The value specified in the x-amz-trailer header is not supported"


def test_non_value_checksum_headers_are_ignored() -> None:
    headers = {
        "x-amz-checksum-algorithm": "CRC32",
        "x-amz-checksum-type": "FULL_OBJECT",
        "x-amz-checksum-mode": "ENABLED",
    }
    assert not BodyVerifier.from_headers(headers, UNSIGNED_PAYLOAD).computes_anything


def test_everything_at_once() -> None:
    headers = {
        "content-md5": md5_b64(BODY),
        "x-amz-checksum-sha256": botocore_b64("sha256", BODY),
        "x-amz-sdk-checksum-algorithm": "SHA256",
    }
    verified(BodyVerifier.from_headers(headers, hashlib.sha256(BODY).hexdigest()), BODY)


def test_contradictory_constructor_arguments_are_a_bug() -> None:
    with pytest.raises(ValueError):
        BodyVerifier(
            sha256_hex=None,
            content_md5_b64=None,
            checksum_algorithm=None,
            checksum_b64="AAAAAA==",
            expect_checksum_in_trailer=False,
        )
