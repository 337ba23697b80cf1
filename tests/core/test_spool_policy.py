"""The write spool's pure policy (s3lanes.core.spool_policy): which writes go to the store instead of the
spool, judged by the key and headers alone, and what a spooled object keeps of its request's headers."""

from __future__ import annotations

import pytest

from s3lanes.core.spool_policy import (
    WRITE_THROUGH_HEADER,
    copy_conditions,
    not_checksum_meta,
    parse_copy_source,
    stored_object,
    tagging_xml,
    upload_meta,
    write_through_reason,
    writes_key,
    xml_document,
)
from s3lanes.core.spool_state import Entry
from s3lanes.errors import InvalidArgument


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
        ("k", {"x-amz-meta-name": "\udce9t\u00e9"}, "unstorable"),
        ("k" * 1025, {}, "unstorable"),
        ("k\x00", {}, "unstorable"),
        ("k", {"x-amz-tagging": "a=b&c="}, None),
        ("k", {"x-amz-tagging": "a=b%2"}, "unstorable"),
        ("k", {"x-amz-tagging": "a=b&c"}, "unstorable"),
        ("k", {"x-amz-tagging": "&".join(f"k{i}=v" for i in range(11))}, "unstorable"),
        ("k", {"x-amz-tagging": "a=%zz"}, "unstorable"),
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


def test_content_encoding_keeps_what_is_left_without_aws_chunked() -> None:
    assert upload_meta({"content-encoding": "aws-chunked,gzip"}) == [("content-encoding", "gzip")]
    assert upload_meta({"content-encoding": "aws-chunked"}) == []


def test_a_copy_drops_the_sources_checksum_algorithm_and_type() -> None:
    meta = [("content-type", "a/b"), ("x-amz-checksum-algorithm", "CRC32"), ("x-amz-checksum-type", "FULL")]
    assert not_checksum_meta(meta) == [("content-type", "a/b")]


def test_a_spooled_entry_is_served_with_its_metadata_tags_and_checksum() -> None:
    entry = Entry(
        seq=1,
        kind="put",
        bucket="b",
        key="k",
        access_key="AK",
        lane="checkpoint",
        acked_at=1700000000.0,
        size=5,
        etag='"e"',
        meta=(
            ("cache-control", "no-cache"),
            ("x-amz-meta-a", "1"),
            ("x-amz-storage-class", "STANDARD"),
            ("x-amz-tagging", "a=1&b=2"),
            ("x-amz-acl", "private"),
        ),
        checksum=(("x-amz-checksum-crc32", "AAAAAA=="),),
    )
    obj = stored_object(entry)
    assert (obj.size, obj.etag, obj.content_type, obj.tag_count) == (5, '"e"', "binary/octet-stream", 2)
    assert obj.headers == (
        ("cache-control", "no-cache"),
        ("x-amz-meta-a", "1"),
        ("x-amz-checksum-crc32", "AAAAAA=="),
    )
    entry.meta = (("content-type", "text/plain"), ("x-amz-storage-class", "STANDARD_IA"))
    obj = stored_object(entry)
    assert obj.content_type == "text/plain" and obj.tag_count == 0
    assert ("x-amz-storage-class", "STANDARD_IA") in obj.headers


def test_small_documents_escape_their_values() -> None:
    assert xml_document("R", [("ETag", '"<e>"')]).endswith(
        b'<R xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><ETag>"&lt;e&gt;"</ETag></R>'
    )
    assert b"<Tag><Key>a&amp;</Key><Value></Value></Tag>" in tagging_xml("a%26=")


@pytest.mark.parametrize(
    ("op", "writes"),
    [
        ("PutObject", True),
        ("CopyObject", True),
        ("CreateMultipartUpload", True),
        ("DeleteObject", True),
        ("RestoreObject", True),
        ("PutObjectTagging", True),
        ("DeleteObjectTagging", True),
        ("CompleteMultipartUpload", True),
        ("UploadPartCopy", True),
        ("GetObject", False),
        ("HeadObject", False),
        ("ListParts", False),
        ("SelectObjectContent", False),
    ],
)
def test_writes_key_names_the_operations_that_change_an_object(op: str, writes: bool) -> None:
    assert writes_key(op) is writes
