"""Case kinds: part numbers, CompleteMultipartUpload and DeleteObjects XML."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote
from xml.etree import ElementTree

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import OK, Expect, expect
from loadtests.fuzz_http.options import MIN_PART_BYTES, S3_NS, WRITE_THROUGH
from loadtests.fuzz_http.rawhttp import Answer, md5_b64, md5_hex, multipart_etag


def _upload_id(ans: Answer) -> str | None:
    try:
        root = ElementTree.fromstring(ans.body)
    except ElementTree.ParseError:
        return None
    for el in root.iter():
        if el.tag.rpartition("}")[2] == "UploadId" and el.text:
            return el.text
    return None


def _etag_of(ans: Answer) -> str:
    return (ans.header("etag") or "").strip('"')


async def _create_upload(c: Case, key: str, wt: bool) -> str | None:
    req = c.signed("POST", key, query="uploads", headers=[WRITE_THROUGH] if wt else [])
    ans = await c.x("create multipart upload", req, OK)
    upload_id = _upload_id(ans) if ans.status == 200 else None
    if upload_id is not None:
        c.uploads.append((key, upload_id))
    return upload_id


async def _open_upload(c: Case, prefix: str, write_through_share: float) -> tuple[str, bool, str] | None:
    """A new key under ``prefix`` and an upload on it, written through with that probability: (key,
    written through, upload id), or None when the create failed (the case is then over)."""
    key = c.key(prefix)
    wt = c.rng.random() < write_through_share
    upload_id = await _create_upload(c, key, wt)
    return None if upload_id is None else (key, wt, upload_id)


async def _upload_part(c: Case, key: str, upload_id: str, number: str, body: bytes) -> Answer:
    query = f"partNumber={number}&uploadId={quote(upload_id, safe='~')}"
    return await c.x(f"upload part {number}", c.signed("PUT", key, query=query, body=body), OK)


async def _upload_parts(
    c: Case, key: str, upload_id: str, count: int, max_bytes: int
) -> list[tuple[int, str, bytes]]:
    """Parts 1 to ``count`` of random sizes up to ``max_bytes``: (number, ETag, body) of those the gateway
    took."""
    parts: list[tuple[int, str, bytes]] = []
    for n in range(1, count + 1):
        body = c.body(c.rng.randint(1, max_bytes))
        ans = await _upload_part(c, key, upload_id, str(n), body)
        if ans.status == 200:
            parts.append((n, _etag_of(ans), body))
    return parts


def _complete_xml(parts: Sequence[tuple[int | str, str]]) -> bytes:
    inner = "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>&quot;{e}&quot;</ETag></Part>" for n, e in parts
    )
    return f'<CompleteMultipartUpload xmlns="{S3_NS}">{inner}</CompleteMultipartUpload>'.encode()


async def _finish_upload(
    c: Case, key: str, upload_id: str, parts: list[tuple[int, str, bytes]], wt: bool
) -> None:
    """End a case's upload: complete it validly, abort it, or (written through, sometimes) leave it open."""
    r = c.rng.random()
    q = f"uploadId={quote(upload_id, safe='~')}"
    if parts and r < 0.45 and all(len(b) >= MIN_PART_BYTES for _, _, b in parts[:-1]):
        xml = _complete_xml([(n, e) for n, e, _ in parts])
        ans = await c.x("complete (valid)", c.signed("POST", key, query=q, body=xml), OK)
        if ans.status == 200:
            whole = b"".join(b for _, _, b in parts)
            c.after_write(key, whole, ans, etag=multipart_etag([e for _, e, _ in parts]))
        elif ans.status is None:
            c.run.ledger.maybe(key, md5_hex(b"".join(b for _, _, b in parts)))
    elif wt and r > 0.93:
        c.run.ledger.open_uploads.add((key, upload_id))
    else:
        await c.x("abort", c.signed("DELETE", key, query=q), expect(204))
        if c.rng.random() < 0.3:
            await c.x(
                "abort again", c.signed("DELETE", key, query=q), expect(204, 404, codes=["NoSuchUpload"])
            )


async def case_part_numbers(c: Case) -> None:
    """UploadPart, ListParts and uploads with odd part numbers, odd upload ids and odd paging parameters."""
    opened = await _open_upload(c, "mp", 0.4)
    if opened is None:
        return
    key, wt, upload_id = opened
    parts = await _upload_parts(c, key, upload_id, 1, 3000)
    for _ in range(c.rng.randint(1, 3)):
        variant = c.choice(["part number", "part number", "upload id", "list parts"])
        if variant == "part number":
            number = c.choice(
                [
                    "0",
                    "-1",
                    "10001",
                    "2147483648",
                    "18446744073709551617",
                    "abc",
                    "",
                    "1e3",
                    "%C2%B2",
                    "%D9%A3",
                    "%2B1",
                    "%201",
                    "01",
                    "1.5",
                    "%00",
                    "10000",
                ]
            )
            query = f"partNumber={number}&uploadId={quote(upload_id, safe='~')}"
            body = c.body(c.rng.randint(0, 500))
            ok = number in ("10000", "01")
            exp = (
                expect(200, 400, codes=["InvalidArgument"]) if ok else expect(400, codes=["InvalidArgument"])
            )
            ans = await c.x(f"upload part {number!r}", c.signed("PUT", key, query=query, body=body), exp)
            if ans.status == 200 and number == "01":
                parts = [p for p in parts if p[0] != 1] + [(1, _etag_of(ans), body)]
        elif variant == "upload id":
            bad = c.choice(
                [
                    upload_id + "x",
                    "s3lanes-" + "0" * 32,
                    "s3lanes-",
                    "",
                    "../x",
                    "%00",
                    "s3lanes-%FF",
                    "x" * 2000,
                    upload_id.upper(),
                    "s3lanes-\udcff",
                ]
            )
            op = c.choice(["PUT", "GET", "DELETE", "POST"])
            query = f"uploadId={bad}" + ("&partNumber=1" if op == "PUT" else "")
            body = _complete_xml([(1, parts[0][1])]) if op == "POST" and parts else b""
            exp = Expect(
                frozenset({400, 404}),
                frozenset(["NoSuchUpload", "InvalidArgument", "InvalidRequest"])
                if "\udcff" not in bad
                else None,
            )
            ans = await c.x(
                f"{op} with upload id {bad[:20]!r}", c.signed(op, key, query=query, body=body), exp
            )
            if ans.status == 200 and op == "POST":
                c.run.problem("wrong_answers", c, "complete with a bad upload id", b"", ans)
        else:
            params = c.choice(
                [
                    "max-parts=-1",
                    "max-parts=abc",
                    "max-parts=99999999999999999999",
                    "max-parts=0",
                    "part-number-marker=-5",
                    "part-number-marker=abc",
                    "max-parts=%C2%B2",
                    "part-number-marker=99999999999999999999",
                    "max-parts=1&part-number-marker=1",
                ]
            )
            query = f"uploadId={quote(upload_id, safe='~')}&{params}"
            ans = await c.x(f"list parts {params}", c.signed("GET", key, query=query), expect(200, 400))
            if ans.status == 200:
                _require_xml(c, "list parts", ans)
    await _finish_upload(c, key, upload_id, parts, wt)
    await c.check(key)


def _require_xml(c: Case, step: str, ans: Answer) -> None:
    try:
        ElementTree.fromstring(ans.body)
    except ElementTree.ParseError as exc:
        c.run.problem("wrong_answers", c, step, b"", ans, f"a 200 whose XML does not parse: {exc}")


_BILLION_LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
    + b"".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(8))
    + b"]>"
)
_XXE = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'


def _bad_xml(c: Case, root: str, good: bytes, inner_good: str) -> tuple[str, bytes]:
    options: list[tuple[str, bytes]] = [
        ("empty", b""),
        ("not xml", b"not xml at all"),
        ("truncated", good[: c.rng.randrange(max(len(good), 1))]),
        ("wrong root", good.replace(root.encode(), b"Foo")),
        ("unclosed", f"<{root}>".encode() + inner_good.encode()),
        ("billion laughs", _BILLION_LAUGHS + f"<{root}>&i;</{root}>".encode()),
        ("external entity", _XXE + f"<{root}>&e;</{root}>".encode()),
        ("deep nesting", f"<{root}>".encode() + b"<a>" * 50000 + b"</a>" * 50000 + f"</{root}>".encode()),
        ("not utf-8", good.replace(b"<", b"\xff<", 1)),
        ("utf-16", good.decode().encode("utf-16")),
        ("nul byte", good.replace(b">", b">\x00", 1)),
        ("random bytes", c.rng.randbytes(c.rng.randint(1, 200))),
        (
            "huge",
            f"<{root}>".encode() + b"<!-- " + b"x" * (5 * 1024 * 1024) + b" -->" + f"</{root}>".encode(),
        ),
        ("comment and pi", b"<?pi x?><!-- c -->" + good),
        ("cdata", good.replace(b"<ETag>", b"<ETag><![CDATA[", 1).replace(b"</ETag>", b"]]></ETag>", 1)),
    ]
    name, body = c.choice(options)
    return str(name), bytes(body)


async def case_xml_complete(c: Case) -> None:
    """CompleteMultipartUpload with malformed, hostile and invalid part lists; the upload survives them."""
    opened = await _open_upload(c, "mpx", 0.35)
    if opened is None:
        return
    key, wt, upload_id = opened
    parts = await _upload_parts(c, key, upload_id, c.rng.choice([1, 1, 2, 3]), 2000)
    good = _complete_xml([(n, e) for n, e, _ in parts])
    inner = good.decode().split(">", 1)[1].rsplit("<", 1)[0]
    variant = c.choice(["xml", "xml", "part list"])
    benign = False
    if variant == "xml":
        step, body = _bad_xml(c, "CompleteMultipartUpload", good, inner)
        benign = step in ("comment and pi", "cdata")
    else:
        first = parts[0][1] if parts else "0" * 32
        lists: list[tuple[str, list[tuple[int | str, str]]]] = [
            ("no parts", []),
            ("part number not a number", [("abc", first)]),
            ("part number superscript", [("²", first)]),
            ("part number arabic-indic", [("\u0661", first)]),
            ("part number fullwidth", [("\uff11", first)]),
            ("part number negative", [("-1", first)]),
            ("part number zero", [(0, first)]),
            ("part number huge", [("99999999999999999999999", first)]),
            ("part number 10001", [(10001, first)]),
            ("wrong etag", [(1, "0" * 32)]),
            ("unknown part", [(7, first)]),
            ("descending", [(2, first), (1, first)]),
            ("repeated", [(1, first), (1, first)]),
            ("empty etag", [(1, "")]),
            ("etag unquoted", [(1, first)]),
        ]
        step, plist = c.choice(lists)
        body = _complete_xml(plist)
        if step == "etag unquoted":
            body = body.replace(b"&quot;", b"")
            benign = True
        if step == "part number fullwidth" or step == "part number arabic-indic":
            benign = True  # S3 refuses them; a lenient store reading them as 1 is no loss
    q = f"uploadId={quote(upload_id, safe='~')}"
    codes = [
        "MalformedXML",
        "InvalidPart",
        "InvalidPartOrder",
        "EntityTooSmall",
        "InvalidArgument",
        "InvalidRequest",
    ]
    exp = expect(200, 400, codes=codes) if benign else expect(400, codes=codes)
    ans = await c.x(f"complete: {step}", c.signed("POST", key, query=q, body=body), exp)
    if ans.status == 200:
        # Completed: with parts 1..n as listed, or (lenient parse) with whatever the store took.
        whole = b"".join(b for _, _, b in parts)
        c.run.ledger.maybe(key, md5_hex(whole))
        c.run.ledger.maybe(key, md5_hex(parts[0][2]) if parts else None)
        return
    await _finish_upload(c, key, upload_id, parts, wt)
    await c.check(key)


def _delete_xml(keys: Sequence[str], quiet: bool) -> bytes:
    def esc(k: str) -> str:
        return k.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    inner = "".join(f"<Object><Key>{esc(k)}</Key></Object>" for k in keys)
    q = "<Quiet>true</Quiet>" if quiet else ""
    return f'<Delete xmlns="{S3_NS}">{q}{inner}</Delete>'.encode()


async def case_xml_delete(c: Case) -> None:
    """DeleteObjects with malformed XML, bad digests and odd structure: a refused request deletes nothing."""
    keys = [c.key(f"d{i}") for i in range(c.rng.randint(1, 3))]
    for k in keys:
        await c.put(k, c.body(c.rng.randint(1, 2000)), write_through=c.rng.random() < 0.3, step="seed")
    good = _delete_xml(keys, c.rng.random() < 0.5)
    inner = good.decode().split(">", 1)[1].rsplit("<", 1)[0]
    variant = c.choice(["xml", "xml", "digest", "structure", "valid"])
    headers: list[tuple[str, str]] = []
    deletes_ok = False
    exp: Expect
    if variant == "xml":
        step, body = _bad_xml(c, "Delete", good, inner)
        headers.append(("Content-MD5", md5_b64(body)))
        exp = expect(400, codes=["MalformedXML", "InvalidRequest"])
        deletes_ok = step in ("comment and pi", "cdata")
        if deletes_ok:
            exp = expect(200, 400, codes=["MalformedXML", "InvalidRequest"])
    elif variant == "digest":
        body = good
        step = c.choice(["no Content-MD5", "wrong Content-MD5", "malformed Content-MD5"])
        if step == "wrong Content-MD5":
            headers.append(("Content-MD5", md5_b64(good + b" ")))
            exp = expect(400, codes=["BadDigest"])
        elif step == "malformed Content-MD5":
            headers.append(("Content-MD5", "abc"))
            exp = expect(400, codes=["InvalidDigest"])
        else:
            exp = expect(200, 400, codes=["InvalidRequest", "MissingContentMD5"])
            deletes_ok = True
    elif variant == "structure":
        other = c.key("keep")
        await c.put(other, c.body(c.rng.randint(1, 500)), step="seed")
        step, text = c.choice(
            [
                (
                    "key outside object",
                    f'<Delete xmlns="{S3_NS}"><Object><Key>{keys[0]}</Key></Object>'
                    f"<Key>{other}</Key></Delete>",
                ),
                (
                    "object without key",
                    f'<Delete xmlns="{S3_NS}"><Object><Key>{keys[0]}</Key></Object>'
                    f"<Object><VersionId>x</VersionId></Object><Extra><Key>{other}</Key></Extra>"
                    "</Delete>",
                ),
                (
                    "nested object",
                    f'<Delete xmlns="{S3_NS}"><Object><Key>{keys[0]}</Key><Object><Key>{other}</Key>'
                    "</Object></Object></Delete>",
                ),
                (
                    "too many keys",
                    f'<Delete xmlns="{S3_NS}">' + f"<Object><Key>{other}</Key></Object>" * 1001 + "</Delete>",
                ),
                ("no objects", f'<Delete xmlns="{S3_NS}"></Delete>'),
                (
                    "quiet garbage",
                    f'<Delete xmlns="{S3_NS}"><Quiet>maybe</Quiet><Object><Key>{other}</Key></Object>'
                    "</Delete>",
                ),
            ]
        )
        body = text.encode()
        headers.append(("Content-MD5", md5_b64(body)))
        exp = expect(200, 400, codes=["MalformedXML", "InvalidRequest", "InvalidArgument"])
        keys = [*keys, other]
    else:
        step, body = "valid", good
        headers.append(("Content-MD5", md5_b64(body)))
        exp = OK
        deletes_ok = True
    ans = await c.x(
        f"delete objects: {step}", c.signed("POST", None, query="delete", headers=headers, body=body), exp
    )
    if ans.status == 200:
        deleted = _deleted_keys(ans.body)
        if deleted is None:
            c.run.problem("wrong_answers", c, step, body, ans, "DeleteObjects result does not parse")
            for k in keys:
                c.run.ledger.uncertain[k] = {None, *(s.md5 for s in [c.run.ledger.objects.get(k)] if s)}
        else:
            for k in deleted:
                c.run.ledger.delete(k)
            if "<Quiet>true</Quiet>" in body.decode(errors="replace") and deletes_ok:
                for k in keys:  # quiet mode lists only errors
                    if k.encode() in body:
                        c.run.ledger.delete(k)
    elif ans.status is None:
        for k in keys:
            c.run.ledger.uncertain[k] = {None, *(s.md5 for s in [c.run.ledger.objects.get(k)] if s)}
    for k in keys:
        await c.check(k)


def _deleted_keys(body: bytes) -> set[str] | None:
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    out = set()
    for el in root:
        if el.tag.rpartition("}")[2] == "Deleted":
            for child in el:
                if child.tag.rpartition("}")[2] == "Key":
                    out.add(child.text or "")
    return out
