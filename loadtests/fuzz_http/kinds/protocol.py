"""Case kinds: odd methods, HTTP/1.0, pipelining, oversized heads, garbage, Expect: 100-continue."""

from __future__ import annotations

from urllib.parse import quote

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import ANY, AUTH_ERRORS, AUTH_FAIL, OK, Expect, expect
from loadtests.fuzz_http.kinds.auth import _garbage_authorization
from loadtests.fuzz_http.kinds.base import seed_object
from loadtests.fuzz_http.rawhttp import Req

# The methods of case_methods: HEAD, OPTIONS, WebDAV's, made up, lower case and overlong ones.
_ODD_METHODS = (
    "OPTIONS",
    "PATCH",
    "TRACE",
    "PROPFIND",
    "FOO",
    "get",
    "CONNECT",
    "M" * 100,
    "HEAD",
    "MKCOL",
    "LOCK",
    "SEARCH",
)


async def case_methods(c: Case) -> None:
    """HEAD, OPTIONS and methods S3 does not know, signed and not, on the bucket and on keys."""
    key, _ = await seed_object(c)
    method = c.choice(_ODD_METHODS)
    on_key = c.rng.random() < 0.6
    signed = c.rng.random() < 0.7
    if signed:
        req = c.signed(method, key if on_key else None)
    else:
        req = Req(method, c.path(key if on_key else None), [("Host", c.run.host_header)])
        if c.rng.random() < 0.5:
            req.headers += [("Origin", "http://example.com"), ("Access-Control-Request-Method", "GET")]
    ans = await c.x(
        f"{method[:12]} {'signed' if signed else 'unsigned'}", req, Expect(ANY.statuses, None, True)
    )
    if method == "HEAD" and ans.body:
        c.run.problem("wrong_answers", c, "HEAD", req.wire(), ans, "a HEAD answer with a body")
    await c.check(key)


async def case_http10(c: Case) -> None:
    """HTTP/1.0 (with and without Host), HTTP/0.9-style and unknown versions."""
    key, body = await seed_object(c)
    variant = c.choice(
        ["1.0 GET", "1.0 GET no host", "1.0 PUT", "1.0 keep-alive", "0.9", "2.0", "1.2", "9.9"]
    )
    if variant == "0.9":
        data = f"GET {c.path(key)}\r\n\r\n".encode()
        await c.x(variant, data, Expect(frozenset(range(400, 600)), None, True), half_close=True)
    elif variant in ("2.0", "1.2", "9.9"):
        req = c.signed("GET", key)
        req.version = f"HTTP/{variant}"
        await c.x(f"HTTP/{variant}", req, Expect(frozenset({200, 400, 404, 505}), None, True))
    else:
        method = "PUT" if variant == "1.0 PUT" else "GET"
        new = c.body(c.rng.randint(0, 3000)) if method == "PUT" else b""
        req = c.signed(method, key, body=new)
        req.version = "HTTP/1.0"
        exp = OK
        if variant == "1.0 GET no host":
            req.drop("Host")
            exp = expect(400, 403, codes=AUTH_ERRORS)
        if variant == "1.0 keep-alive":
            req.headers.append(("Connection", "keep-alive"))
        ans = await c.x(variant, req, exp)
        if method == "PUT":
            c.after_write(key, new, ans)
        elif ans.status == 200 and ans.body != body and key in c.run.ledger.objects:
            c.run.problem("wrong_answers", c, variant, req.wire(), ans, "HTTP/1.0 GET body differs")
    await c.check(key, same_conn=False)


async def case_pipeline(c: Case) -> None:
    """Several requests in one write; every answer must belong to its own request, in order."""
    key, body = await seed_object(c)
    reqs: list[Req] = []
    exps: list[Expect] = []
    checks: list[tuple[int, bytes | None]] = []  # (index, expected GET body or None for 404)
    current: bytes | None = body if key in c.run.ledger.objects else None
    uncertain = key in c.run.ledger.uncertain
    for i in range(c.rng.randint(2, 6)):
        what = c.choice(["get", "get", "put", "head", "bad-auth", "missing", "bad-range", "list"])
        if what == "get":
            reqs.append(c.signed("GET", key))
            exps.append(OK if current is not None else expect(404))
            checks.append((i, current))
        elif what == "put":
            current = c.body(c.rng.randint(0, 2000))
            reqs.append(c.signed("PUT", key, body=current))
            exps.append(OK)
        elif what == "head":
            reqs.append(c.signed("HEAD", key))
            exps.append(OK if current is not None else expect(404))
        elif what == "bad-auth":
            r = c.signed("GET", key)
            reqs.append(r.set("Authorization", _garbage_authorization(c, r.get("Authorization") or "")))
            exps.append(AUTH_FAIL)
        elif what == "missing":
            reqs.append(c.signed("GET", c.key("missing")))
            exps.append(expect(404, codes=["NoSuchKey"]))
        elif what == "bad-range":
            reqs.append(c.signed("GET", key, headers=[("Range", f"bytes={10**9}-")]))
            exps.append(expect(416, 200, 404, codes=["InvalidRange", "NoSuchKey"]))
        else:
            reqs.append(c.signed("GET", None, query=f"list-type=2&prefix={quote(c.prefix, safe='~')}"))
            exps.append(OK)
    answers = await c.pipeline("pipelined", reqs, exps)
    for r, ans in zip(reqs, answers, strict=True):
        if r.method == "PUT":
            c.after_write(key, r.body, ans)
    if not uncertain:
        for i, want in checks:
            ans = answers[i]
            if ans.status is None:
                continue
            if (want is None and ans.status != 404) or (
                want is not None and (ans.status != 200 or ans.body != want)
            ):
                if not ans.from_handler and ans.closes:
                    # aiohttp parses what one read brought as a whole: an unparsable request in it gets the
                    # whole batch one 400 and the connection closed. Nothing ran; not a desync.
                    c.run.figures.pipelines_refused_whole += 1
                    break
                c.run.problem(
                    "desynced", c, f"pipelined[{i}]", reqs[i].wire(), ans, "answer of another request"
                )
    await c.check(key, same_conn=False)


async def case_big_head(c: Case) -> None:
    """Oversized header sections, header values, request lines and URLs."""
    key, _ = await seed_object(c)
    variant = c.choice(
        [
            "many headers",
            "one huge value",
            "huge signed meta",
            "long url",
            "huge request line",
            "many small signed",
        ]
    )
    exp = Expect(frozenset({400, 413, 414, 431}), None, no_answer=True)
    if variant == "many headers":
        req = c.signed("GET", key)
        req.headers += [(f"X-Pad-{i}", "v" * 50) for i in range(c.rng.randint(100, 3000))]
    elif variant == "one huge value":
        req = c.signed("GET", key)
        req.headers.append(("X-Pad", "v" * c.rng.choice([8200, 16 * 1024, 64 * 1024, 1024 * 1024])))
    elif variant == "huge signed meta":
        req = c.signed("PUT", key, headers=[("x-amz-meta-pad", "m" * c.rng.randint(7000, 9000))], body=b"x")
        exp = Expect(frozenset({200, 400, 413, 431}), None, no_answer=True)
    elif variant == "many small signed":
        hdrs = [(f"x-amz-meta-k{i}", "v" * 20) for i in range(c.rng.randint(200, 400))]
        req = c.signed("PUT", key, headers=hdrs, body=b"x")
    elif variant == "long url":
        long_key = c.prefix + "u" * c.rng.randint(8 * 1024, 20 * 1024)
        req = c.signed("GET", long_key)
    else:
        req = c.signed("GET", key, query="x=" + "q" * c.rng.randint(9000, 70000))
    ans = await c.x(variant, req, exp)
    if ans.status == 200 and req.method == "PUT":
        c.after_write(key, req.body, ans)
    await c.check(key, same_conn=False)


async def case_garbage(c: Case) -> None:
    """Bytes that are not (valid) HTTP."""
    key, _ = await seed_object(c)
    get = c.signed("GET", key)
    head = get.head_bytes()
    options: list[tuple[str, bytes]] = [
        ("random bytes", c.rng.randbytes(c.rng.randint(1, 2000))),
        ("random text", bytes(c.rng.randint(0x20, 0x7E) for _ in range(c.rng.randint(1, 500)))),
        ("method only", b"GET\r\n\r\n"),
        ("no version", f"GET {c.path(key)}\r\nHost: x\r\n\r\n".encode()),
        ("no final CRLF", head[:-2]),
        ("header without colon", head.replace(b"\r\n\r\n", b"\r\nNoColonHere\r\n\r\n")),
        ("space in header name", head.replace(b"\r\n\r\n", b"\r\nBad Name: x\r\n\r\n")),
        ("space before colon", head.replace(b"Host:", b"Host :")),
        ("obs-fold", head.replace(b"\r\n\r\n", b"\r\nX-Fold: a\r\n b\r\n\r\n")),
        ("bare LF", head.replace(b"\r\n", b"\n")),
        ("bare CR", head.replace(b"\r\n", b"\r")),
        ("NUL in header value", head.replace(b"\r\n\r\n", b"\r\nX-Nul: a\x00b\r\n\r\n")),
        ("NUL in target", head.replace(b" HTTP/1.1", b"\x00 HTTP/1.1", 1)),
        ("control char in target", head.replace(b" HTTP/1.1", b"\x01\x7f HTTP/1.1", 1)),
        ("space in target", head.replace(b" HTTP/1.1", b" x HTTP/1.1", 1)),
        ("latin-1 header value", head.replace(b"\r\n\r\n", b"\r\nx-amz-meta-l: \xe9\xff\r\n\r\n")),
        ("invalid header name bytes", head.replace(b"\r\n\r\n", b"\r\n\xc3\xa9: x\r\n\r\n")),
        (
            "absolute-form target",
            head.replace(c.path(key).encode(), f"http://{c.run.host_header}{c.path(key)}".encode(), 1),
        ),
        ("asterisk target", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("authority target", f"CONNECT {c.run.host_header} HTTP/1.1\r\nHost: x\r\n\r\n".encode()),
        ("tls client hello", bytes.fromhex("16030100a5010000a10303") + c.rng.randbytes(160)),
        ("http2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        (
            "upgrade h2c",
            head.replace(
                b"\r\n\r\n",
                b"\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
            ),
        ),
        (
            "websocket upgrade",
            head.replace(
                b"\r\n\r\n",
                b"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n",
            ),
        ),
        ("empty lines first", b"\r\n\r\n\r\n" + head),
        ("lowercase version", head.replace(b"HTTP/1.1", b"http/1.1", 1)),
    ]
    step, data = c.choice(options)
    await c.x(step, data, Expect(frozenset(range(100, 600)), None, no_answer=True), half_close=True)
    await c.check(key, same_conn=False)


async def case_expect(c: Case) -> None:
    """Expect: 100-continue with good and bad signatures, and Expect values nobody knows."""
    key, _ = await seed_object(c)
    body = c.body(c.rng.randint(1, 4000))
    variant = c.choice(["good", "bad signature", "odd expect", "body without waiting"])
    if variant == "bad signature":
        req = c.signed(
            "PUT", key, body=body, secret=c.run.secret_key + "x", headers=[("Expect", "100-continue")]
        )
    else:
        expect_value = (
            c.choice(["200-ok", "100-continue, foo", "", "100-CONTINUE"])
            if variant == "odd expect"
            else "100-continue"
        )
        req = c.signed("PUT", key, body=body, headers=[("Expect", expect_value)])
    conn = await c.connection(fresh=True)
    if variant in ("body without waiting", "odd expect"):
        exp = OK if variant != "odd expect" else Expect(frozenset({200, 417}), None)
        ans = await c.x(variant, req, exp)
        c.after_write(key, body, ans)
        await c.check(key)
        return
    await conn.send(req.head_bytes())
    first = await conn.answer("PUT", stop_at_interim=True)
    if first.status == 100:
        await conn.send(body)
        ans = await conn.answer("PUT")
        c.run.classify(c, f"{variant}: after 100", "PUT", req.wire(), ans, OK)
        c.after_write(key, body, ans)
    else:
        exp = OK if variant == "good" else expect(403, codes=["SignatureDoesNotMatch"])
        c.run.classify(c, f"{variant}: first answer", "PUT", req.head_bytes(), first, exp)
        if first.status == 200:
            c.run.problem(
                "read_back_mismatch", c, variant, req.head_bytes(), first, "200 before the body was sent"
            )
    await c.check(key, same_conn=False)
