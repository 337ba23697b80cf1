"""``s3://bucket/key`` URIs."""

from __future__ import annotations

from dataclasses import dataclass

from s3lanes_client.errors import InvalidS3URI


@dataclass(frozen=True, slots=True)
class S3URI:
    bucket: str
    key: str = ""  # an object key, or a prefix; "" is the whole bucket

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def join(self, name: str) -> S3URI:
        """The key ``name`` inside this prefix, treating the prefix as a directory."""
        if not self.key:
            return S3URI(self.bucket, name)
        return S3URI(self.bucket, self.key.rstrip("/") + "/" + name)

    @property
    def dir_prefix(self) -> str:
        """The key as a directory prefix: ``""`` or ending in ``/``."""
        return self.key if not self.key or self.key.endswith("/") else self.key + "/"


def parse_s3_uri(uri: str) -> S3URI:
    """Split ``s3://bucket/some/key`` into bucket and key. The key is kept verbatim (S3 keys are opaque)."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise InvalidS3URI(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise InvalidS3URI(f"no bucket in {uri!r}")
    return S3URI(bucket, key)
