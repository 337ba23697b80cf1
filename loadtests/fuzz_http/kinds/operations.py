"""Case kinds: listing, copy, metadata, response overrides, virtual-hosted style, the admin API."""

from __future__ import annotations

from urllib.parse import quote

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import ANY, OK, Expect, expect
from loadtests.fuzz_http.kinds.base import seed_object
from loadtests.fuzz_http.kinds.multipart import _require_xml
from loadtests.fuzz_http.options import WRITE_THROUGH
from loadtests.fuzz_http.rawhttp import Req, md5_hex


async def case_list(c: Case) -> None:
    """ListObjects V1/V2 with odd prefixes, delimiters, max-keys, markers and tokens."""
    for i in range(c.rng.randint(0, 3)):
        await c.put(
            c.key(f"l{i}/x"), c.body(c.rng.randint(0, 300)), write_through=c.rng.random() < 0.3, step="seed"
        )
    v2 = c.rng.random() < 0.7
    prefix = c.prefix + c.choice(["", "l", "l0/", "\x01", "\x00", "ü", "%", "+", " ", "\ufffe", "\udcff"])
    params = [("list-type", "2")] if v2 else []
    params.append(("prefix", prefix))
    for name, values in [
        ("delimiter", ["/", "l", "\x00", "//", "ü", "", "x" * 300]),
        ("max-keys", ["-1", "abc", "1001", "99999999999", "0", "1", "2147483648", "%C2%B2"]),
        ("encoding-type", ["url", "URL", "foo", ""]),
        ("start-after" if v2 else "marker", [c.prefix, "\x01", "zzz", "", "\udcff"]),
        ("continuation-token", ["", "x", "czNsYW5lczE6", "czNsYW5lczE6_w", "A" * 5000, "%FF"]),
        ("fetch-owner", ["true", "maybe"]),
    ]:
        if c.rng.random() < 0.4:
            params.append((name, str(c.choice(values))))
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='', errors='surrogateescape')}" for k, v in params)
    ans = await c.x("list", c.signed("GET", None, query=query), expect(200, 400, codes=["InvalidArgument"]))
    if ans.status == 200:
        _require_xml(c, "list", ans)


async def case_copy(c: Case) -> None:
    """CopyObject with odd copy sources and conditions."""
    src, body = await seed_object(c)
    dst = c.key("copy")
    source = c.choice(
        [
            f"/{c.run.bucket}/{quote(src)}",
            f"{c.run.bucket}/{quote(src)}",
            "",
            "/",
            c.run.bucket,
            f"/{c.run.bucket}/",
            "%ZZ",
            f"/{c.run.bucket}/{quote(c.key('missing'))}",
            "/../../etc/passwd",
            f"/{c.run.bucket}/..",
            f"/{c.run.marker}-nobucket/{quote(src)}",
            f"/{c.run.bucket}/{quote(src)}?versionId=garbage",
            f"/{c.run.bucket}/%00",
            "x" * 3000,
            f"/{c.run.bucket}/{quote(src)}%FF",
            "\udcff",
        ]
    )
    headers = [("x-amz-copy-source", source)]
    if c.rng.random() < 0.3:
        headers.append(
            (
                c.choice(
                    [
                        "x-amz-copy-source-if-match",
                        "x-amz-copy-source-if-none-match",
                        "x-amz-copy-source-if-modified-since",
                    ]
                ),
                c.choice(["*", "garbage", '""']),
            )
        )
    if c.rng.random() < 0.2:
        headers.append(("x-amz-metadata-directive", c.choice(["REPLACE", "COPY", "garbage", ""])))
    if c.rng.random() < 0.3:
        headers.append(WRITE_THROUGH)
    req = c.signed("PUT", dst, headers=headers)
    ans = await c.x(f"copy from {source[:40]!r}", req, expect(200, 400, 403, 404, 412))
    if ans.status == 200:
        valid = source in (f"/{c.run.bucket}/{quote(src)}", f"{c.run.bucket}/{quote(src)}")
        if valid and src in c.run.ledger.objects:
            c.after_write(dst, body, ans)
        else:
            c.run.ledger.uncertain[dst] = {None, md5_hex(body)}
            # A version id the store does not check (S3: 400/404) still names the source object.
            if not valid and "versionId=" not in source:
                c.run.problem(
                    "wrong_answers", c, "copy", req.wire(), ans, "copy from an odd source answered 200"
                )
    await c.check(dst, same_conn=False)
    await c.check(src)


async def case_meta(c: Case) -> None:
    """Metadata and stored headers with odd values, served back from the spool or the backend."""
    key = c.key("meta")
    body = c.body(c.rng.randint(0, 3000))
    name, value = c.choice(
        [
            ("x-amz-meta-u", "ünïcödé €"),
            ("x-amz-meta-l", "\udce9\udcff"),
            ("x-amz-meta-long", "v" * 2100),
            ("x-amz-meta-empty", ""),
            ("x-amz-meta-ctl", "a\x01b\x7f"),
            ("Content-Type", "text/plain; charset=ü"),
            ("Content-Type", "\udcff/\udcfe"),
            ("Content-Disposition", 'attachment; filename="a\\"b.txt"'),
            ("Cache-Control", "no-cache, \x01"),
            ("Expires", "not a date"),
            ("x-amz-tagging", "a=b&c"),
            ("x-amz-tagging", "%ZZ=%ZZ"),
            ("x-amz-tagging", "k=" + "v" * 300),
            ("x-amz-storage-class", "FOO"),
            ("x-amz-acl", "garbage"),
            ("x-amz-website-redirect-location", "javascript:alert(1)"),
            ("Content-Encoding", "gzip, br, ü"),
            ("Content-Language", "\udcc3("),
            ("x-amz-server-side-encryption", "ROT13"),
            ("x-amz-meta-" + "n" * 200, "v"),
        ]
    )
    headers = [(name, value)]
    if c.rng.random() < 0.4:
        headers += [(f"x-amz-meta-m{i}", "x" * 40) for i in range(60)]
    wt = c.rng.random() < 0.3
    req = c.signed("PUT", key, headers=headers + ([WRITE_THROUGH] if wt else []), body=body)
    ans = await c.x(f"PUT with {name}", req, Expect(frozenset({200, 400}), None))
    c.after_write(key, body, ans)
    if ans.status == 200:
        await c.x(f"HEAD with {name}", c.signed("HEAD", key), OK)
    await c.check(key)


async def case_overrides(c: Case) -> None:
    """response-* overrides carrying CR, LF, NUL and unicode: no header injection, no 500."""
    key, body = await seed_object(c)
    name = c.choice(
        [
            "response-content-type",
            "response-content-disposition",
            "response-cache-control",
            "response-expires",
            "response-content-language",
            "response-content-encoding",
        ]
    )
    value = c.choice(
        [
            "%0D%0AX-Injected:%201",
            "%0AX-Injected:%201",
            "a%00b",
            "%C3%BC",
            "x" * 8000,
            "%FF",
            "%E2%80%A8X-Injected:%201",
            "%C2%85X-Injected:%201",
            "text%2Fplain",
        ]
    )
    req = c.signed("GET", key, query=f"{name}={value}")
    ans = await c.x(f"{name}={value[:20]}", req, expect(200, 400))
    if ans.header("x-injected") is not None:
        c.run.problem("wrong_answers", c, "override", req.wire(), ans, "header injected")
    if ans.status == 200 and ans.body != body and key in c.run.ledger.objects:
        c.run.problem("wrong_answers", c, "override", req.wire(), ans, "body differs")
    await c.check(key)


async def case_vhost(c: Case) -> None:
    """Virtual-hosted-style requests and odd Host headers."""
    key, body = await seed_object(c)
    port = c.run.port
    variant = c.choice(
        [
            "virtual",
            "virtual upper",
            "virtual trailing dot",
            "empty host",
            "bare domain",
            "unicode",
            "long",
            "two hosts",
            "bad port",
            "ipv6",
            "bucket dots",
        ]
    )
    path = "/" + quote(key, safe="/~")
    host = {
        "virtual": f"{c.run.bucket}.localhost:{port}",
        "virtual upper": f"{c.run.bucket.upper()}.LOCALHOST:{port}",
        "virtual trailing dot": f"{c.run.bucket}.localhost.:{port}",
        "empty host": "",
        "bare domain": f"localhost:{port}",
        "unicode": f"bücket.localhost:{port}",
        "long": "h" * 300 + f".localhost:{port}",
        "two hosts": f"{c.run.bucket}.localhost:{port}",
        "bad port": f"{c.run.bucket}.localhost:abc",
        "ipv6": f"[::1]:{port}",
        "bucket dots": f"..{c.run.bucket}.localhost:{port}",
    }[variant]
    virtual = variant.startswith("virtual") or variant in ("two hosts", "bad port")
    req = c.signed("GET", key, raw_path=path if virtual or "localhost" in host else None, host=host)
    if variant == "two hosts":
        req.headers.insert(1, ("Host", c.run.host_header))
    exp = (
        OK
        if variant in ("virtual", "virtual upper", "virtual trailing dot", "bad port")
        else Expect(ANY.statuses, None)
    )
    if key not in c.run.ledger.objects:
        exp = Expect(ANY.statuses, None)
    ans = await c.x(variant, req, exp)
    if ans.status == 200 and variant.startswith("virtual") and ans.body != body:
        c.run.problem("wrong_answers", c, variant, req.wire(), ans, "virtual-hosted GET body differs")
    await c.check(key)


async def case_admin(c: Case) -> None:
    """The admin endpoints with odd methods and parameters (unsigned, from loopback)."""
    path = c.choice(
        [
            "/_s3lanes/status",
            "/_s3lanes/metrics",
            "/metrics",
            "/_s3lanes/flush",
            "/_s3lanes/",
            "/_s3lanes/status/x",
            "/healthz",
            "/readyz",
            "/_s3lanes/ui",
            "/_s3lanes/flush%00",
        ]
    )
    method = c.choice(["GET", "POST", "PUT", "DELETE", "HEAD"])
    query = c.choice(
        [
            "",
            f"bucket={c.run.marker}-nobucket&timeout=" + c.choice(["-1", "abc", "nan", "inf", "1e309", "0"]),
            f"bucket={c.run.bucket}&prefix={quote(c.prefix)}&timeout=5",
            "bucket=..&prefix=%00&timeout=1",
            "bucket=&timeout=1",
            "timeout=1",
            f"bucket={c.run.bucket}&prefix=%FF&timeout=1",
        ]
    )
    target = path + (f"?{query}" if query else "")
    req = Req(method, target, [("Host", c.run.host_header), ("Content-Length", "0")])
    await c.x(f"{method} {path}", req, Expect(ANY.statuses, None))
