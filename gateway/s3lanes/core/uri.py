"""S3's URI encoding: every byte percent-encoded but the unreserved ``A-Za-z0-9-._~`` (and '/' in paths)."""

from __future__ import annotations

from urllib.parse import quote


def s3_quote(value: str, safe: str = "") -> str:
    """Percent-encode UTF-8 ``value`` as S3 and SigV4 do (upper-case hex, space as %20, '~' kept)."""
    return quote(value, safe=safe + "~", encoding="utf-8", errors="strict")
