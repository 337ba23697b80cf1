"""The aws-chunked decoder: real SDK bodies, the S3 docs' signed example, any split, truncation, tampering."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence

import botocore.httpchecksum as boto_checksums
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3lanes.core.checksums import BodyVerifier
from s3lanes.core.chunked import (
    MAX_CHUNK_HEADER_BYTES,
    S3_MIN_CHUNK_BYTES,
    AwsChunkedDecoder,
    canonical_trailer,
    encode_aws_chunked,
)
from s3lanes.core.sigv4 import (
    STREAMING_SIGNED_TRAILER,
    AuthInfo,
    ChunkSignatureChain,
    ChunkSigner,
    RequestCredential,
    Verified,
    parse_auth,
    signing_key,
    verify,
)
from s3lanes.errors import (
    IncompleteBody,
    InvalidChunkSizeError,
    MalformedTrailerError,
    S3Error,
    SignatureDoesNotMatch,
)
from tests.budget import examples
from tests.core.test_sigv4 import BOTO_NOW, BOTO_SECRET, BotoCapture, chunked_example_verified


def decode(
    body: bytes,
    *,
    chain: ChunkSignatureChain | None = None,
    trailer_names: tuple[str, ...] = (),
    decoded_length: int | None = None,
    splits: Sequence[int] = (),
    **limits: int,
) -> tuple[bytes, dict[str, str]]:
    """Feed ``body`` cut at ``splits``; return the payload and the trailers."""
    decoder = AwsChunkedDecoder(
        chain=chain, trailer_names=trailer_names, decoded_length=decoded_length, **limits
    )
    out: list[bytes] = []
    start = 0
    for cut in [*sorted(splits), len(body)]:
        out += decoder.feed(body[start:cut])
        start = cut
    trailers = decoder.finish()
    assert decoder.complete or trailers  # complete, or the tolerated missing final CRLF
    return b"".join(out), trailers


def botocore_body(data: bytes, algorithm: str = "crc32", chunk_size: int | None = None) -> bytes:
    """What botocore's AwsChunkedWrapper (STREAMING-UNSIGNED-PAYLOAD-TRAILER) sends for ``data``."""
    wrapper = boto_checksums.AwsChunkedWrapper(
        io.BytesIO(data),
        checksum_cls=boto_checksums._CHECKSUM_CLS[algorithm],
        checksum_name=f"x-amz-checksum-{algorithm}",
        chunk_size=chunk_size,
    )
    return bytes(wrapper.read())


def make_verified(seed: str = "1" * 64) -> Verified:
    key = signing_key("secret", "20240517", "us-east-1", "s3")
    auth = AuthInfo(
        kind="header",
        credential=RequestCredential(
            access_key="AK", scope_date="20240517", region="us-east-1", service="s3"
        ),
        signed_headers=("host",),
        signature=seed,
        amz_date="20240517T093015Z",
        expires_s=None,
        payload_hash=STREAMING_SIGNED_TRAILER,
    )
    return Verified(
        auth=auth, signing_key=key, seed_signature=seed, scope="20240517/us-east-1/s3/aws4_request"
    )


def signer_for(verified: Verified) -> ChunkSigner:
    return ChunkSigner(
        signing_key=verified.signing_key,
        amz_date=verified.auth.amz_date,
        scope=verified.scope,
        seed_signature=verified.seed_signature,
    )


# --------------------------------------------------------------------------------------------------
# Bodies from botocore's AwsChunkedWrapper (STREAMING-UNSIGNED-PAYLOAD-TRAILER)


def test_botocore_empty_body_is_36_bytes_and_decodes() -> None:
    body = botocore_body(b"")
    assert body == b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    assert len(body) == 36
    payload, trailers = decode(body, trailer_names=("x-amz-checksum-crc32",), decoded_length=0)
    assert payload == b""
    assert trailers == {"x-amz-checksum-crc32": "AAAAAA=="}


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "crc64nvme", "sha1", "sha256"])
@pytest.mark.parametrize(
    ("size", "chunk_size"), [(1, 1024), (1023, 1024), (1024, 1024), (5000, 1024), (70_000, None)]
)
def test_botocore_body_decodes_and_its_checksum_verifies(
    algorithm: str, size: int, chunk_size: int | None
) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    body = botocore_body(data, algorithm, chunk_size)
    trailer = f"x-amz-checksum-{algorithm}"
    payload, trailers = decode(body, trailer_names=(trailer,), decoded_length=size)
    assert payload == data
    assert set(trailers) == {trailer}
    verifier = BodyVerifier.from_headers(
        {"x-amz-trailer": trailer, "x-amz-sdk-checksum-algorithm": algorithm.upper()},
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    )
    verifier.update(payload)
    verifier.finish(trailers)
    assert verifier.verified_checksum == (trailer, trailers[trailer])


@pytest.fixture(scope="module", params=["crt", "python"])
def boto_https(request: pytest.FixtureRequest) -> BotoCapture:
    return BotoCapture("https://gw.test", request.param)


@pytest.mark.parametrize("data", [b"", b"hello", b"z" * 3_000_000])
def test_botocore_put_object_over_https_end_to_end(boto_https: BotoCapture, data: bytes) -> None:
    """A real botocore PutObject over https: verify the request, decode the body, check the checksum."""
    capture = boto_https
    with capture.signing():
        capture.client.put_object(Bucket="bucket", Key="k", Body=data)
    req, prepared = capture.last_view()
    assert req.headers["content-encoding"] == "aws-chunked"
    auth = parse_auth(req)
    assert auth is not None
    verify(req, auth, BOTO_SECRET, BOTO_NOW)
    body = prepared.body.read() if hasattr(prepared.body, "read") else prepared.body
    trailer_names = tuple(req.headers["x-amz-trailer"].split(","))
    payload, trailers = decode(
        body, trailer_names=trailer_names, decoded_length=int(req.headers["x-amz-decoded-content-length"])
    )
    assert payload == data
    verifier = BodyVerifier.from_headers(req.headers, auth.payload_hash)
    verifier.update(payload)
    verifier.finish(trailers)
    assert verifier.verified_checksum is not None


# --------------------------------------------------------------------------------------------------
# The S3 docs' signed multi-chunk example

DOC_BODY = (
    b"10000;chunk-signature=ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n"
    + b"a" * 65536
    + b"\r\n400;chunk-signature=0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n"
    + b"a" * 1024
    + b"\r\n0;chunk-signature=b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n"
)


def test_s3_doc_signed_body_decodes_with_its_signatures() -> None:
    assert len(DOC_BODY) == 66824  # the example's Content-Length
    payload, trailers = decode(
        DOC_BODY, chain=ChunkSignatureChain(chunked_example_verified()), decoded_length=66560
    )
    assert payload == b"a" * 66560
    assert trailers == {}


@pytest.mark.parametrize("step", [1, 7, 88, 4096, 65535])
def test_s3_doc_signed_body_in_fixed_size_feeds(step: int) -> None:
    payload, _ = decode(
        DOC_BODY,
        chain=ChunkSignatureChain(chunked_example_verified()),
        decoded_length=66560,
        splits=range(step, len(DOC_BODY), step),
    )
    assert payload == b"a" * 66560


@pytest.mark.parametrize("offset", [100, 65536 + 88 + 2 + 88 + 5, 66700])
def test_s3_doc_signed_body_with_tampered_data_fails(offset: int) -> None:
    body = DOC_BODY[:offset] + b"b" + DOC_BODY[offset + 1 :]
    with pytest.raises(SignatureDoesNotMatch):
        decode(body, chain=ChunkSignatureChain(chunked_example_verified()), decoded_length=66560)


@pytest.mark.parametrize("signature_index", [0, 1, 2])
def test_s3_doc_signed_body_with_tampered_signature_fails(signature_index: int) -> None:
    start = [i for i in range(len(DOC_BODY)) if DOC_BODY.startswith(b"chunk-signature=", i)][signature_index]
    at = start + len(b"chunk-signature=") + 10
    body = DOC_BODY[:at] + (b"0" if DOC_BODY[at : at + 1] != b"0" else b"1") + DOC_BODY[at + 1 :]
    with pytest.raises(SignatureDoesNotMatch):
        decode(body, chain=ChunkSignatureChain(chunked_example_verified()), decoded_length=66560)


def test_s3_doc_signed_body_with_swapped_chunks_fails() -> None:
    signer = ChunkSigner.for_request(
        secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", amz_date="20130524T000000Z",
        region="us-east-1", seed_signature=chunked_example_verified().seed_signature,
    )  # fmt: skip
    assert encode_aws_chunked([b"a" * 65536, b"a" * 1024], signer=signer) == DOC_BODY
    first = DOC_BODY.index(b"400;")
    last = DOC_BODY.index(b"0;chunk-signature=b6")
    swapped = DOC_BODY[first:last] + DOC_BODY[:first] + DOC_BODY[last:]
    with pytest.raises(SignatureDoesNotMatch):
        decode(swapped, chain=ChunkSignatureChain(chunked_example_verified()))


def test_unsigned_decoder_ignores_chunk_signatures() -> None:
    payload, _ = decode(DOC_BODY, decoded_length=66560)
    assert payload == b"a" * 66560


# --------------------------------------------------------------------------------------------------
# Signed trailer mode (STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER)

TRAILER = {"x-amz-checksum-crc32c": "sOO8/Q=="}


def signed_trailer_body(chunks: Sequence[bytes], trailers: dict[str, str] = TRAILER) -> bytes:
    return encode_aws_chunked(chunks, signer=signer_for(make_verified()), trailers=trailers)


def test_signed_trailer_body_round_trips() -> None:
    body = signed_trailer_body([b"x" * 9000, b"y" * 10])
    assert b"\r\nx-amz-trailer-signature:" in body
    payload, trailers = decode(
        body, chain=ChunkSignatureChain(make_verified()), trailer_names=tuple(TRAILER), decoded_length=9010
    )
    assert payload == b"x" * 9000 + b"y" * 10
    assert trailers == TRAILER


def test_signed_trailer_with_tampered_value_fails() -> None:
    body = signed_trailer_body([b"data"]).replace(b"sOO8/Q==", b"AAAAAA==")
    with pytest.raises(SignatureDoesNotMatch):
        decode(body, chain=ChunkSignatureChain(make_verified()), trailer_names=tuple(TRAILER))


def test_signed_trailer_without_signature_is_malformed() -> None:
    body = encode_aws_chunked([b"data"], signer=signer_for(make_verified()))[:-2]
    body += b"x-amz-checksum-crc32c:sOO8/Q==\r\n\r\n"
    with pytest.raises(MalformedTrailerError):
        decode(body, chain=ChunkSignatureChain(make_verified()), trailer_names=tuple(TRAILER))


def test_signed_trailer_signature_over_lines_without_final_newline_is_accepted() -> None:
    """aws-sdk-net hashes the trailer lines without the last newline (minio/minio#17774)."""
    verified = make_verified()
    signer = signer_for(verified)
    body = encode_aws_chunked([b"data"], signer=signer)[:-2]
    signature = signer.sign_trailer(b"x-amz-checksum-crc32c:sOO8/Q==")
    body += b"x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:" + signature.encode() + b"\r\n\r\n"
    _, trailers = decode(body, chain=ChunkSignatureChain(verified), trailer_names=tuple(TRAILER))
    assert trailers == TRAILER


def test_lines_after_the_trailer_signature_are_malformed() -> None:
    body = signed_trailer_body([b"data"])[:-2] + b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    with pytest.raises(MalformedTrailerError):
        decode(
            body,
            chain=ChunkSignatureChain(make_verified()),
            trailer_names=("x-amz-checksum-crc32c", "x-amz-checksum-crc32"),
        )


def test_canonical_trailer_is_name_colon_value_newline() -> None:
    assert canonical_trailer({"a": "1", "b": "2"}) == b"a:1\nb:2\n"


# --------------------------------------------------------------------------------------------------
# Every split gives the same result

SPLIT_BODIES = {
    "botocore-trailer": (botocore_body(b"0123456789" * 300, "crc32", 1000), None, ("x-amz-checksum-crc32",)),
    "botocore-empty": (botocore_body(b""), None, ("x-amz-checksum-crc32",)),
    "signed-trailer": (signed_trailer_body([b"p" * 100, b"q" * 50]), "chain", tuple(TRAILER)),
    "signed-no-trailer": (encode_aws_chunked([b"r" * 33], signer=signer_for(make_verified())), "chain", ()),
}


def _decode_named(name: str, splits: Sequence[int]) -> tuple[bytes, dict[str, str]]:
    body, chain, names = SPLIT_BODIES[name]
    return decode(
        body,
        chain=ChunkSignatureChain(make_verified()) if chain else None,
        trailer_names=names,
        splits=splits,
    )


@pytest.mark.parametrize("name", SPLIT_BODIES)
def test_feeding_byte_by_byte_gives_the_same_result(name: str) -> None:
    body = SPLIT_BODIES[name][0]
    assert _decode_named(name, range(1, len(body))) == _decode_named(name, ())


@settings(max_examples=examples(200), deadline=None)
@given(name=st.sampled_from(sorted(SPLIT_BODIES)), data=st.data())
def test_any_split_gives_the_same_result(name: str, data: st.DataObject) -> None:
    body = SPLIT_BODIES[name][0]
    splits = data.draw(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=30))
    assert _decode_named(name, splits) == _decode_named(name, ())


def test_payload_is_passed_through_without_buffering() -> None:
    decoder = AwsChunkedDecoder(chain=None, trailer_names=(), decoded_length=None)
    assert decoder.feed(b"a;x=y\r\n0123") == [b"0123"]
    assert decoder.feed(b"456") == [b"456"]
    assert decoder.feed(b"789\r\n") == [b"789"]
    assert decoder.feed(b"0\r\n\r\n") == []
    assert decoder.complete
    assert decoder.decoded_bytes == 10


# --------------------------------------------------------------------------------------------------
# Truncation


@pytest.mark.parametrize("name", SPLIT_BODIES)
def test_truncation_at_every_offset_is_incomplete_body(name: str) -> None:
    body, chain, names = SPLIT_BODIES[name]
    # A complete trailer section whose final empty line is missing is tolerated (see the module doc).
    tolerated = {len(body) - 2} if names else set()
    for end in range(len(body)):
        decoder = AwsChunkedDecoder(
            chain=ChunkSignatureChain(make_verified()) if chain else None,
            trailer_names=names,
            decoded_length=None,
        )
        decoder.feed(body[:end])
        if end in tolerated:
            assert decoder.finish()
            continue
        with pytest.raises(IncompleteBody):
            decoder.finish()
        with pytest.raises(IncompleteBody):  # an error is final
            decoder.feed(b"")


def test_truncated_s3_doc_body_is_incomplete_body() -> None:
    offsets = [*range(0, 100), *range(65600, 65800), *range(len(DOC_BODY) - 100, len(DOC_BODY))]
    for end in offsets:
        decoder = AwsChunkedDecoder(
            chain=ChunkSignatureChain(chunked_example_verified()), trailer_names=(), decoded_length=66560
        )
        decoder.feed(DOC_BODY[:end])
        with pytest.raises(IncompleteBody):
            decoder.finish()


def test_fewer_bytes_than_decoded_length_is_incomplete_body() -> None:
    with pytest.raises(IncompleteBody):
        decode(b"3\r\nabc\r\n0\r\n\r\n", decoded_length=4)


def test_more_bytes_than_decoded_length_fails_at_the_chunk_header() -> None:
    decoder = AwsChunkedDecoder(chain=None, trailer_names=(), decoded_length=4)
    assert decoder.feed(b"3\r\nabc\r\n") == [b"abc"]
    with pytest.raises(IncompleteBody):
        decoder.feed(b"2\r\n")


# --------------------------------------------------------------------------------------------------
# Malformed framing


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nab\r\n0\r\n\r\n",  # not hex
        b"\r\n0\r\n\r\n",  # empty size
        b" 2\r\nab\r\n0\r\n\r\n",  # blank before the size
        b"-2\r\nab\r\n0\r\n\r\n",
        b"2\nab\r\n0\r\n\r\n",  # bare LF after the size
        b"2\r\nabX\r\n0\r\n\r\n",  # more data than announced
        b"2\r\nab\n0\r\n\r\n",  # bare LF after data
        b"10000000000000000\r\n",  # 17 hex digits
        b"0\r\n\r\nextra",  # bytes after the end
        b"0\r\n\r\n\r\n",
    ],
)
def test_malformed_framing_is_incomplete_body(body: bytes) -> None:
    with pytest.raises(IncompleteBody):
        decode(body)


def test_uppercase_hex_size_is_accepted() -> None:
    assert decode(b"A\r\n0123456789\r\n0\r\n\r\n")[0] == b"0123456789"


def test_oversized_chunk_header_line_is_incomplete_body() -> None:
    decoder = AwsChunkedDecoder(chain=None, trailer_names=(), decoded_length=None)
    decoder.feed(b"1;" + b"x" * (MAX_CHUNK_HEADER_BYTES - 10))
    with pytest.raises(IncompleteBody):
        decoder.feed(b"x" * 20)


def test_chunk_larger_than_the_maximum_is_invalid_chunk_size() -> None:
    with pytest.raises(InvalidChunkSizeError) as caught:
        decode(b"401\r\n", max_chunk_bytes=1024)
    assert caught.value.extra == {"Chunk": "1", "BadChunkSize": "1025"}


def test_small_chunk_before_the_last_is_refused_when_asked() -> None:
    small_then_more = b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n"
    assert decode(small_then_more)[0] == b"abcdef"  # not enforced by default
    with pytest.raises(InvalidChunkSizeError) as caught:
        decode(small_then_more, min_chunk_bytes=S3_MIN_CHUNK_BYTES)
    assert caught.value.extra == {"Chunk": "1", "BadChunkSize": "3"}
    assert decode(b"3\r\nabc\r\n0\r\n\r\n", min_chunk_bytes=S3_MIN_CHUNK_BYTES)[0] == b"abc"


@pytest.mark.parametrize(
    "header",
    [
        b"4\r\n",
        b"4;chunk-signature=\r\n",
        b"4;chunk-signature=" + b"g" * 64 + b"\r\n",
        b"4;sig=" + b"0" * 64 + b"\r\n",
    ],
)
def test_signed_mode_needs_a_well_formed_chunk_signature(header: bytes) -> None:
    decoder = AwsChunkedDecoder(
        chain=ChunkSignatureChain(make_verified()), trailer_names=(), decoded_length=None
    )
    with pytest.raises(IncompleteBody):
        decoder.feed(header)


# --------------------------------------------------------------------------------------------------
# Trailers


def test_trailer_variants_real_clients_send_are_accepted() -> None:
    names = ("x-amz-checksum-crc32",)
    expected = {"x-amz-checksum-crc32": "AAAAAA=="}
    for body in [
        b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n",  # botocore, aws-sdk-js-v3, aws-sdk-go-v2
        b"0\r\nx-amz-checksum-crc32:AAAAAA==\n\r\n",  # bare LF after the trailer line
        b"0\r\nx-amz-checksum-crc32: AAAAAA== \r\n\r\n",  # blanks around the value
        b"0\r\nX-Amz-Checksum-CRC32:AAAAAA==\r\n\r\n",  # any case
        b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n",  # final CRLF missing at EOF
    ]:
        assert decode(body, trailer_names=names)[1] == expected, body


def test_trailer_names_are_matched_case_insensitively() -> None:
    assert decode(b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n", trailer_names=("X-Amz-Checksum-CRC32",))[1]


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n", ()),  # not announced
        (b"0\r\nx-amz-checksum-sha1:AAAAAA==\r\n\r\n", ("x-amz-checksum-crc32",)),
        (b"0\r\nx-amz-checksum-crc32:A\r\nx-amz-checksum-crc32:B\r\n\r\n", ("x-amz-checksum-crc32",)),
        (b"0\r\nno colon here\r\n\r\n", ("x-amz-checksum-crc32",)),
        (b"0\r\n:value\r\n\r\n", ("x-amz-checksum-crc32",)),
        (
            b"0\r\nx-amz-trailer-signature:" + b"0" * 64 + b"\r\n\r\n",
            ("x-amz-checksum-crc32",),
        ),  # unsigned mode
    ],
)
def test_malformed_trailers(body: bytes, names: tuple[str, ...]) -> None:
    with pytest.raises(MalformedTrailerError):
        decode(body, trailer_names=names)


def test_oversized_trailer_section_is_malformed() -> None:
    decoder = AwsChunkedDecoder(
        chain=None, trailer_names=("x-amz-checksum-crc32",), decoded_length=None, max_trailer_bytes=64
    )
    decoder.feed(b"0\r\nx-amz-checksum-crc32:")
    with pytest.raises(MalformedTrailerError):
        decoder.feed(b"A" * 64)


def test_missing_announced_trailer_is_left_to_the_body_verifier() -> None:
    payload, trailers = decode(b"1\r\nx\r\n0\r\n\r\n", trailer_names=("x-amz-checksum-crc32",))
    assert trailers == {}
    verifier = BodyVerifier.from_headers(
        {"x-amz-trailer": "x-amz-checksum-crc32"}, "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    )
    verifier.update(payload)
    with pytest.raises(MalformedTrailerError):
        verifier.finish(trailers)


# --------------------------------------------------------------------------------------------------
# Fuzz: arbitrary bytes only ever raise S3 errors

_fragments = st.sampled_from(
    [b"0", b"1", b"a", b"F", b"10000", b";chunk-signature=", b"0" * 64, b"\r\n", b"\r", b"\n", b":",
     b"x-amz-checksum-crc32", b"x-amz-trailer-signature", b"AAAAAA==", b" ", b";", b"=", b"\xff"]
)  # fmt: skip
_bodies = st.one_of(st.binary(max_size=300), st.lists(_fragments, max_size=40).map(b"".join))


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=_bodies,
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=5),
    signed=st.booleans(),
    names=st.sampled_from([(), ("x-amz-checksum-crc32",)]),
    decoded_length=st.one_of(st.none(), st.integers(min_value=0, max_value=100)),
)
def test_fuzz_only_s3_errors_escape(
    body: bytes, cuts: list[int], signed: bool, names: tuple[str, ...], decoded_length: int | None
) -> None:
    decoder = AwsChunkedDecoder(
        chain=ChunkSignatureChain(make_verified()) if signed else None,
        trailer_names=names,
        decoded_length=decoded_length,
        max_chunk_bytes=1 << 20,
    )
    out: list[bytes] = []
    try:
        start = 0
        for cut in [*sorted(c for c in cuts if c <= len(body)), len(body)]:
            out += decoder.feed(body[start:cut])
            start = cut
        decoder.finish()
    except S3Error:
        return
    assert len(b"".join(out)) == decoder.decoded_bytes
    assert hashlib.sha256(b"".join(out)).digest()  # payload is bytes
