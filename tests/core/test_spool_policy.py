"""The write spool's pure policy (gateway.core.spool_policy): which writes go to the store instead of the
spool, judged by the key and headers alone, and what a spooled object keeps of its request's headers."""

from __future__ import annotations

import pytest

from gateway.core.spool_policy import (
    WRITE_THROUGH_HEADER,
    copy_conditions,
    parse_copy_source,
    upload_meta,
    write_through_reason,
)
from gateway.errors import InvalidArgument


@pytest.mark.parametrize(
    ("key", "headers", "reason"),
    [
        ("ckpt/step-1/model.pt", {"content-type": "application/octet-stream"}, None),
        ("dir/", {}, "key"),
        ("a//b", {}, "key"),
        ("a/./b", {}, "key"),
        ("a/..", {}, "key"),
        ("k", {WRITE_THROUGH_HEADER: " True "}, "requested"),
        ("k", {WRITE_THROUGH_HEADER: "no"}, None),
        ("k", {"x-amz-meta-name": "caf\udce9"}, "unstorable"),
        ("k" * 1025, {}, "unstorable"),
        ("k\x00", {}, "unstorable"),
        ("k", {"x-amz-tagging": "a=b&c="}, None),
        ("k", {"x-amz-tagging": "a=b%2"}, "unstorable"),
        ("k", {"expires": "tomorrow"}, "unstorable"),
        ("k", {"x-amz-storage-class": "COLD"}, "unstorable"),
        ("k", {"x-amz-storage-class": "STANDARD_IA"}, None),
        ("k", {"x-amz-server-side-encryption-customer-algorithm": "AES256"}, "sse_c"),
        ("k", {"x-amz-object-lock-mode": "GOVERNANCE"}, "object_lock"),
        # A conditional write is judged with the spool's state, by the front: not here.
        ("k", {"if-none-match": "*"}, None),
    ],
)
def test_write_through_reason(key: str, headers: dict[str, str], reason: str | None) -> None:
    assert write_through_reason(key, headers) == reason


def test_a_key_reason_comes_before_a_requested_write_through() -> None:
    assert write_through_reason("dir/", {WRITE_THROUGH_HEADER: "1"}) == "key"


def test_upload_meta_keeps_content_headers_and_user_metadata_sorted() -> None:
    headers = {
        "x-amz-meta-b": "2",
        "x-amz-meta-empty": " ",
        "content-type": "text/plain",
        "content-encoding": "aws-chunked",
        "authorization": "AWS4-HMAC-SHA256 ...",
        "x-amz-meta-a": "1",
    }
    assert upload_meta(headers) == [
        ("content-type", "text/plain"),
        ("x-amz-meta-a", "1"),
        ("x-amz-meta-b", "2"),
    ]


def test_copy_source_and_its_conditions() -> None:
    assert parse_copy_source("/src/a%20b?versionId=1") == ("src", "a b")
    with pytest.raises(InvalidArgument):
        parse_copy_source("src")
    assert copy_conditions({"x-amz-copy-source-if-match": '"e"', "if-match": "x"}) == {"if-match": '"e"'}
