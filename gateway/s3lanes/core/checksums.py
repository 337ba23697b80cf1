"""Checksums and digests of a request body, computed as it streams and checked at its end.

Theory of operation
-------------------
A request can promise up to three things about its (decoded) body: its SHA-256 (``x-amz-content-sha256``
as hex), its MD5 (``Content-MD5``, base64) and one "flexible checksum" (CRC32, CRC32C, CRC64NVME, SHA1
or SHA256, base64 of the big-endian value) sent either as an ``x-amz-checksum-<alg>`` header or, for
aws-chunked bodies, as a trailer announced in ``x-amz-trailer``. :class:`BodyVerifier` validates the form
of every promise up front (:meth:`BodyVerifier.from_headers`), is fed the payload piece by piece
(:meth:`~BodyVerifier.update`; only the hashes actually promised are computed) and checks every promise
at the end (:meth:`~BodyVerifier.finish`, given the trailers the aws-chunked decoder returned).

Errors, as S3 answers them: a malformed ``Content-MD5`` is ``InvalidDigest``; a malformed
``x-amz-content-sha256`` is ``InvalidArgument``; an unknown algorithm, a malformed checksum value, two
checksum headers, or an ``x-amz-sdk-checksum-algorithm`` that disagrees with the value sent is
``InvalidRequest``; a promised trailer that never came is ``MalformedTrailerError`` (S3's code for it; see
versity/versitygw#1600); a mismatch is ``XAmzContentSHA256Mismatch`` or ``BadDigest``.

CRC32C and CRC64NVME come from ``awscrt`` (what botocore uses too), the others from the standard library.
Nothing here does I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from awscrt import checksums as crt_checksums

from s3lanes.core.sigv4 import PAYLOAD_LITERALS
from s3lanes.errors import (
    BadDigest,
    InvalidArgument,
    InvalidDigest,
    InvalidRequest,
    MalformedTrailerError,
    XAmzContentSHA256Mismatch,
)

ALGORITHMS: tuple[str, ...] = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
CHECKSUM_HEADER_PREFIX = "x-amz-checksum-"
DIGEST_BYTES: Mapping[str, int] = {"CRC32": 4, "CRC32C": 4, "CRC64NVME": 8, "SHA1": 20, "SHA256": 32}

# x-amz-checksum-* headers that are not checksum values (CreateMultipartUpload, GetObject).
_NOT_VALUE_HEADERS = frozenset({"x-amz-checksum-algorithm", "x-amz-checksum-type", "x-amz-checksum-mode"})
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_MSG_UNSUPPORTED = (
    "Checksum algorithm provided is unsupported. Please try again with any of the valid types: "
    "[CRC32, CRC32C, CRC64NVME, SHA1, SHA256]"
)
_MSG_SINGLE_CHECKSUM = "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
_MSG_BAD_PAYLOAD_HASH = (
    "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a valid sha256 value."
)


class Checksum:
    """An incremental checksum; :meth:`digest_b64` is what S3 sends and expects in ``x-amz-checksum-*``."""

    algorithm: str = ""

    def update(self, data: bytes) -> None:  # pragma: no cover - abstract: every algorithm overrides it
        raise NotImplementedError

    def digest(self) -> bytes:  # pragma: no cover - abstract: every algorithm overrides it
        raise NotImplementedError

    def digest_b64(self) -> str:
        return base64.b64encode(self.digest()).decode("ascii")


def _crc32c(data: bytes, crc: int) -> int:
    return int(crt_checksums.crc32c(bytes(data), crc))


def _crc64nvme(data: bytes, crc: int) -> int:
    return int(crt_checksums.crc64nvme(bytes(data), crc))


# Each CRC: its step (data, crc so far -> crc); its digest is the CRC in DIGEST_BYTES bytes, big-endian.
_CRC_STEPS: Mapping[str, Callable[[bytes, int], int]] = {
    "CRC32": zlib.crc32,
    "CRC32C": _crc32c,
    "CRC64NVME": _crc64nvme,
}


class _Crc(Checksum):
    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._step = _CRC_STEPS[algorithm]
        self._crc = 0

    def update(self, data: bytes) -> None:
        self._crc = self._step(data, self._crc)

    def digest(self) -> bytes:
        return self._crc.to_bytes(DIGEST_BYTES[self.algorithm], "big")


class _Hashlib(Checksum):
    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._hash = hashlib.new(algorithm.lower())

    def update(self, data: bytes) -> None:
        self._hash.update(data)

    def digest(self) -> bytes:
        return self._hash.digest()


def _normalise(algorithm: str) -> str:
    name = algorithm.strip().upper()
    if name not in ALGORITHMS:
        raise InvalidRequest(_MSG_UNSUPPORTED)
    return name


def header_for(algorithm: str) -> str:
    """The header (or trailer) carrying ``algorithm``'s value: ``"CRC32"`` -> ``"x-amz-checksum-crc32"``."""
    return CHECKSUM_HEADER_PREFIX + _normalise(algorithm).lower()


def new_checksum(algorithm: str) -> Checksum:
    """A fresh incremental checksum for one of :data:`ALGORITHMS` (any case); else ``InvalidRequest``."""
    name = _normalise(algorithm)
    return _Crc(name) if name in _CRC_STEPS else _Hashlib(name)


def _valid_b64_digest(value: str, algorithm: str) -> bool:
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False
    return len(raw) == DIGEST_BYTES[algorithm]


def check_content_md5(expected_b64: str, digest: bytes) -> None:
    """``BadDigest`` unless ``digest`` (the 16 bytes of the body's MD5) is what ``Content-MD5`` said."""
    computed = base64.b64encode(digest).decode("ascii")
    if computed != expected_b64:
        raise BadDigest(
            "The Content-MD5 you specified did not match what we received.",
            ExpectedDigest=expected_b64,
            CalculatedDigest=computed,
        )


class BodyVerifier:
    """Feeds on the decoded payload; at the end checks everything the request promised about it.

    It is *not* an authenticator: a SHA-256 that matches proves integrity only because the signature
    covered it (or the chunk signatures did, in streaming mode).
    """

    def __init__(
        self,
        *,
        sha256_hex: str | None,
        content_md5_b64: str | None,
        checksum_algorithm: str | None,
        checksum_b64: str | None,
        expect_checksum_in_trailer: bool,
    ) -> None:
        if sha256_hex is not None and not _HEX64.fullmatch(sha256_hex):
            raise InvalidArgument(
                _MSG_BAD_PAYLOAD_HASH, ArgumentName="x-amz-content-sha256", ArgumentValue=sha256_hex
            )
        if content_md5_b64 is not None:
            try:
                md5_ok = len(base64.b64decode(content_md5_b64.encode("ascii"), validate=True)) == 16
            except (binascii.Error, UnicodeEncodeError, ValueError):
                md5_ok = False
            if not md5_ok:
                raise InvalidDigest("The Content-MD5 you specified was not valid.")
        algorithm = _normalise(checksum_algorithm) if checksum_algorithm is not None else None
        if algorithm is None and (checksum_b64 is not None or expect_checksum_in_trailer):
            raise ValueError("a checksum value or trailer needs checksum_algorithm")
        if algorithm is not None and checksum_b64 is not None:
            if expect_checksum_in_trailer:
                raise ValueError("a checksum comes either as a header or as a trailer, not both")
            if not _valid_b64_digest(checksum_b64, algorithm):
                raise InvalidRequest(f"Value for {header_for(algorithm)} header is invalid.")

        self._sha256_expected = sha256_hex.lower() if sha256_hex is not None else None
        self._md5_expected = content_md5_b64
        self._algorithm = algorithm
        self._checksum_expected = checksum_b64
        self._checksum_in_trailer = expect_checksum_in_trailer and algorithm is not None

        self._sha256 = hashlib.sha256() if self._sha256_expected is not None else None
        self._md5 = hashlib.md5(usedforsecurity=False) if content_md5_b64 is not None else None
        verifies_checksum = checksum_b64 is not None or self._checksum_in_trailer
        self._checksum = new_checksum(algorithm) if algorithm is not None and verifies_checksum else None
        self._verified_checksum: tuple[str, str] | None = None
        self._fed = False
        self._delegated = False

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], payload_hash: str) -> BodyVerifier:
        """Build from request headers (lower-case names) and the request's payload hash.

        Reads ``content-md5``, ``x-amz-sdk-checksum-algorithm``, ``x-amz-checksum-*`` and ``x-amz-trailer``.
        ``payload_hash`` is :attr:`AuthInfo.payload_hash <s3lanes.core.sigv4.AuthInfo.payload_hash>` (or the
        ``x-amz-content-sha256`` header of an anonymous request, ``UNSIGNED-PAYLOAD`` if absent).
        """
        hdrs = {name.lower(): value for name, value in headers.items()}
        if payload_hash in PAYLOAD_LITERALS:
            sha256_hex = None
        elif _HEX64.fullmatch(payload_hash):
            sha256_hex = payload_hash
        else:
            raise InvalidArgument(
                _MSG_BAD_PAYLOAD_HASH, ArgumentName="x-amz-content-sha256", ArgumentValue=payload_hash
            )

        value_headers = [
            name
            for name in hdrs
            if name.startswith(CHECKSUM_HEADER_PREFIX)
            and name not in _NOT_VALUE_HEADERS
            and name[len(CHECKSUM_HEADER_PREFIX) :].upper() in ALGORITHMS
        ]
        if len(value_headers) > 1:
            raise InvalidRequest(_MSG_SINGLE_CHECKSUM)

        trailer_algorithm: str | None = None
        trailer_header = hdrs.get("x-amz-trailer")
        if trailer_header is not None:
            for name in (part.strip().lower() for part in trailer_header.split(",")):
                if not name:
                    continue
                algorithm = name[len(CHECKSUM_HEADER_PREFIX) :].upper()
                if (
                    not name.startswith(CHECKSUM_HEADER_PREFIX)
                    or algorithm not in ALGORITHMS
                    or trailer_algorithm is not None
                ):
                    raise InvalidRequest("The value specified in the x-amz-trailer header is not supported")
                trailer_algorithm = algorithm
        if trailer_algorithm is not None and value_headers:
            raise InvalidRequest(_MSG_SINGLE_CHECKSUM)

        value_algorithm = value_headers[0][len(CHECKSUM_HEADER_PREFIX) :].upper() if value_headers else None
        promised = value_algorithm or trailer_algorithm
        sdk_algorithm = hdrs.get("x-amz-sdk-checksum-algorithm")
        if sdk_algorithm is not None:
            sdk_name = _normalise(sdk_algorithm)
            if promised is not None and sdk_name != promised:
                raise InvalidRequest("Value for x-amz-sdk-checksum-algorithm header is invalid.")

        return cls(
            sha256_hex=sha256_hex,
            content_md5_b64=hdrs.get("content-md5"),
            checksum_algorithm=promised,
            checksum_b64=hdrs[value_headers[0]] if value_headers else None,
            expect_checksum_in_trailer=trailer_algorithm is not None,
        )

    @property
    def computes_anything(self) -> bool:
        """False when the request promised nothing, so the shell can skip feeding the body."""
        return self._sha256 is not None or self._md5 is not None or self._checksum is not None

    @property
    def checksum_algorithm(self) -> str | None:
        return self._algorithm

    @property
    def checksum_in_trailer(self) -> bool:
        return self._checksum_in_trailer

    @property
    def verified_checksum(self) -> tuple[str, str] | None:
        """After a successful :meth:`finish`: ``(header name, base64 value)`` of the checksum checked."""
        return self._verified_checksum

    def take_md5_check(self) -> str | None:
        """For a caller that computes the body's MD5 anyway (the spool does, for the ETag): stop hashing
        for ``Content-MD5`` here and return its expected value (None if the request sent none), which the
        caller must check with :func:`check_content_md5` before it acknowledges anything. Only before the
        first :meth:`update`."""
        if self._fed:
            raise AssertionError("take_md5_check() after the body started")
        expected, self._md5_expected, self._md5 = self._md5_expected, None, None
        return expected

    def delegate_hashing(self) -> list[Any]:
        """For a caller that hashes the body on a thread of its own (the spool, with its MD5 for the ETag,
        as it writes): the hash objects this verifier needs fed (SHA-256, MD5, checksum), in no particular
        order. From now on :meth:`update` leaves them alone; the caller feeds each of them every byte of the
        body, in order, and calls :meth:`finish` only after the last one, which then checks them as usual.
        Only before the first :meth:`update`."""
        if self._fed:
            raise AssertionError("delegate_hashing() after the body started")
        self._delegated = True
        return [h for h in (self._sha256, self._md5, self._checksum) if h is not None]

    def update(self, data: bytes) -> None:
        self._fed = True
        if self._delegated:
            return
        if self._sha256 is not None:
            self._sha256.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        if self._checksum is not None:
            self._checksum.update(data)

    def finish(self, trailers: Mapping[str, str]) -> None:
        """Check every promise; ``trailers`` come from the aws-chunked decoder (``{}`` otherwise)."""
        if self._sha256 is not None and self._sha256_expected is not None:
            computed = self._sha256.hexdigest()
            if computed != self._sha256_expected:
                raise XAmzContentSHA256Mismatch(
                    ClientComputedContentSHA256=self._sha256_expected, S3ComputedContentSHA256=computed
                )
        if self._md5 is not None and self._md5_expected is not None:
            check_content_md5(self._md5_expected, self._md5.digest())
        if self._checksum is None or self._algorithm is None:
            return
        name = header_for(self._algorithm)
        expected = self._checksum_expected
        if self._checksum_in_trailer:
            expected = {key.lower(): value for key, value in trailers.items()}.get(name)
            if expected is None:
                raise MalformedTrailerError(f"The request promised the trailer {name} but did not send it.")
            if not _valid_b64_digest(expected, self._algorithm):
                raise InvalidRequest(f"Value for {name} trailing header is invalid.")
        computed_b64 = self._checksum.digest_b64()
        if computed_b64 != expected:
            raise BadDigest(f"The {self._algorithm} you specified did not match the calculated checksum.")
        self._verified_checksum = (name, computed_b64)


# -- checksums of multipart objects ------------------------------------------------------------------------
#
# A multipart upload created with ``x-amz-checksum-algorithm`` has one checksum per part and one for the
# object, of one of two types (``x-amz-checksum-type``):
#
# * COMPOSITE (the default; not with CRC64NVME): the checksum of the concatenated binary part checksums,
#   shown as ``<base64>-<number of parts>``;
# * FULL_OBJECT (CRC algorithms only; the default for CRC64NVME): the CRC of the whole object, computed from
#   the part CRCs and sizes (CRC combination: zlib's ``crc32_combine``, for any reflected CRC whose initial
#   value and final XOR are all ones, as CRC32, CRC32C and CRC64NVME are).

COMPOSITE = "COMPOSITE"
FULL_OBJECT = "FULL_OBJECT"
# Reflected generator polynomial and width of each CRC algorithm.
_CRC_POLY: Mapping[str, tuple[int, int]] = {
    "CRC32": (0xEDB88320, 32),
    "CRC32C": (0x82F63B78, 32),
    "CRC64NVME": (0x9A6C9329AC4BC9B5, 64),
}
_X2N_TABLES: dict[str, list[int]] = {}


def _multmodp(a: int, b: int, poly: int, width: int) -> int:
    """a * b modulo the polynomial, in the reflected bit order (zlib's ``multmodp``)."""
    m = 1 << (width - 1)
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                break
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1
    return p


def _x8nmodp(nbytes: int, algorithm: str) -> int:
    """x^(8 * nbytes) modulo the polynomial of ``algorithm``."""
    poly, width = _CRC_POLY[algorithm]
    table = _X2N_TABLES.get(algorithm)
    if table is None:
        table = []
        p = 1 << (width - 2)  # x^1
        for _ in range(64):
            table.append(p)
            p = _multmodp(p, p, poly, width)
        _X2N_TABLES[algorithm] = table
    p = 1 << (width - 1)  # x^0
    k = 3
    n = nbytes
    while n:
        if n & 1:
            p = _multmodp(table[k % 64], p, poly, width)
        n >>= 1
        k += 1
    return p


def crc_combine(algorithm: str, crc1: int, crc2: int, len2: int) -> int:
    """The CRC of A + B from ``crc1`` = CRC(A), ``crc2`` = CRC(B) and ``len2`` = len(B) in bytes."""
    poly, width = _CRC_POLY[algorithm]
    return _multmodp(_x8nmodp(len2, algorithm), crc1, poly, width) ^ crc2


def upload_checksum(algorithm: str | None, checksum_type: str | None) -> tuple[str, str] | None:
    """``(algorithm, type)`` of a CreateMultipartUpload's ``x-amz-checksum-algorithm``/``-type``, or None
    without an algorithm (a type alone is ignored, as the store does). An unknown algorithm or type,
    FULL_OBJECT with a SHA algorithm, or COMPOSITE with CRC64NVME is ``InvalidRequest``."""
    if algorithm is None:
        return None
    name = _normalise(algorithm)
    if checksum_type is None or not checksum_type.strip():
        kind = FULL_OBJECT if name == "CRC64NVME" else COMPOSITE
    else:
        kind = checksum_type.strip().upper()
        if kind not in (COMPOSITE, FULL_OBJECT):
            raise InvalidRequest("Value for x-amz-checksum-type header is invalid.")
    if kind == FULL_OBJECT and name not in _CRC_POLY:
        raise InvalidRequest(
            f"The {FULL_OBJECT} checksum type cannot be used with the {name.lower()} algorithm."
        )
    if kind == COMPOSITE and name == "CRC64NVME":
        raise InvalidRequest(f"The {COMPOSITE} checksum type cannot be used with the crc64nvme algorithm.")
    return name, kind


def multipart_checksum(
    algorithm: str, checksum_type: str, part_checksums: Sequence[str], part_sizes: Sequence[int]
) -> str:
    """The object checksum (base64; a COMPOSITE one ends in ``-<parts>``) from each part's base64 checksum."""
    raw = [base64.b64decode(value) for value in part_checksums]
    if checksum_type == FULL_OBJECT:
        width_bytes = DIGEST_BYTES[algorithm]
        crc = 0
        for digest, size in zip(raw, part_sizes, strict=True):
            crc = crc_combine(algorithm, crc, int.from_bytes(digest, "big"), size)
        return base64.b64encode(crc.to_bytes(width_bytes, "big")).decode("ascii")
    whole = new_checksum(algorithm)
    whole.update(b"".join(raw))
    return f"{whole.digest_b64()}-{len(raw)}"


def is_checksum_value_header(name: str) -> bool:
    """``x-amz-checksum-crc32`` and the like (lower-case names), not ``-algorithm``/``-type``/``-mode``."""
    return (
        name.startswith(CHECKSUM_HEADER_PREFIX)
        and name not in _NOT_VALUE_HEADERS
        and name[len(CHECKSUM_HEADER_PREFIX) :].upper() in ALGORITHMS
    )


def without_aws_chunked(value: str) -> str:
    """A Content-Encoding without the ``aws-chunked`` coding of the transfer; byte-exact otherwise (S3 keeps
    ``deflate, gzip`` as sent). Empty if aws-chunked was all it named."""
    codings = [c.strip() for c in value.split(",")]
    if not any(c.lower() == "aws-chunked" for c in codings):
        return value
    return ",".join(c for c in codings if c and c.lower() != "aws-chunked")
