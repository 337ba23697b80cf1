"""Tenant access policies: bucket and prefix grants for reading and writing, and the lanes a key uses."""

from __future__ import annotations

import pytest

from s3lanes.core.access import Grant, TenantPolicy
from s3lanes.core.lanes_config import parse_tenant_policies
from s3lanes.errors import AccessDenied

JOB = TenantPolicy(
    read=(Grant("datasets"), Grant("ckpt", "job-42/")),
    write=(Grant("ckpt", "job-42/"),),
    lanes=frozenset({"dataset", "restore", "checkpoint", "metadata"}),
)

ALLOWED = [
    ("GetObject", "datasets", "imagenet/0001.jpg", {}, None),
    ("HeadObject", "ckpt", "job-42/step-1/.metadata", {}, None),
    ("PutObject", "ckpt", "job-42/step-1/shard-0", {}, None),
    ("CreateMultipartUpload", "ckpt", "job-42/big", {}, None),
    ("DeleteObject", "ckpt", "job-42/old", {}, None),
    ("ListObjectsV2", "datasets", None, {"prefix": "imagenet/"}, None),
    ("ListObjectsV2", "ckpt", None, {"prefix": "job-42/step-1/"}, None),
    ("HeadBucket", "ckpt", None, {}, None),
    ("GetBucketVersioning", "datasets", None, {}, None),
    ("CopyObject", "ckpt", "job-42/copy", {}, ("datasets", "imagenet/0001.jpg")),
]
DENIED = [
    ("GetObject", "ckpt", "job-7/step-1/shard-0", {}, None),  # another job's checkpoint
    ("PutObject", "datasets", "imagenet/evil.jpg", {}, None),  # read-only grant
    (
        "PutObject",
        "ckpt",
        "job-420/x",
        {},
        None,
    ),  # prefix is not a prefix of the grant: "job-42/" needs the /
    ("ListObjectsV2", "ckpt", None, {"prefix": "job-"}, None),  # wider than the grant
    ("ListObjectsV2", "ckpt", None, {}, None),
    ("DeleteObjects", "ckpt", None, {}, None),  # keys in the body: needs the whole bucket
    ("PutBucketPolicy", "ckpt", None, {}, None),
    ("DeleteBucket", "datasets", None, {}, None),
    ("CreateBucket", "new", None, {}, None),
    ("HeadBucket", "other", None, {}, None),
    ("ListBuckets", None, None, {}, None),
    ("CopyObject", "ckpt", "job-42/copy", {}, ("ckpt", "job-7/secret")),  # source not readable
    ("CopyObject", "datasets", "x", {}, ("datasets", "imagenet/0001.jpg")),  # destination not writable
    ("UnknownPost", "datasets", "x", {}, None),
]


@pytest.mark.parametrize(("op", "bucket", "key", "query", "src"), ALLOWED)
def test_granted_requests_pass(op, bucket, key, query, src) -> None:
    JOB.check(op, bucket, key, query, copy_source=src)


@pytest.mark.parametrize(("op", "bucket", "key", "query", "src"), DENIED)
def test_everything_else_is_access_denied(op, bucket, key, query, src) -> None:
    with pytest.raises(AccessDenied) as info:
        JOB.check(op, bucket, key, query, copy_source=src)
    assert info.value.status == 403 and info.value.code == "AccessDenied"


def test_whole_bucket_write_grant_allows_bucket_operations() -> None:
    owner = TenantPolicy(write=(Grant("ckpt"),), list_buckets=True)
    for op in ("DeleteObjects", "PutBucketVersioning", "DeleteBucket", "CreateBucket"):
        owner.check(op, "ckpt", None, {})
    owner.check("ListBuckets", None, None, {})
    with pytest.raises(AccessDenied):
        owner.check("GetObject", "ckpt", "k", {})  # write does not imply read


def test_lanes_a_restricted_tenant_may_use() -> None:
    reader = TenantPolicy(read=(Grant("datasets"),), lanes=frozenset({"dataset", "metadata"}))
    reader.check_lane("dataset", hinted=None)
    reader.check_lane("metadata", hinted="metadata")
    with pytest.raises(AccessDenied, match="lane 'checkpoint'"):
        reader.check_lane("dataset", hinted="checkpoint")
    with pytest.raises(AccessDenied, match="lane 'restore'"):
        reader.check_lane("restore", hinted=None)
    TenantPolicy(read=(Grant("d"),)).check_lane("checkpoint", hinted="checkpoint")  # no lanes: every lane


def test_flush_visibility() -> None:
    assert JOB.may_see("ckpt", "job-42/step-1/")
    assert not JOB.may_see("ckpt", "job-7/")
    assert not JOB.may_see("ckpt", "")


def test_policies_from_tenant_tables() -> None:
    problems: list[str] = []
    raw = {
        "AKJOB": {"lanes": ["dataset"], "read": ["datasets", "ckpt/job-42/"], "write": "ckpt/job-42/"},
        "AKHINTS": {"lanes": ["dataset"]},  # hints only: not restricted
        "AKBAD": {"lanes": [], "read": ["/x"], "list_buckets": "yes"},
    }
    out = parse_tenant_policies(raw, "cfg", problems)
    assert set(out) == {"AKJOB", "AKBAD"}
    assert out["AKJOB"].write == (Grant("ckpt", "job-42/"),)
    assert out["AKJOB"].lanes == frozenset({"dataset"})
    assert any("AKBAD" in p and "read" in p for p in problems)
    assert any("list_buckets" in p for p in problems)
