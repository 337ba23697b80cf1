"""The default Content-Type of an object written without one (s3lanes.core.sniff)."""

from __future__ import annotations

import pytest

from s3lanes.core.sniff import (
    SNIFF,
    SNIFF_BYTES,
    Written,
    default_content_type,
    detect_content_type,
    valid_default_content_type,
)

# Go's net/http sniff_test.go cases (what SeaweedFS stores for a PUT without Content-Type).
GO_CASES = [
    (b"", "text/plain; charset=utf-8"),
    (b"\x01\x02\x03", "application/octet-stream"),
    (b"\n<html>blah</html>", "text/html; charset=utf-8"),
    (b"<HtMl><bOdY>blah blah blah</body></html>", "text/html; charset=utf-8"),
    (b"<HTML  \x00", "text/html; charset=utf-8"),
    (b"<!DOCTYPE HTML>...", "text/html; charset=utf-8"),
    (b"<!-- comment -->", "text/html; charset=utf-8"),
    (b"<p>x", "text/html; charset=utf-8"),
    (b"<pa>x", "text/plain; charset=utf-8"),  # not a tag the table names
    (b"\n<?xml!", "text/xml; charset=utf-8"),
    (b"%PDF-1.4", "application/pdf"),
    (b"%!PS-Adobe-3.0", "application/postscript"),
    (b"\xfe\xff\x00\x41", "text/plain; charset=utf-16be"),
    (b"\xff\xfe\x41\x00", "text/plain; charset=utf-16le"),
    (b"\xef\xbb\xbfhi", "text/plain; charset=utf-8"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a...", "image/gif"),
    (b"\x89PNG\x0d\x0a\x1a\x0a", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"BMxyz", "image/bmp"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image/webp"),
    (b"\x00\x00\x01\x00", "image/x-icon"),
    (b".snd\x00\x00", "audio/basic"),
    (b"FORM\x00\x00\x00\x00AIFF", "audio/aiff"),
    (b"ID3\x03", "audio/mpeg"),
    (b"OggS\x00\x02", "application/ogg"),
    (b"MThd\x00\x00\x00\x06\x00\x01", "audio/midi"),
    (b"RIFF,O\n\x00AVI LIST\xc0", "video/avi"),
    (b"RIFF,\n\x00\x00WAVEfmt ", "audio/wave"),
    (b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom<\x06t\xbfmdat", "video/mp4"),
    (b"\x1aE\xdf\xa3\x01\x00", "video/webm"),
    (b"\x00" * 34 + b"LP", "application/vnd.ms-fontobject"),
    (b"\x00\x01\x00\x00", "font/ttf"),
    (b"OTTO", "font/otf"),
    (b"ttcf", "font/collection"),
    (b"wOFF", "font/woff"),
    (b"wOF2", "font/woff2"),
    (b"\x1f\x8b\x08", "application/x-gzip"),
    (b"PK\x03\x04", "application/zip"),
    (b"Rar!\x1a\x07\x00", "application/x-rar-compressed"),
    (b"Rar!\x1a\x07\x01\x00", "application/x-rar-compressed"),
    (b"\x00asm\x01\x00", "application/wasm"),
    (b"hello, world\n", "text/plain; charset=utf-8"),
    (b"tab\tand\x0cform feed\x1b esc", "text/plain; charset=utf-8"),  # 0x1B is allowed
    (b"x\x1cy", "application/octet-stream"),
]


@pytest.mark.parametrize(("data", "want"), GO_CASES)
def test_detect_content_type_is_gos(data: bytes, want: str) -> None:
    assert detect_content_type(data) == want


def test_only_the_first_512_bytes_are_looked_at() -> None:
    assert detect_content_type(b"a" * SNIFF_BYTES + b"\x00") == "text/plain; charset=utf-8"
    assert detect_content_type(b"a" * (SNIFF_BYTES - 1) + b"\x00") == "application/octet-stream"


def test_sniff_follows_the_store_for_each_way_of_writing() -> None:
    assert default_content_type(SNIFF, Written.PUT, b"words") == "text/plain; charset=utf-8"
    assert default_content_type(SNIFF, Written.PUT, b"") == "application/octet-stream"  # nothing to sniff
    assert default_content_type(SNIFF, Written.MULTIPART) == "application/octet-stream"
    assert default_content_type(SNIFF, Written.COPY) == "binary/octet-stream"


@pytest.mark.parametrize("written", list(Written))
def test_a_fixed_default_is_used_for_every_write(written: Written) -> None:
    assert default_content_type("binary/octet-stream", written, b"words") == "binary/octet-stream"


@pytest.mark.parametrize(
    ("setting", "valid"),
    [
        ("sniff", True),
        ("binary/octet-stream", True),
        ("text/plain; charset=utf-8", True),
        ("", False),
        ("octet-stream", False),
        ("a/b\nc", False),
        ("Sniff", False),
    ],
)
def test_the_setting_is_sniff_or_a_media_type(setting: str, valid: bool) -> None:
    assert valid_default_content_type(setting) is valid
