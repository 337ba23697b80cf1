"""Case kinds: payload hashes and digests, truncated and mis-framed bodies, aws-chunked framing."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import BODY_ERRORS, OK, Expect, expect
from loadtests.fuzz_http.kinds.base import seed_object
from loadtests.fuzz_http.options import REGION, WRITE_THROUGH
from loadtests.fuzz_http.rawhttp import Answer, Req, crc32_b64, md5_b64, md5_hex, sha256_hex
from s3lanes.core.chunked import encode_aws_chunked
from s3lanes.core.sigv4 import (
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    ChunkSigner,
)


async def case_payload(c: Case) -> None:
    """Wrong or malformed x-amz-content-sha256, Content-MD5 and x-amz-checksum-*; the old object survives."""
    key, _ = await seed_object(c)
    body = c.body() if c.rng.random() < 0.85 else b""  # an empty body makes no digest true but its own
    other = body + b"!" if c.rng.random() < 0.5 or not body else c.body(len(body))  # never equal to body
    wt = [WRITE_THROUGH] if c.rng.random() < 0.3 else []
    variant = c.choice(
        [
            "sha256-wrong",
            "sha256-malformed",
            "md5-wrong",
            "md5-malformed",
            "checksum-wrong",
            "checksum-malformed",
            "checksum-two",
            "checksum-unknown",
            "sdk-algorithm",
            "control",
        ]
    )
    unsigned = c.rng.random() < 0.5
    payload = UNSIGNED_PAYLOAD if unsigned else None
    headers: list[tuple[str, str]] = list(wt)
    exp = expect(400, codes=BODY_ERRORS)
    if variant == "sha256-wrong":
        payload = sha256_hex(other)
        exp = expect(400, codes=["XAmzContentSHA256Mismatch"])
    elif variant == "sha256-malformed":
        payload = c.choice(
            [
                "abc",
                sha256_hex(body)[:63],
                sha256_hex(body) + "0",
                "STREAMING-FOO",
                "unsigned-payload",
                "z" * 64,
                "UNSIGNED-PAYLOAD\udcff",
            ]
        )
        exp = expect(400, codes=["InvalidArgument"])
    elif variant == "md5-wrong":
        headers.append(("Content-MD5", md5_b64(other)))
        exp = expect(400, codes=["BadDigest"])
    elif variant == "md5-malformed":
        headers.append(("Content-MD5", c.choice(["abc", "", "====", md5_b64(body)[:-2], md5_hex(body), "ü"])))
        exp = expect(400, codes=["InvalidDigest"])
    elif variant == "checksum-wrong":
        headers.append(("x-amz-checksum-crc32", crc32_b64(other)))
        exp = expect(400, codes=["BadDigest"])
    elif variant == "checksum-malformed":
        headers.append(("x-amz-checksum-crc32", c.choice(["", "abc", "AAAAAAAA", "!!!!", "AAAA===="])))
        exp = expect(400, codes=["InvalidRequest", "InvalidArgument"])
    elif variant == "checksum-two":
        headers += [
            ("x-amz-checksum-crc32", crc32_b64(body)),
            ("x-amz-checksum-sha256", base64.b64encode(hashlib.sha256(body).digest()).decode()),
        ]
        exp = expect(400, codes=["InvalidRequest"])
    elif variant == "checksum-unknown":
        headers.append(("x-amz-checksum-md7", "AAAA"))
        exp = expect(200, 400, codes=["InvalidRequest", "InvalidArgument"])
    elif variant == "sdk-algorithm":
        headers += [
            ("x-amz-sdk-checksum-algorithm", c.choice(["SHA1", "FOO", ""])),
            ("x-amz-checksum-crc32", crc32_b64(body)),
        ]
        exp = expect(400, codes=["InvalidRequest"])
    else:
        exp = OK
    req = c.signed("PUT", key, headers=headers, body=body, payload=payload)
    ans = await c.x(variant, req, exp)
    c.after_write(key, body, ans)
    await c.check(key)


async def case_truncated(c: Case) -> None:
    """A body shorter than its Content-Length (the client goes away); nothing of it may be stored."""
    key, _ = await seed_object(c)
    body = c.body(c.rng.randint(1, 4000) if c.rng.random() < 0.6 else None) or b"x"
    wt = [WRITE_THROUGH] if c.rng.random() < 0.3 else []
    payload = UNSIGNED_PAYLOAD if c.rng.random() < 0.5 else None
    req = c.signed("PUT", key, headers=wt, body=body, payload=payload)
    req.sent_body = body[: c.rng.randrange(len(body))]
    exp = expect(400, codes=["IncompleteBody"], no_answer=True)
    ans = await c.x("truncated then EOF", req, exp, half_close=True)
    if ans.status == 200:
        c.run.problem(
            "read_back_mismatch", c, "truncated then EOF", req.wire(), ans, "a cut body was acknowledged"
        )
    await c.check(key, same_conn=False)


async def case_length(c: Case) -> None:
    """Odd Content-Length and Transfer-Encoding: huge, negative, garbage, duplicated, both, extra bytes."""
    key, _ = await seed_object(c)
    body = c.body(c.rng.randint(1, 3000))
    variant = c.choice(
        [
            "huge",
            "garbage",
            "duplicate",
            "cl-and-te",
            "te-chunked",
            "te-bad",
            "te-odd",
            "extra-bytes",
            "get-with-body",
            "missing",
        ]
    )
    req = c.signed("PUT", key, body=body, payload=UNSIGNED_PAYLOAD if c.rng.random() < 0.5 else None)
    parser_or_s3 = Expect(frozenset({400, 411, 413, 501}), None, no_answer=True)
    if variant == "huge":
        req.set("Content-Length", str(c.choice([5 * 1024**3 + 1, 10**13, 2**63 - 1, 2**64, 10**30])))
        ans = await c.x(
            "huge Content-Length then EOF", req, expect(400, 413, no_answer=True), half_close=True
        )
    elif variant == "garbage":
        req.set(
            "Content-Length",
            c.choice(["-1", "abc", "1 2", "0x10", "+5", "5,5", "", "1e3", "\u0663", "\udcff"]),
        )
        ans = await c.x("garbage Content-Length", req, parser_or_s3, half_close=True)
    elif variant == "duplicate":
        req.headers.append(("Content-Length", c.choice([str(len(body)), str(len(body) + 1), "0"])))
        ans = await c.x("two Content-Length", req, Expect(frozenset({200, 400}), None, True), half_close=True)
    elif variant == "cl-and-te":
        req.set("Transfer-Encoding", "chunked")
        req.body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        ans = await c.x("Content-Length and chunked", req, Expect(frozenset({200, 400, 411}), None, True))
    elif variant in ("te-chunked", "te-bad"):
        req.drop("Content-Length").set("Transfer-Encoding", "chunked")
        pieces = [body[i : i + 700] for i in range(0, len(body), 700)]
        coded = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
        if variant == "te-bad":
            coded = c.choice(
                [
                    b"zz\r\n" + coded,
                    coded[:-2],
                    coded.replace(b"\r\n", b"\n", 1),
                    b"fffffffffffffffffff\r\n" + coded,
                    coded[: len(coded) // 2],
                ]
            )
        req.body = coded
        exp = Expect(frozenset({200, 400, 411}), None, no_answer=True)
        ans = await c.x(f"{variant}", req, exp, half_close=variant == "te-bad")
        if variant == "te-bad" and ans.status == 200:
            c.run.problem(
                "read_back_mismatch", c, variant, req.wire(), ans, "a broken chunked body was acknowledged"
            )
            ans = Answer(400)
    elif variant == "te-odd":
        req.drop("Content-Length").set(
            "Transfer-Encoding",
            c.choice(["gzip, chunked", "chunked, gzip", "identity", "xchunked", "chunked\x0b", " chunked"]),
        )
        ans = await c.x(
            "odd Transfer-Encoding", req, Expect(frozenset({200, 400, 411, 501}), None, True), half_close=True
        )
    elif variant == "extra-bytes":
        extra = c.choice([b"garbage", b"\r\n\r\n", b"GET / HTTP/1.1\r\n", c.rng.randbytes(50)])
        req.sent_body = body + extra
        # aiohttp parses what arrived in one read as a whole: junk right behind a request may get the
        # request itself refused (400, not executed), which is fine; executing part of it is not.
        exp = Expect(frozenset({200, 400}), None, no_answer=True)
        ans = await c.x("body longer than Content-Length", req, exp, half_close=True)
        c.after_write(key, body, ans)
        conn = await c.connection()
        if ans.status == 200 and not ans.closes:
            junk = await conn.answer("GET")
            c.run.classify(
                c, "the extra bytes", "GET", extra, junk, Expect(frozenset({400}), None, no_answer=True)
            )
        await c.check(key, same_conn=False)
        return
    elif variant == "get-with-body":
        req = c.signed("GET", key, body=body, content_length=True)
        ans = await c.x("GET with a body", req, expect(200, 400))
        await c.check(key)
        return
    else:  # no Content-Length, no Transfer-Encoding: an empty body for HTTP/1.1
        req.drop("Content-Length")
        req.sent_body = b""
        req = c.signed("PUT", key, body=b"", content_length=False)
        ans = await c.x("PUT without Content-Length", req, expect(200, 411, codes=["MissingContentLength"]))
        c.after_write(key, b"", ans)
        await c.check(key)
        return
    c.after_write(key, body, ans)  # no answer (a half-close): either outcome, the check is skipped
    await c.check(key, same_conn=False)


def _streaming_put(
    c: Case,
    key: str,
    payload_bytes: bytes,
    mode: str,
    *,
    trailer: bool,
    headers: Sequence[tuple[str, str]] = (),
) -> tuple[Req, bytes]:
    """A valid aws-chunked PUT in ``mode`` (STREAMING-*), with a CRC32 trailer if ``trailer``."""
    trailer_headers = [("x-amz-trailer", "x-amz-checksum-crc32")] if trailer else []
    hdrs = [
        ("Content-Encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", str(len(payload_bytes))),
        *trailer_headers,
        *headers,
    ]
    req = c.signed("PUT", key, headers=hdrs, payload=mode, content_length=False)
    cuts = sorted(
        c.rng.sample(range(1, len(payload_bytes)), min(c.rng.randint(0, 4), max(len(payload_bytes) - 1, 0)))
    )
    chunks = [payload_bytes[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload_bytes)], strict=True)]
    trailers = {"x-amz-checksum-crc32": crc32_b64(payload_bytes)} if trailer else None
    signer = None
    if mode in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER):
        seed = (req.get("Authorization") or "").rsplit("Signature=", 1)[1]
        signer = ChunkSigner.for_request(
            secret_key=c.run.secret_key,
            amz_date=req.get("x-amz-date") or "",
            region=REGION,
            seed_signature=seed,
        )
    encoded = encode_aws_chunked(chunks, signer=signer, trailers=trailers)
    req.body = encoded
    req.set("Content-Length", str(len(encoded)))
    return req, encoded


def _break_framing(c: Case, encoded: bytes, signed: bool) -> tuple[str, bytes]:
    first_line_end = encoded.index(b"\r\n")
    size_text = encoded[:first_line_end].split(b";")[0]
    variants: list[tuple[str, bytes]] = [
        (
            "bad hex size",
            c.choice([b"zz", b"-1", b"", b" 10", b"0x10", b"1" * 20, b"ffffffffffff"])
            + encoded[len(size_text) :],
        ),
        ("missing CRLF after the size", encoded[:first_line_end] + encoded[first_line_end + 2 :]),
        ("bare LF after the size", encoded[:first_line_end] + b"\n" + encoded[first_line_end + 2 :]),
        ("bytes after the end", encoded + c.choice([b"0\r\n\r\n", b"x", b"\r\n"])),
        ("no final chunk", encoded[: _final_chunk_at(encoded)]),
        ("random byte flipped", _flip(c, encoded)),
        ("random bytes inserted", _insert(c, encoded)),
        ("random cut", encoded[: c.rng.randrange(len(encoded))]),
        ("chunk header too long", encoded[:first_line_end] + b";" + b"x" * 2000 + encoded[first_line_end:]),
    ]
    if b"\r\n\r\n" in encoded[first_line_end:]:
        data_end = encoded.index(b"\r\n", first_line_end + 2 + int(size_text, 16))
        variants.append(("missing CRLF after data", encoded[:data_end] + encoded[data_end + 2 :]))
    if signed:
        sig_at = encoded.find(b"chunk-signature=")
        if sig_at >= 0:
            variants += [
                (
                    "chunk signature changed",
                    encoded[: sig_at + 16]
                    + bytes(reversed(encoded[sig_at + 16 : sig_at + 80]))
                    + encoded[sig_at + 80 :],
                ),
                ("chunk signature missing", encoded[: sig_at - 1] + encoded[sig_at + 80 :]),
                ("chunk signature short", encoded[: sig_at + 79] + encoded[sig_at + 80 :]),
            ]
    if b"x-amz-checksum-crc32:" in encoded:
        at = encoded.index(b"x-amz-checksum-crc32:")
        line_end = encoded.index(b"\r\n", at)
        variants += [
            ("trailer wrong checksum", encoded[: at + 21] + b"AAAAAA==" + encoded[line_end:]),
            ("trailer not announced", encoded[:at] + b"x-amz-checksum-sha1" + encoded[at + 20 :]),
            ("trailer repeated", encoded[:at] + encoded[at : line_end + 2] + encoded[at:]),
            ("trailer missing", encoded[:at] + encoded[line_end + 2 :]),
            ("trailer without colon", encoded[: at + 20] + encoded[at + 21 :]),
            ("trailer too big", encoded[:at] + b"x-amz-meta-pad:" + b"p" * 20000 + b"\r\n" + encoded[at:]),
            ("final empty line missing", encoded[:-2]),
        ]
        if b"x-amz-trailer-signature:" in encoded:
            sat = encoded.index(b"x-amz-trailer-signature:") + 24
            variants.append(("trailer signature changed", encoded[:sat] + b"0" * 64 + encoded[sat + 64 :]))
    name, body = c.choice(variants)
    return str(name), bytes(body)


def _final_chunk_at(encoded: bytes) -> int:
    """Where the zero-size chunk's header starts (the body is chunks, then that header, then trailers)."""
    at = max(encoded.rfind(b"\r\n0;"), encoded.rfind(b"\r\n0\r\n"))
    return at + 2 if at >= 0 else 0


def _flip(c: Case, data: bytes) -> bytes:
    if not data:
        return b"\x00"
    pos = c.rng.randrange(len(data))
    return data[:pos] + bytes([data[pos] ^ c.rng.randint(1, 255)]) + data[pos + 1 :]


def _insert(c: Case, data: bytes) -> bytes:
    pos = c.rng.randrange(len(data) + 1)
    return data[:pos] + c.rng.randbytes(c.rng.randint(1, 8)) + data[pos:]


async def case_aws_chunked(c: Case) -> None:
    """aws-chunked bodies: valid (signed, signed with trailer, unsigned with trailer) and broken framing."""
    key, _ = await seed_object(c)
    payload_bytes = c.body(c.rng.randint(0, 5000) if c.rng.random() < 0.8 else None)
    mode = c.choice([STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER])
    trailer = mode != STREAMING_SIGNED
    wt = [WRITE_THROUGH] if c.rng.random() < 0.3 else []
    req, encoded = _streaming_put(c, key, payload_bytes, mode, trailer=trailer, headers=wt)
    signed = mode != STREAMING_UNSIGNED_TRAILER
    variant = c.choice(["valid", "framing", "framing", "framing", "decoded-length", "headers"])
    step = variant
    exp: Expect = OK
    half_close = False
    if variant == "framing":
        step, body = _break_framing(c, encoded, signed)
        req.body = body
        req.set("Content-Length", str(len(body)))
        # Content-Length matches what is sent: the server reads it all and must answer (a half-close here
        # would make aiohttp drop the connection before the answer, whatever the outcome).
        exp = Expect(frozenset({200, 400, 403}), frozenset(BODY_ERRORS))
    elif variant == "decoded-length":
        value = c.choice(
            [
                str(len(payload_bytes) + 1),
                str(max(len(payload_bytes) - 1, 0) if payload_bytes else 1),
                "abc",
                "-1",
                "",
                "1e3",
                str(2**64),
                "\u0663",
                None,
            ]
        )
        step = f"x-amz-decoded-content-length {value!r}"
        if value is None:
            req.drop("x-amz-decoded-content-length")
        else:
            req.set("x-amz-decoded-content-length", value)
        exp = expect(400, 403, 411, codes=[*BODY_ERRORS, "AccessDenied"])
    elif variant == "headers":
        what = c.choice(
            ["no content-encoding", "odd content-encoding", "trailer header garbage", "no trailer header"]
        )
        step = what
        if what == "no content-encoding":
            req.drop("Content-Encoding")
        elif what == "odd content-encoding":
            req.set(
                "Content-Encoding", c.choice(["aws-chunked, gzip", "gzip,aws-chunked", "AWS-CHUNKED", ","])
            )
        elif what == "trailer header garbage":
            req.set(
                "x-amz-trailer",
                c.choice(["x-amz-checksum-foo", "", ",,,", "x-amz-checksum-crc32,x-amz-checksum-crc32"]),
            )
        else:
            req.drop("x-amz-trailer")
        exp = Expect(frozenset({200, 400, 403}), frozenset([*BODY_ERRORS, "AccessDenied"]))
    ans = await c.x(step, req, exp, half_close=half_close)
    c.after_write(key, payload_bytes, ans)  # a 200 must have stored exactly the payload: check() reads it
    await c.check(key, same_conn=not half_close)
