"""Tenant access policies: which buckets and prefixes an access key may read and write, which lanes it uses.

Pure: the decision is made from the request's operation, bucket, key and query before anything is sent to a
backend. A tenant is *restricted* when its ``[tenants.<access key>]`` table has ``read`` or ``write``
grants; other tenants are not limited here (the store's own policies still apply to them). For a restricted
tenant, everything not granted is AccessDenied:

- ``read``: GetObject/HeadObject and the object's tags, ACL and attributes, ListParts; ListObjects(V2),
  ListObjectVersions and ListMultipartUploads whose ``prefix`` lies inside a grant; the source of a copy.
- ``write``: PutObject, multipart uploads, DeleteObject, object tags and ACLs, the destination of a copy.
- a grant of a whole bucket (``"bucket"``, no prefix) is needed for bucket-level operations: reading the
  bucket's configuration needs ``read``, changing it, CreateBucket, DeleteBucket and DeleteObjects (whose keys
  are in the body) need ``write``. HeadBucket needs any grant in the bucket.
- ListBuckets needs ``list_buckets = true``.
- ``lanes`` becomes the lanes the tenant may *use*: a hint for another lane is refused, and so is a request
  the rules or defaults put in another lane.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from s3lanes.errors import AccessDenied, AuthError

_OBJECT_READS = frozenset(
    {
        "GetObject",
        "HeadObject",
        "GetObjectTagging",
        "GetObjectAcl",
        "GetObjectAttributes",
        "SelectObjectContent",
    }
)
_OBJECT_WRITES = frozenset(
    {
        "PutObject",
        "CreateMultipartUpload",
        "UploadPart",
        "CompleteMultipartUpload",
        "AbortMultipartUpload",
        "DeleteObject",
        "PutObjectTagging",
        "DeleteObjectTagging",
        "PutObjectAcl",
        "RestoreObject",
    }
)
_COPIES = frozenset({"CopyObject", "UploadPartCopy"})
_LISTINGS = frozenset({"ListObjects", "ListObjectsV2", "ListObjectVersions", "ListMultipartUploads"})


@dataclass(frozen=True, slots=True)
class Grant:
    bucket: str
    prefix: str = ""  # "" = the whole bucket

    @classmethod
    def parse(cls, text: str) -> Grant:
        """``"bucket"`` or ``"bucket/prefix"`` (the prefix as keys start, e.g. ``"ckpt/job-42/"``)."""
        bucket, _, prefix = text.partition("/")
        if not bucket:
            raise ValueError(f"a grant is 'bucket' or 'bucket/prefix', got {text!r}")
        return cls(bucket, prefix)

    def covers_key(self, bucket: str, key: str) -> bool:
        return bucket == self.bucket and key.startswith(self.prefix)

    def covers_bucket(self, bucket: str) -> bool:
        return bucket == self.bucket and not self.prefix


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    read: tuple[Grant, ...] = ()
    write: tuple[Grant, ...] = ()
    lanes: frozenset[str] | None = None  # None: every lane
    list_buckets: bool = False

    def check(
        self,
        operation: str,
        bucket: str | None,
        key: str | None,
        query: Mapping[str, str],
        *,
        copy_source: tuple[str, str] | None = None,
    ) -> None:
        """Raise AccessDenied unless the request is granted. ``copy_source``: (bucket, key) of a copy."""
        if bucket is None:
            if operation == "ListBuckets" and self.list_buckets:
                return
            raise _denied("list the buckets" if operation == "ListBuckets" else operation)
        if key is not None:
            if operation in _OBJECT_READS or operation == "ListParts":
                return self._need(
                    self.read + self.write if operation == "HeadObject" else self.read, bucket, key, "read"
                )
            if operation in _OBJECT_WRITES:
                return self._need(self.write, bucket, key, "write")
            if operation in _COPIES:
                self._need(self.write, bucket, key, "write")
                if copy_source is None:
                    raise _denied(operation)
                return self._need(self.read, copy_source[0], copy_source[1], "read")
            raise _denied(operation)
        if operation in _LISTINGS:
            prefix = query.get("prefix", "")
            if any(g.covers_key(bucket, prefix) for g in self.read):
                return
            raise _denied(f"list {bucket}/{prefix}")
        if operation == "HeadBucket":
            if any(g.bucket == bucket for g in (*self.read, *self.write)):
                return
            raise _denied(f"see bucket {bucket}")
        whole_write = any(g.covers_bucket(bucket) for g in self.write)
        if operation.startswith("Get"):  # bucket configuration
            if any(g.covers_bucket(bucket) for g in self.read) or whole_write:
                return
            raise _denied(f"read the configuration of {bucket}")
        if whole_write and (
            operation in ("CreateBucket", "DeleteBucket", "DeleteObjects")
            or operation.startswith(("Put", "Delete"))
        ):
            return
        raise _denied(f"{operation} on {bucket}")

    def may_see(self, bucket: str, prefix: str) -> bool:
        """Whether a grant (read or write) covers ``bucket/prefix`` (e.g. to wait for its durability)."""
        return any(g.covers_key(bucket, prefix) for g in (*self.read, *self.write))

    def check_lane(self, lane: str, *, hinted: str | None) -> None:
        """A restricted tenant uses only its lanes: a hint for another lane, or a request classified into one,
        is refused."""
        if self.lanes is None:
            return
        if hinted is not None and hinted not in self.lanes:
            raise AccessDenied(f"Access Denied: this key may not use lane {hinted!r}.")
        if lane not in self.lanes:
            raise AccessDenied(f"Access Denied: this key may not use lane {lane!r}.")

    def _need(self, grants: Iterable[Grant], bucket: str, key: str, what: str) -> None:
        if not any(g.covers_key(bucket, key) for g in grants):
            raise _denied(f"{what} {bucket}/{key}")


def _denied(what: str) -> AuthError:
    # The message names what was refused, never the policy (S3 says only "Access Denied").
    return AccessDenied(f"Access Denied: this key may not {what}.")
