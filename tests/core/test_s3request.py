"""Which bucket, key and operation a request names, for both addressing styles."""

from __future__ import annotations

import pytest

from s3lanes.core.s3request import bucket_from_host, parse_target, query_names
from s3lanes.errors import InvalidBucketName

DOMAINS = ("s3.example.com", "localhost")


def target(method: str, path: str, query: str = "", host: str = "127.0.0.1:9000", **headers: str):
    h = {"host": host, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return parse_target(method, path, query, h, DOMAINS)


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "operation"),
    [
        ("GET", "/", "", {}, "ListBuckets"),
        ("GET", "/b", "", {}, "ListObjects"),
        ("GET", "/b/", "list-type=2&prefix=a", {}, "ListObjectsV2"),
        ("GET", "/b", "uploads", {}, "ListMultipartUploads"),
        ("GET", "/b", "versioning", {}, "GetBucketVersioning"),
        ("PUT", "/b", "", {}, "CreateBucket"),
        ("PUT", "/b", "tagging", {}, "PutBucketTagging"),
        ("HEAD", "/b", "", {}, "HeadBucket"),
        ("DELETE", "/b", "", {}, "DeleteBucket"),
        ("POST", "/b", "delete", {}, "DeleteObjects"),
        ("GET", "/b/k", "", {}, "GetObject"),
        ("HEAD", "/b/k", "", {}, "HeadObject"),
        ("PUT", "/b/k", "", {}, "PutObject"),
        ("PUT", "/b/k", "", {"x-amz-copy-source": "/a/b"}, "CopyObject"),
        ("PUT", "/b/k", "partNumber=1&uploadId=x", {}, "UploadPart"),
        ("PUT", "/b/k", "partNumber=1&uploadId=x", {"x-amz-copy-source": "/a/b"}, "UploadPartCopy"),
        ("PUT", "/b/k", "tagging", {}, "PutObjectTagging"),
        ("GET", "/b/k", "tagging", {}, "GetObjectTagging"),
        ("DELETE", "/b/k", "tagging", {}, "DeleteObjectTagging"),
        ("DELETE", "/b/k", "", {}, "DeleteObject"),
        ("POST", "/b/k", "uploads", {}, "CreateMultipartUpload"),
        ("POST", "/b/k", "uploadId=x", {}, "CompleteMultipartUpload"),
        ("DELETE", "/b/k", "uploadId=x", {}, "AbortMultipartUpload"),
        ("GET", "/b/k", "uploadId=x", {}, "ListParts"),
        ("PATCH", "/b/k", "", {}, "UnknownPatch"),
    ],
)
def test_operation_follows_method_subresource_and_headers(method, path, query, headers, operation):
    h = {"host": "h", **headers}
    assert parse_target(method, path, query, h, DOMAINS).operation == operation


def test_path_style_key_is_percent_decoded_and_keeps_slashes():
    t = target("GET", "/bucket/dir/a%20b%2Bc/%E2%82%AC")
    assert (t.bucket, t.key, t.virtual_host) == ("bucket", "dir/a b+c/€", False)


def test_path_style_bucket_with_trailing_slash_is_bucket_level():
    t = target("GET", "/bucket/")
    assert (t.bucket, t.key, t.operation) == ("bucket", None, "ListObjects")


def test_virtual_hosted_style_takes_bucket_from_host():
    t = target("GET", "/dir/key.bin", host="my-bucket.s3.example.com:9000")
    assert (t.bucket, t.key, t.virtual_host, t.operation) == ("my-bucket", "dir/key.bin", True, "GetObject")


def test_virtual_hosted_bucket_root_lists():
    t = target("GET", "/", "list-type=2", host="data.localhost")
    assert (t.bucket, t.key, t.operation) == ("data", None, "ListObjectsV2")


def test_host_that_is_only_the_domain_is_path_style():
    assert bucket_from_host("s3.example.com:443", DOMAINS) is None
    assert bucket_from_host("127.0.0.1:9000", DOMAINS) is None
    assert bucket_from_host("B.S3.Example.Com.", DOMAINS) == "b"


def test_invalid_bucket_name_is_an_s3_error():
    with pytest.raises(InvalidBucketName):
        target("GET", "/_bad/key")


def test_query_names_decodes_and_keeps_first_value():
    assert query_names("a=1&a=2&b&c=%2F+x") == {"a": "1", "b": "", "c": "/ x"}
