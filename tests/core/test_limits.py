"""S3's request limits: object and part sizes, part numbers, header count."""

from __future__ import annotations

import pytest

from s3lanes.core.limits import MAX_HEADERS, MAX_SINGLE_UPLOAD_BYTES, check_limits
from s3lanes.errors import S3Error


@pytest.mark.parametrize(
    ("operation", "query", "size", "headers", "code"),
    [
        ("PutObject", {}, MAX_SINGLE_UPLOAD_BYTES + 1, 10, "EntityTooLarge"),
        ("UploadPart", {"partNumber": "1"}, MAX_SINGLE_UPLOAD_BYTES + 1, 10, "EntityTooLarge"),
        ("UploadPart", {"partNumber": "0"}, 10, 10, "InvalidArgument"),
        ("UploadPart", {"partNumber": "10001"}, 10, 10, "InvalidArgument"),
        ("UploadPartCopy", {"partNumber": "x"}, None, 10, "InvalidArgument"),
        ("GetObject", {}, None, MAX_HEADERS + 1, "RequestHeaderSectionTooLarge"),
    ],
)
def test_over_the_limit(
    operation: str, query: dict[str, str], size: int | None, headers: int, code: str
) -> None:
    with pytest.raises(S3Error) as info:
        check_limits(operation, query, size, headers)
    assert info.value.code == code and info.value.status in (400, 431)


@pytest.mark.parametrize(
    ("operation", "query", "size"),
    [
        ("PutObject", {}, MAX_SINGLE_UPLOAD_BYTES),
        ("UploadPart", {"partNumber": "10000"}, MAX_SINGLE_UPLOAD_BYTES),
        ("CompleteMultipartUpload", {}, 50 * MAX_SINGLE_UPLOAD_BYTES),  # its body is XML, not the object
        ("GetObject", {}, None),
    ],
)
def test_within_the_limits(operation: str, query: dict[str, str], size: int | None) -> None:
    check_limits(operation, query, size, MAX_HEADERS)


@pytest.mark.parametrize("value", ["a\x00b", "text/plain\r\nX-Evil: 1", "\x7f"])
def test_response_overrides_with_control_characters_are_refused(value: str) -> None:
    with pytest.raises(S3Error) as info:
        check_limits("GetObject", {"response-content-type": value}, None, 5)
    assert info.value.code == "InvalidArgument"


@pytest.mark.parametrize(
    "number", ["\u00b2", "\u0663", "\uff11"]
)  # superscript two, Arabic-Indic three, fullwidth one
def test_part_numbers_are_ascii_digits_only(number: str) -> None:
    with pytest.raises(S3Error) as info:
        check_limits("UploadPart", {"partNumber": number}, 1, 5)
    assert info.value.code == "InvalidArgument"
