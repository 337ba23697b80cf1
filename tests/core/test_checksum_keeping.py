"""Checksums the spool keeps: multipart object checksums (composite and full-object), the upload's
algorithm and type, part checksums in journal records (and records written before they existed), and the
CompleteMultipartUpload checks of part and object checksums. No I/O."""

from __future__ import annotations

import base64
import hashlib
import zlib
from typing import Any

import pytest
from awscrt import checksums as crt_checksums
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core.checksums import (
    crc_combine,
    is_checksum_value_header,
    multipart_checksum,
    new_checksum,
    upload_checksum,
    without_aws_chunked,
)
from s3lanes.core.journal_records import Complete
from s3lanes.core.s3docs import complete_multipart_checksums
from s3lanes.core.spool_state import MIN_PART_BYTES, Origin, SpoolState, object_checksum
from s3lanes.errors import BadDigest, InvalidRequest
from tests.budget import examples

WALL = 1_700_000_000.0
_CRC = {
    "CRC32": lambda d: zlib.crc32(d),
    "CRC32C": lambda d: int(crt_checksums.crc32c(d)),
    "CRC64NVME": lambda d: int(crt_checksums.crc64nvme(d)),
}


def b64(data: bytes, algorithm: str) -> str:
    c = new_checksum(algorithm)
    c.update(data)
    return c.digest_b64()


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(sorted(_CRC)), st.binary(max_size=300), st.binary(max_size=300))
def test_crc_combine_is_the_crc_of_the_concatenation(algorithm: str, a: bytes, b: bytes) -> None:
    crc = _CRC[algorithm]
    assert crc_combine(algorithm, crc(a), crc(b), len(b)) == crc(a + b)


def test_composite_checksum_is_the_checksum_of_the_part_checksums_with_the_part_count() -> None:
    parts = [b"a" * 10, b"b" * 3, b""]
    for algorithm in ("CRC32", "CRC32C", "SHA1", "SHA256"):
        raw = b"".join(base64.b64decode(b64(p, algorithm)) for p in parts)
        expected = b64(raw, algorithm) + "-3"
        got = multipart_checksum(algorithm, "COMPOSITE", [b64(p, algorithm) for p in parts], [10, 3, 0])
        assert got == expected
    # The value SeaweedFS answered for CRC32 parts of 5 MiB of zeros and b"tail".
    assert multipart_checksum("SHA256", "COMPOSITE", [b64(b"x", "SHA256")], [1]).endswith("-1")


def test_full_object_checksum_is_the_crc_of_the_whole_object() -> None:
    parts = [bytes(range(256)) * 40, b"tail", b"\x00" * 7]
    for algorithm in ("CRC32", "CRC32C", "CRC64NVME"):
        got = multipart_checksum(
            algorithm, "FULL_OBJECT", [b64(p, algorithm) for p in parts], [len(p) for p in parts]
        )
        assert got == b64(b"".join(parts), algorithm)


@pytest.mark.parametrize(
    ("algorithm", "kind", "expected"),
    [
        ("CRC32", None, ("CRC32", "COMPOSITE")),
        ("crc32", "full_object", ("CRC32", "FULL_OBJECT")),
        ("CRC64NVME", None, ("CRC64NVME", "FULL_OBJECT")),
        ("SHA256", "COMPOSITE", ("SHA256", "COMPOSITE")),
        (None, "FULL_OBJECT", None),
        (None, None, None),
    ],
)
def test_upload_checksum_defaults_and_normalises_as_the_store(
    algorithm: str | None, kind: str | None, expected: Any
) -> None:
    assert upload_checksum(algorithm, kind) == expected


@pytest.mark.parametrize(
    ("algorithm", "kind"),
    [
        ("MD5", None),
        ("CRC32", "BOGUS"),
        ("SHA256", "FULL_OBJECT"),
        ("SHA1", "FULL_OBJECT"),
        ("CRC64NVME", "COMPOSITE"),
    ],
)
def test_upload_checksum_refuses_what_the_store_refuses(algorithm: str, kind: str | None) -> None:
    with pytest.raises(InvalidRequest):
        upload_checksum(algorithm, kind)


def test_checksum_value_headers_and_content_encoding_kept_byte_exact() -> None:
    assert is_checksum_value_header("x-amz-checksum-crc64nvme")
    assert not is_checksum_value_header("x-amz-checksum-type")
    assert not is_checksum_value_header("x-amz-checksum-algorithm")
    assert not is_checksum_value_header("x-amz-checksum-md5")
    assert without_aws_chunked("deflate, gzip") == "deflate, gzip"
    assert without_aws_chunked("aws-chunked, gzip") == "gzip"
    assert without_aws_chunked("aws-chunked") == ""


def test_complete_document_checksums_per_part_in_document_order() -> None:
    doc = (
        b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>e</ETag>"
        b"<ChecksumCRC32>AAAAAA==</ChecksumCRC32></Part><Part><PartNumber>2</PartNumber><ETag>f</ETag></Part>"
        b"</CompleteMultipartUpload>"
    )
    assert complete_multipart_checksums(doc) == [{"CRC32": "AAAAAA=="}, {}]


# -- the spool's records -----------------------------------------------------------------------------------

P1 = b"\x01" * MIN_PART_BYTES
P2 = b"tail"


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _upload(state: SpoolState, algorithm: str | None, kind: str | None, *, checksums: bool = True) -> Any:
    meta: list[tuple[str, str]] = [("x-amz-meta-a", "1")]
    if algorithm:
        meta += [("x-amz-checksum-algorithm", algorithm), ("x-amz-checksum-type", kind or "COMPOSITE")]
    state.apply(
        state.create_upload_record(
            upload_id="u",
            bucket="b",
            key="k",
            meta=sorted(meta),
            origin=Origin("AK", "checkpoint", WALL),
        )
    )
    for number, data in ((1, P1), (2, P2)):
        ck = b64(data, algorithm) if algorithm and checksums else ""
        state.apply(
            SpoolState.part_record(
                upload_id="u", number=number, file=f"f{number}", size=len(data), md5=_md5(data), checksum=ck
            )
        )
    return state.uploads["u"]


def _requested() -> list[tuple[int, str]]:
    return [(1, _md5(P1)), (2, _md5(P2))]


@pytest.mark.parametrize(
    ("algorithm", "kind"), [("CRC32", "COMPOSITE"), ("SHA1", "COMPOSITE"), ("CRC32C", "FULL_OBJECT")]
)
def test_completed_upload_keeps_part_checksums_and_the_object_checksum_survives_compaction(
    algorithm: str, kind: str
) -> None:
    state = SpoolState()
    upload = _upload(state, algorithm, kind)
    parts = [{algorithm: b64(P1, algorithm)}, {algorithm: b64(P2, algorithm)}]
    expected = multipart_checksum(
        algorithm, kind, [b64(P1, algorithm), b64(P2, algorithm)], [len(P1), len(P2)]
    )
    header = f"x-amz-checksum-{algorithm.lower()}"
    rec = state.complete_record(
        upload, _requested(), WALL, part_checksums=parts, object_checksum=(algorithm, expected)
    )
    state.apply(rec)
    entry = state.lookup("b", "k")
    assert entry is not None
    assert entry.part_checksums == (b64(P1, algorithm), b64(P2, algorithm))
    assert entry.checksum == ((header, expected), ("x-amz-checksum-type", kind))
    # The journal rewritten with live records only rebuilds the same entry.
    replayed = SpoolState()
    for r in state.snapshot_records():
        replayed.apply(r)
    again = replayed.lookup("b", "k")
    assert again is not None
    assert (again.part_checksums, again.checksum, again.meta) == (
        entry.part_checksums,
        entry.checksum,
        entry.meta,
    )


def test_open_upload_part_checksums_survive_compaction() -> None:
    state = SpoolState()
    _upload(state, "CRC32", "COMPOSITE")
    replayed = SpoolState()
    for r in state.snapshot_records():
        replayed.apply(r)
    assert [p.checksum for p in replayed.uploads["u"].parts.values()] == [b64(P1, "CRC32"), b64(P2, "CRC32")]


def test_records_from_before_checksums_were_kept_replay_without_any() -> None:
    state = SpoolState()
    state.apply(
        {
            "t": "mpu",
            "seq": 1,
            "b": "b",
            "k": "k",
            "ak": "AK",
            "ln": "checkpoint",
            "at": WALL,
            "u": "u",
            "m": [],
        }
    )
    state.apply({"t": "part", "u": "u", "n": 1, "f": "f1", "sz": 3, "md5": _md5(b"abc")})
    assert state.uploads["u"].parts[1].checksum == ""
    state.apply(state.complete_record(state.uploads["u"], [(1, _md5(b"abc"))], WALL))
    old_put = {
        "t": "put",
        "seq": 9,
        "b": "b",
        "k": "single",
        "ak": "AK",
        "ln": "checkpoint",
        "at": WALL,
        "f": ["f9"],
        "sz": 1,
        "etag": '"x"',
        "m": [["content-type", "text/plain"]],
    }
    state.apply(old_put)
    for key in ("k", "single"):
        entry = state.lookup("b", key)
        assert entry is not None and entry.checksum == () and entry.part_checksums == ()


def test_single_put_checksum_is_read_from_its_kept_headers() -> None:
    meta = (("content-type", "x"), ("x-amz-checksum-sha256", "abc="))
    assert object_checksum(meta, (), ()) == (("x-amz-checksum-sha256", "abc="),)


def test_complete_refuses_missing_or_wrong_part_checksums_and_a_wrong_object_checksum() -> None:
    state = SpoolState()
    upload = _upload(state, "CRC32", "COMPOSITE")
    good = [{"CRC32": b64(P1, "CRC32")}, {"CRC32": b64(P2, "CRC32")}]
    with pytest.raises(InvalidRequest):
        state.complete_record(upload, _requested(), WALL, part_checksums=[{}, good[1]])
    with pytest.raises(InvalidRequest):
        state.complete_record(upload, _requested(), WALL, part_checksums=[{"SHA256": "x"}, good[1]])
    with pytest.raises(BadDigest):
        state.complete_record(upload, _requested(), WALL, part_checksums=[{"CRC32": "AAAAAA=="}, good[1]])
    full = b64(P1 + P2, "CRC32")  # the full-object value, for an upload whose checksum is composite
    for wrong in (("CRC32", full), ("CRC32", "AAAAAA==-2"), ("SHA256", full)):
        with pytest.raises(BadDigest):
            state.complete_record(upload, _requested(), WALL, part_checksums=good, object_checksum=wrong)
    assert "u" in state.uploads  # nothing changed
    rec = state.complete_record(upload, _requested(), WALL, part_checksums=good)
    assert isinstance(rec, Complete)


def test_an_upload_without_an_algorithm_ignores_checksums_in_the_document() -> None:
    state = SpoolState()
    upload = _upload(state, None, None)
    rec = state.complete_record(
        upload,
        _requested(),
        WALL,
        part_checksums=[{"SHA256": "x"}, {}],
        object_checksum=("CRC32", "AAAAAA=="),
    )
    state.apply(rec)
    entry = state.lookup("b", "k")
    assert entry is not None and entry.checksum == ()


def test_a_completion_without_every_part_checksum_leaves_the_object_without_any_algorithm() -> None:
    """An empty checksum element matches a part stored without one: the object then has no checksum, and
    its headers name no algorithm, so the drain does not create an upload it could not complete."""
    state = SpoolState()
    upload = _upload(state, "CRC32", "COMPOSITE", checksums=False)
    rec = state.complete_record(upload, _requested(), WALL, part_checksums=[{"CRC32": ""}, {"CRC32": ""}])
    state.apply(rec)
    entry = state.lookup("b", "k")
    assert entry is not None
    assert (entry.checksum, entry.part_checksums) == ((), ())
    assert entry.meta == (("x-amz-meta-a", "1"),)
