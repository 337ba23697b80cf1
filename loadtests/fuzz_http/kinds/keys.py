"""Case kinds: odd keys, raw paths and unknown query parameters."""

from __future__ import annotations

from urllib.parse import quote

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import ANY, OK, Expect, expect
from loadtests.fuzz_http.kinds.base import seed_object
from loadtests.fuzz_http.kinds.multipart import _require_xml
from loadtests.fuzz_http.options import WRITE_THROUGH
from loadtests.fuzz_http.rawhttp import answer_source, md5_hex


def _odd_key(c: Case) -> tuple[str, str | None]:
    """(key name, raw path override or None): hostile keys and their relatives."""
    marker_name = f"{c.run.marker}-c{c.index:05d}"
    unicode_kib = "".join(
        chr(
            c.rng.choice(
                [c.rng.randint(0xA0, 0xD7FF), c.rng.randint(0xE000, 0xFFFD), c.rng.randint(0x10000, 0x10FFFF)]
            )
        )
        for _ in range(300)
    )
    unicode_kib = unicode_kib.encode("utf-8")[:1024].decode("utf-8", "ignore")
    controls = "".join(chr(c.rng.choice([*range(1, 32), 0x7F])) for _ in range(c.rng.randint(1, 8)))
    p = c.prefix
    options: list[tuple[str, str | None]] = [
        (p + "..", None),
        (p + ".", None),
        (p + "sub/../up", None),
        (p + "sub/./here", None),
        (p + "a//b", None),
        (p + "trailing/", None),
        (p + "..\\..\\win", None),
        (p + "nul\x00byte", None),
        (p + "slash%2Fin-name", None),
        (p + "a/b", c.path(p) + "a%2Fb"),  # an encoded slash is a slash in the key
        (p + "..", c.path(p) + "%2E%2E"),
        (
            p + "invalid-utf8",
            c.path(p) + c.choice(["%FF%FE", "a%C3%28", "%ED%A0%80", "%C0%AF", "%F8%88%80%80%80"]),
        ),
        (p + "uni-" + unicode_kib, None),
        (p + "ctl-" + controls, None),
        (p + "long-" + "k" * c.rng.randint(1025 - len(p), 1400), None),
        (p + "exact-" + "k" * (1024 - len(p) - 6), None),
        (p + "q?#&=+ %", None),
        (p + "emoji-\U0001f600\u202e\u200b", None),
        (p + "nonchar-\ufffe\uffff", None),
        (p + "../../../../../../../../tmp/" + marker_name, None),
        (p + "..%2f..%2f..%2f..%2ftmp%2f" + marker_name, None),
        ("/tmp/" + marker_name, None),
        ("../" + marker_name, None),
        ("./" + marker_name, None),
    ]
    return c.choice(options)


async def case_odd_keys(c: Case) -> None:
    """PUT, GET, HEAD, LIST and DELETE of hostile keys: stored and read back exactly, or refused."""
    key, raw_path = _odd_key(c)
    body = c.body(c.rng.randint(0, 3000))
    wt = c.rng.random() < 0.3
    headers = [WRITE_THROUGH] if wt else []
    req = c.signed("PUT", key, headers=headers, body=body, raw_path=raw_path)
    exp = Expect(frozenset({200, 400}), None)
    if len(key.encode()) > 1024:
        exp = expect(400, codes=["KeyTooLongError"])
    if key.endswith("invalid-utf8"):
        exp = expect(400, codes=["InvalidURI", "InvalidArgument", "InvalidRequest"])  # S3: InvalidURI
    ans = await c.x("odd key PUT", req, exp)
    stored = c.after_write(key, body, ans)
    if stored:
        c.run.ledger.odd_by_md5[md5_hex(body)] = key
    get = c.signed("GET", key, raw_path=raw_path)
    gans = await c.x("odd key GET", get, OK if stored else expect(400, 404))
    if stored and gans.status == 200 and gans.body != body:
        if key.endswith("/") and answer_source(gans) == "backend":
            c.run.figures.backend_mangled_keys += 1  # the store's own doing (see Ledger.trailing_slash)
            c.run.ledger.maybe(key, None)
        else:
            c.run.problem("read_back_mismatch", c, "odd key GET", get.wire(), gans, "read back differs")
    if c.rng.random() < 0.3:
        await c.x(
            "odd key HEAD", c.signed("HEAD", key, raw_path=raw_path), OK if stored else expect(400, 404)
        )
    if c.rng.random() < 0.4:
        enc = c.choice(["&encoding-type=url", ""])
        query = f"list-type=2&prefix={quote(c.prefix, safe='~')}{enc}"
        lans = await c.x("list the case prefix", c.signed("GET", None, query=query), expect(200, 400))
        if lans.status == 200:
            _require_xml(c, "list the case prefix", lans)
    if stored and c.rng.random() < 0.5:
        dans = await c.x("odd key DELETE", c.signed("DELETE", key, raw_path=raw_path), expect(204))
        if dans.status == 204:
            c.run.ledger.delete(key)
            c.run.ledger.odd_by_md5.pop(md5_hex(body), None)


async def case_raw_path(c: Case) -> None:
    """Keys sent as raw bytes in the request line (unencoded UTF-8, invalid UTF-8), validly signed."""
    raw = c.choice(
        [
            "raw-ü€\U0001f600",
            "raw-\udcff\udcfe",  # bytes FF FE
            "raw-\udcc3(",  # C3 28: invalid UTF-8
            "raw-\udced\udca0\udc80",  # an encoded surrogate
            "raw-\udcc0\udcaf",  # an overlong "/"
            "raw-\t-tab",
            "raw-sp ace",
        ]
    )
    key = c.prefix + raw
    raw_path = "/" + c.run.bucket + "/" + c.prefix + raw
    body = c.body(c.rng.randint(0, 2000))
    wt = c.rng.random() < 0.3
    req = c.signed("PUT", key, headers=[WRITE_THROUGH] if wt else [], body=body, raw_path=raw_path)
    ans = await c.x("raw-byte key PUT", req, Expect(frozenset({200, 400}), None))
    if ans.status == 200:
        # The key the store keeps for raw bytes is its business: match it by content at the end.
        c.run.ledger.put(key, md5_hex(body), md5_hex(body), len(body), c.index)
        c.run.ledger.odd_by_md5[md5_hex(body)] = key
        gans = await c.x("raw-byte key GET", c.signed("GET", key, raw_path=raw_path), OK)
        if gans.status == 200 and gans.body != body:
            c.run.problem("read_back_mismatch", c, "raw-byte key GET", b"", gans, "read back differs")
    elif ans.status is None:
        c.run.ledger.maybe(key, md5_hex(body))


_SUBRESOURCES = frozenset(
    {
        "acl",
        "tagging",
        "uploads",
        "uploadId",
        "partNumber",
        "versionId",
        "torrent",
        "restore",
        "select",
        "delete",
        "cors",
        "policy",
        "website",
        "attributes",
        "list-type",
    }
)


# The query strings of case_query: unknown, repeated, empty and odd parameters, S3 subresources.
_ODD_QUERIES = (
    "foo=bar",
    "x-id=GetObject",
    "%00=%00",
    "=",
    "&&&",
    "a=1&a=2",
    "versionId=garbage",
    "versionId=",
    "list-type=3",
    "uploads",
    "acl&tagging",
    "tagging=%FF",
    "%FF%FE=1",
    "a+b=c+d",
    "a%2Bb=%2B",
    "ü=€",
    "x=" + "v" * 6000,
    "response-content-type=text%2Fplain",
    "attributes",
    "torrent",
    "restore",
    "select&select-type=2",
    "uploadId",
    "partNumber=1",
    "delete",
    "cors",
    "policy",
    "website",
    "encoding-type=%00",
    "max-keys=" + "9" * 100,
    "continuation-token=%FF",
    "prefix=%C0%AF",
    "x-amz-date=20240101T000000Z",
    "X-Amz-Signature=" + "0" * 64,
    "AWSAccessKeyId=x",
)


async def case_query(c: Case) -> None:
    """Unknown, repeated, empty and odd query parameters on valid requests."""
    key, _ = await seed_object(c)
    params = c.choice(_ODD_QUERIES)
    method = c.choice(["GET", "GET", "HEAD", "PUT", "DELETE"])
    target_key: str | None = key if c.rng.random() < 0.7 else None
    body = c.body(c.rng.randint(0, 500)) if method == "PUT" and target_key else b""
    if method == "DELETE" and target_key is None:
        method = "GET"
    if method in ("PUT", "DELETE") and params in (
        "acl&tagging",
        "tagging=%FF",
        "uploads",
        "delete",
        "restore",
    ):
        method = "GET"
    req = c.signed(method, target_key, query=params, body=body)
    ans = await c.x(f"{method} ?{params[:40]}", req, ANY)
    names = {part.partition("=")[0] for part in params.split("&")}
    # What a 2xx means for the object: written (no sub-resource, or a version id, which names no other
    # object here), untouched (acl, tagging, a part of an upload), or either (the rest).
    writes = not names & _SUBRESOURCES or names & _SUBRESOURCES == {"versionId"}
    keeps = bool(names & {"acl", "tagging"})
    if target_key is not None and ans.status is not None and 200 <= ans.status < 300:
        if method == "PUT" and writes:
            c.after_write(target_key, body, ans)
        elif method == "DELETE" and writes and "versionId" not in names:
            c.run.ledger.delete(target_key)
        elif not keeps:
            c.run.ledger.maybe(target_key, md5_hex(body) if method == "PUT" else None)
    elif ans.status is None and method in ("PUT", "DELETE") and target_key is not None:
        c.run.ledger.maybe(target_key, md5_hex(body) if method == "PUT" else None)
    await c.check(key)
