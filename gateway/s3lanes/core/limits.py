"""S3's request limits, checked before anything is sent or stored (pure).

- an object uploaded in one PUT, and one part of a multipart upload, at most 5 GiB (``EntityTooLarge``);
- part numbers 1..10,000 (``InvalidArgument``);
- ``response-*`` overrides without control characters (``InvalidArgument``);
- at most ``MAX_HEADERS`` header fields (``RequestHeaderSectionTooLarge``, as for a header section over its
  byte limit, which the HTTP layer checks).
"""

from __future__ import annotations

from collections.abc import Mapping

from s3lanes.errors import EntityTooLarge, InvalidArgument, RequestHeaderSectionTooLarge

MAX_SINGLE_UPLOAD_BYTES = 5 * 1024**3
MAX_PART_NUMBER = 10_000
MAX_HEADERS = 128


def check_limits(operation: str, query: Mapping[str, str], size_bytes: int | None, header_count: int) -> None:
    if header_count > MAX_HEADERS:
        raise RequestHeaderSectionTooLarge(
            f"Your request has {header_count} header fields; at most {MAX_HEADERS} are accepted."
        )
    for name, value in query.items():
        # response-* overrides come back as response headers: a control character would break them (the
        # store echoes them; the gateway's client then refuses the answer).
        if name.startswith("response-") and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise InvalidArgument(f"The {name} override contains a control character.", ArgumentName=name)
    if operation in ("UploadPart", "UploadPartCopy"):
        raw = query.get("partNumber", "")
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PART_NUMBER:
            raise InvalidArgument(
                f"Part number must be an integer between 1 and {MAX_PART_NUMBER}, inclusive",
                ArgumentName="partNumber",
                ArgumentValue=raw[:64],
            )
    if (
        operation in ("PutObject", "UploadPart")
        and size_bytes is not None
        and size_bytes > MAX_SINGLE_UPLOAD_BYTES
    ):
        raise EntityTooLarge(MaxSizeAllowed=str(MAX_SINGLE_UPLOAD_BYTES), ProposedSize=str(size_bytes))
