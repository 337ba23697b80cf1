"""The Content-Type a store gives an object written without one, by sniffing its first bytes. Pure; no I/O.

S3 (AWS) stores ``binary/octet-stream`` for a PutObject without Content-Type. SeaweedFS, the store the
project is tested against, and other Go-based stores, sniff the body instead with Go's
``http.DetectContentType``: the WHATWG MIME Sniffing Standard's signature table (https://mimesniff.spec.
whatwg.org/, "identifying a resource with an unknown MIME type") over the first 512 bytes, ``text/plain;
charset=utf-8`` for anything without binary control bytes (the empty body too), ``application/octet-stream``
for the rest. :func:`detect_content_type` is that function, signature for signature and in its order, so
that a spooled object has from its acknowledgement the Content-Type the store would give it; the drain then
sends it explicitly, and the object answers the same in the spool, while it drains and on the store.

Which default applies is ``[spool] default_content_type`` (docs/spool.md): ``"sniff"`` (this module) or a
fixed type (``binary/octet-stream`` for AWS S3 and stores that follow it).
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass

SNIFF_BYTES = 512  # how much of the body the sniff looks at
SNIFF = "sniff"  # the [spool] default_content_type value that selects detect_content_type
FALLBACK = "application/octet-stream"
_WHITESPACE = b"\t\n\x0c\r "
_TAG_TERMINATORS = b" >"
_HTML = "text/html; charset=utf-8"
_BINARY_BYTE = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")  # no text has them (WHATWG 7.1 step 9)


@dataclass(frozen=True, slots=True)
class _Exact:
    prefix: bytes
    content_type: str

    def match(self, data: bytes, rest: bytes) -> str | None:
        return self.content_type if data.startswith(self.prefix) else None


@dataclass(frozen=True, slots=True)
class _Masked:
    mask: bytes
    pattern: bytes
    content_type: str
    skip_ws: bool = False

    def match(self, data: bytes, rest: bytes) -> str | None:
        if self.skip_ws:
            data = rest
        if len(data) < len(self.pattern):
            return None
        for byte, mask, want in zip(data, self.mask, self.pattern, strict=False):
            if byte & mask != want:
                return None
        return self.content_type


@dataclass(frozen=True, slots=True)
class _Html:
    """A tag, case-insensitive (letters only), after leading whitespace, then a space or ``>``."""

    tag: bytes

    def match(self, data: bytes, rest: bytes) -> str | None:
        n = len(self.tag)
        if len(rest) < n + 1 or rest[0] != 0x3C:  # every tag starts with "<"
            return None
        for byte, want in zip(rest, self.tag, strict=False):
            if 0x41 <= want <= 0x5A:  # A-Z: compare case-insensitively
                byte &= 0xDF
            if byte != want:
                return None
        return _HTML if rest[n] in _TAG_TERMINATORS else None


@dataclass(frozen=True, slots=True)
class _Mp4:
    """WHATWG "signature for MP4": an ``ftyp`` box whose brands include ``mp4``."""

    def match(self, data: bytes, rest: bytes) -> str | None:
        if len(data) < 12:
            return None
        (box_size,) = struct.unpack(">I", data[:4])
        if len(data) < box_size or box_size % 4 != 0 or data[4:8] != b"ftyp":
            return None
        for start in range(8, box_size, 4):
            if start == 12:
                continue  # the major brand's version number
            if data[start : start + 3] == b"mp4":
                return "video/mp4"
        return None


@dataclass(frozen=True, slots=True)
class _Text:
    """Last: no binary control byte after the leading whitespace (WHATWG section 7.1 step 9)."""

    def match(self, data: bytes, rest: bytes) -> str | None:
        return None if _BINARY_BYTE.search(rest) else "text/plain; charset=utf-8"


_Sig = _Exact | _Masked | _Html | _Mp4 | _Text

_SIGNATURES: tuple[_Sig, ...] = (
    *(
        _Html(tag)
        for tag in (
            b"<!DOCTYPE HTML",
            b"<HTML",
            b"<HEAD",
            b"<SCRIPT",
            b"<IFRAME",
            b"<H1",
            b"<DIV",
            b"<FONT",
            b"<TABLE",
            b"<A",
            b"<STYLE",
            b"<TITLE",
            b"<B",
            b"<BODY",
            b"<BR",
            b"<P",
            b"<!--",
        )
    ),
    _Masked(b"\xff\xff\xff\xff\xff", b"<?xml", "text/xml; charset=utf-8", skip_ws=True),
    _Exact(b"%PDF-", "application/pdf"),
    _Exact(b"%!PS-Adobe-", "application/postscript"),
    # Byte order marks.
    _Masked(b"\xff\xff\x00\x00", b"\xfe\xff\x00\x00", "text/plain; charset=utf-16be"),
    _Masked(b"\xff\xff\x00\x00", b"\xff\xfe\x00\x00", "text/plain; charset=utf-16le"),
    _Masked(b"\xff\xff\xff\x00", b"\xef\xbb\xbf\x00", "text/plain; charset=utf-8"),
    # Images.
    _Exact(b"\x00\x00\x01\x00", "image/x-icon"),
    _Exact(b"\x00\x00\x02\x00", "image/x-icon"),
    _Exact(b"BM", "image/bmp"),
    _Exact(b"GIF87a", "image/gif"),
    _Exact(b"GIF89a", "image/gif"),
    _Masked(b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff", b"RIFF\0\0\0\0WEBPVP", "image/webp"),
    _Exact(b"\x89PNG\r\n\x1a\n", "image/png"),
    _Exact(b"\xff\xd8\xff", "image/jpeg"),
    # Audio and video, in the standard's order.
    _Masked(b"\xff\xff\xff\xff", b".snd", "audio/basic"),
    _Masked(b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff", b"FORM\0\0\0\0AIFF", "audio/aiff"),
    _Masked(b"\xff\xff\xff", b"ID3", "audio/mpeg"),
    _Masked(b"\xff\xff\xff\xff\xff", b"OggS\x00", "application/ogg"),
    _Masked(b"\xff" * 8, b"MThd\x00\x00\x00\x06", "audio/midi"),
    _Masked(b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff", b"RIFF\0\0\0\0AVI ", "video/avi"),
    _Masked(b"\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff", b"RIFF\0\0\0\0WAVE", "audio/wave"),
    _Mp4(),
    _Exact(b"\x1a\x45\xdf\xa3", "video/webm"),
    # Fonts.
    _Masked(b"\x00" * 34 + b"\xff\xff", b"\x00" * 34 + b"LP", "application/vnd.ms-fontobject"),
    _Exact(b"\x00\x01\x00\x00", "font/ttf"),
    _Exact(b"OTTO", "font/otf"),
    _Exact(b"ttcf", "font/collection"),
    _Exact(b"wOFF", "font/woff"),
    _Exact(b"wOF2", "font/woff2"),
    # Archives.
    _Exact(b"\x1f\x8b\x08", "application/x-gzip"),
    _Exact(b"PK\x03\x04", "application/zip"),
    _Exact(b"Rar!\x1a\x07\x00", "application/x-rar-compressed"),
    _Exact(b"Rar!\x1a\x07\x01\x00", "application/x-rar-compressed"),
    _Exact(b"\x00asm", "application/wasm"),
    _Text(),
)


def detect_content_type(data: bytes) -> str:
    """Go's ``http.DetectContentType``: the Content-Type of a body from (at most) its first 512 bytes."""
    data = data[:SNIFF_BYTES]
    rest = data.lstrip(_WHITESPACE)
    for sig in _SIGNATURES:
        found = sig.match(data, rest)
        if found is not None:
            return found
    return FALLBACK


# What a store that sniffs (SeaweedFS) picks where it has no body to sniff, and for a copy that replaces
# the headers without naming a type (S3's own default there).
NOTHING_TO_SNIFF = "application/octet-stream"
COPY_DEFAULT = "binary/octet-stream"
_MEDIA_TYPE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+/[!#$%&'*+.^_`|~0-9A-Za-z-]+(\s*;[\x20-\x7e]*)?")


class Written(enum.Enum):
    """How an object without a Content-Type was written."""

    PUT = "put"  # PutObject: the body is there to sniff
    MULTIPART = "multipart"  # CreateMultipartUpload: no body yet
    COPY = "copy"  # CopyObject with x-amz-metadata-directive REPLACE and no Content-Type


def valid_default_content_type(setting: str) -> bool:
    """``[spool] default_content_type``: ``"sniff"`` or a media type (``type/subtype[; parameters]``)."""
    return setting == SNIFF or _MEDIA_TYPE.fullmatch(setting) is not None


def default_content_type(setting: str, written: Written, head: bytes = b"") -> str:
    """The Content-Type of an object written without one. ``setting``: ``"sniff"`` or a fixed type.
    ``head``: for a PutObject, the body's first bytes (at least :data:`SNIFF_BYTES` unless it is shorter).

    ``"sniff"`` follows SeaweedFS: a PutObject's non-empty body is sniffed (:func:`detect_content_type`),
    an empty one and a multipart upload get ``application/octet-stream``, a copy ``binary/octet-stream``."""
    if setting != SNIFF:
        return setting
    if written is Written.COPY:
        return COPY_DEFAULT
    if written is Written.MULTIPART or not head:
        return NOTHING_TO_SNIFF
    return detect_content_type(head)
