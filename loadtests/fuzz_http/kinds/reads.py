"""Case kinds: ranges, and the check that a read answer is the slice it names."""

from __future__ import annotations

import re

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import Expect
from loadtests.fuzz_http.kinds.base import seed_object
from loadtests.fuzz_http.rawhttp import Answer, Req


def s3_range(header: str, size: int) -> tuple[int, int] | str:
    """S3's answer to ``Range: header`` on a ``size``-byte object: (first, last), "200" or "416"."""
    unit, sep, spec = header.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return "200"
    m = re.fullmatch(r"([0-9]*)-([0-9]*)", spec.strip(), re.ASCII)
    if m is None or (not m.group(1) and not m.group(2)):
        return "200"
    first_raw, last_raw = m.groups()
    if first_raw and last_raw and int(last_raw) < int(first_raw):
        return "200"
    if first_raw:
        first = int(first_raw)
        if first >= size:
            return "416"
        return first, min(int(last_raw), size - 1) if last_raw else size - 1
    suffix = int(last_raw)
    if suffix == 0 or size == 0:
        return "416"
    return max(size - suffix, 0), size - 1


def _range_header(c: Case, size: int) -> str:
    n = max(size, 1)
    a, b = sorted((c.rng.randrange(n + 3), c.rng.randrange(n + 3)))
    return str(
        c.choice(
            [
                f"bytes={a}-{b}",
                f"bytes={a}-",
                f"bytes=-{c.rng.randrange(n + 3)}",
                f"bytes={b}-{a}",
                f"bytes={size}-",
                "bytes=-0",
                "bytes=",
                "bytes=-",
                f"bytes={a}-{b},{b}-",
                "items=0-1",
                "bytes=abc",
                "bytes=1-2-3",
                f"bytes= {a}-{b}",
                f"BYTES={a}-{b}",
                "bytes=0-99999999999999999999999",
                "bytes=99999999999999999999-",
                "bytes=\u0661-\u0662",
                "bytes=0x10-",
                "bytes=-1-2",
                f"bytes=\t{a}-{b}",
                "",
                "bytes",
                "=0-1",
                "bytes==0-1",
                f"bytes={a}-{b}\udcff",
                "bytes=0-0",
                f"bytes=-{size}",
            ]
        )
    )


async def case_range(c: Case) -> None:
    """Ranges, partNumber and conditional headers on a spooled or backend object; bodies must be right."""
    key, body = await seed_object(c)
    stored = c.run.ledger.objects.get(key)
    if stored is None:
        return
    method = "GET" if c.rng.random() < 0.8 else "HEAD"
    variant = c.choice(["range", "range", "range", "part-number", "conditional", "range-and-part"])
    headers: list[tuple[str, str]] = []
    query = ""
    exp = Expect(frozenset({200, 206, 304, 400, 412, 416}), None)
    if variant in ("range", "range-and-part"):
        header = _range_header(c, len(body))
        headers.append(("Range", header))
    if variant in ("part-number", "range-and-part"):
        value = c.choice(
            [
                "0",
                "-1",
                "1",
                "2",
                "10001",
                "abc",
                "",
                "%C2%B2",
                "%EF%BC%91",
                "1.0",
                "%201",
                "01",
                "99999999999999999999",
            ]
        )
        query = f"partNumber={value}"
    if variant == "conditional":
        name = c.choice(["If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"])
        value = c.choice(
            [
                "*",
                '"abc"',
                f'"{stored.etag}"',
                stored.etag,
                "W/" + f'"{stored.etag}"',
                "garbage",
                "",
                "Mon, 01 Jan 2024 00:00:00 GMT",
                "Mon, 01 Jan 2999 00:00:00 GMT",
                "\udcff",
            ]
        )
        headers.append((name, value))
    req = c.signed(method, key, headers=headers, query=query)
    ans = await c.x(f"{variant} {method}", req, exp)
    if method == "GET" and ans.status in (200, 206):
        _check_read(c, req, ans, body)
    await c.check(key)


def _check_read(c: Case, req: Req, ans: Answer, body: bytes) -> None:
    """A 200 must carry the whole object, a 206 exactly the slice its Content-Range names."""
    if ans.status == 200:
        if ans.body != body:
            c.run.problem(
                "wrong_answers", c, "read", req.wire(), ans, f"200 with {len(ans.body)} of {len(body)} bytes"
            )
        return
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", ans.header("content-range") or "")
    if m is None or int(m.group(3)) != len(body) or ans.body != body[int(m.group(1)) : int(m.group(2)) + 1]:
        got = f"Content-Range {ans.header('content-range')!r}, {len(ans.body)} bytes"
        note = f"{got} of a {len(body)}-byte object"
        c.run.problem("wrong_answers", c, "ranged read", req.wire(), ans, note)
        return
    rng = req.get("Range")
    if rng is not None and "partNumber" not in req.target:
        want = s3_range(rng, len(body))
        if want != (int(m.group(1)), int(m.group(2))):
            # The bytes match what the answer says; only the choice differs from S3's.
            exp = Expect(frozenset({200 if want == "200" else 206}), None)
            c.run.classify(c, f"ranged read (S3 answers {want})", "GET", req.wire(), ans, exp)
