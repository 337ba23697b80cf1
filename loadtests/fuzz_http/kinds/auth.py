"""Case kinds: valid controls, broken and presigned authorization, dates."""

from __future__ import annotations

import re
import time

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.findings import AUTH_ERRORS, AUTH_FAIL, OK, Expect, expect
from loadtests.fuzz_http.kinds.base import seed_object
from loadtests.fuzz_http.options import ACCESS_KEY, REGION, UNKNOWN_ACCESS_KEY
from s3lanes.core.sigv4 import QUERY_AUTH_PARAMS


async def case_valid(c: Case) -> None:
    """Controls: valid PUT, GET, HEAD, overwrite and DELETE, spooled and written through."""
    key = c.key("v")
    body = c.body()
    await c.put(key, body, write_through=c.rng.random() < 0.3)
    await c.check(key)
    r = c.rng.random()
    if r < 0.3:
        ans = await c.x("head", c.signed("HEAD", key), OK)
        if ans.status == 200 and ans.header("content-length") != str(len(body)):
            c.run.problem("wrong_answers", c, "head", b"", ans, f"Content-Length for {len(body)} bytes")
    elif r < 0.55:
        ans = await c.x("delete", c.signed("DELETE", key), expect(204))
        if ans.status == 204:
            c.run.ledger.delete(key)
        await c.check(key, "read-back after delete")
    elif r < 0.75:
        await c.put(key, c.body(), write_through=c.rng.random() < 0.3, step="overwrite")
        await c.check(key, "read-back after overwrite")


def _garbage_authorization(c: Case, good: str) -> str:
    cred = good.split("Credential=", 1)[1].split(",", 1)[0]
    sig = good.rsplit("Signature=", 1)[1]
    options = [
        "",
        " ",
        "AWS4-HMAC-SHA256",
        "AWS4-HMAC-SHA256 ",
        "Bearer abc",
        "Basic dXNlcjpwYXNz",
        f"AWS {ACCESS_KEY}:c2lnbmF0dXJl",  # SigV2
        f"AWS4-ECDSA-P256-SHA256 Credential={cred}, SignedHeaders=host, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host, Signature={sig}, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host, Signature={sig}, Extra=1",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=HOST;X-Amz-Date, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=x-amz-date, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host;x-amz-date, Signature={sig[:-1]}",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host;x-amz-date, Signature={sig}0",
        f"AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders=host;x-amz-date, Signature={'g' * 64}",
        f"AWS4-HMAC-SHA256 Credential=/{cred}, SignedHeaders=host;x-amz-date, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={cred.replace('aws4_request', 'aws5_request')}, SignedHeaders=host, "
        f"Signature={sig}",
        "AWS4-HMAC-SHA256 Credential="
        + cred.replace("/s3/", "/s3\x00/")
        + f", SignedHeaders=host, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/2024013/{REGION}/s3/aws4_request, SignedHeaders=host, "
        f"Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/20241332/{REGION}/s3/aws4_request, SignedHeaders=host, "
        f"Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}//s3/aws4_request, SignedHeaders=host, Signature={sig}",
        f"AWS4-HMAC-SHA256 Credential=ü/{cred}, SignedHeaders=host, Signature={sig}",
        "AWS4-HMAC-SHA256 Credential=\udcff\udcfe, SignedHeaders=host, Signature=" + sig,
        "AWS4-HMAC-SHA256 " + ",".join(["Credential=x"] * 200),
        "".join(chr(c.rng.randint(0x21, 0x7E)) for _ in range(c.rng.randint(1, 300))),
        "".join(chr(c.rng.randint(0xA0, 0x2FFF)) for _ in range(c.rng.randint(1, 100))),
        "AWS4-HMAC-SHA256 Credential=" + "A" * 7000 + f"/{cred.split('/', 1)[1]}, SignedHeaders=host, "
        f"Signature={sig}",
    ]
    return str(c.choice(options))


def _mutate_alnum(c: Case, text: str, *, start: int = 0) -> str:
    """``text`` with one alphanumeric character (at or after ``start``, outside %XX escapes) replaced by a
    different one that no canonicalisation can map back to it (so the result is never equivalent)."""
    positions = []
    i = start
    while i < len(text):
        if text[i] == "%":
            i += 3
            continue
        if text[i].isascii() and text[i].isalnum():
            positions.append(i)
        i += 1
    if not positions:
        return text + "0"
    pos = c.choice(positions)
    old = text[pos]
    if old.isdigit():
        new = str((int(old) + c.rng.randint(1, 9)) % 10)
    elif old in "abcdef":  # hex digits of a signature: stay lower-case hex, differ in value
        new = c.choice([h for h in "0123456789abcdef" if h != old])
    else:
        new = c.choice([ch for ch in "ghijkmnpqrstuvwxyzGHJKMNPQRSTUVWXYZ" if ch.lower() != old.lower()])
    return text[:pos] + new + text[pos + 1 :]


async def case_auth(c: Case) -> None:
    """Broken, missing, duplicated, mutated and mixed authentication; the object under attack survives."""
    key, _ = await seed_object(c)
    method = c.choice(["GET", "PUT", "HEAD", "DELETE"])
    body = c.body(c.rng.randint(0, 2000)) if method == "PUT" else b""
    req = c.signed(method, key, body=body, headers=[("x-amz-meta-fz", "v1")] if method == "PUT" else [])
    good = req.get("Authorization") or ""
    variant = c.choice(
        [
            "missing",
            "garbage",
            "duplicated",
            "wrong-secret",
            "unknown-key",
            "mutated",
            "mutated",
            "both-mechanisms",
            "presigned",
            "presigned",
            "unsigned-x-amz-header",
        ]
    )
    exp = AUTH_FAIL
    if variant == "missing":
        req.drop("Authorization")
        exp = expect(403, codes=["AccessDenied"])
    elif variant == "garbage":
        req.set("Authorization", _garbage_authorization(c, good))
        exp = Expect(AUTH_FAIL.statuses, AUTH_FAIL.codes, no_answer=False)
    elif variant == "duplicated":
        other = c.choice(
            [good, _garbage_authorization(c, good), c.signed(method, key, body=body).get("Authorization")]
        )
        req.headers.append(("Authorization", str(other)))
    elif variant == "wrong-secret":
        req = c.signed(method, key, body=body, secret=c.run.secret_key + "x")
        exp = expect(403, codes=["SignatureDoesNotMatch"])
    elif variant == "unknown-key":
        req = c.signed(method, key, body=body, access_key=UNKNOWN_ACCESS_KEY)
        exp = expect(403, codes=["InvalidAccessKeyId"])
    elif variant == "mutated":
        where = c.choice(["path", "signature", "meta", "date", "region", "signed-headers"])
        if where == "path":
            head, _, rest = req.target.partition(c.prefix)
            req.target = head + c.prefix + _mutate_alnum(c, rest)
        elif where == "signature":
            req.set(
                "Authorization", good[: good.rindex("=") + 1] + _mutate_alnum(c, good[good.rindex("=") + 1 :])
            )
        elif where == "meta" and method == "PUT":
            req.set("x-amz-meta-fz", "v2")
        elif where == "date":
            req.set("x-amz-date", _mutate_alnum(c, req.get("x-amz-date") or ""))
            exp = expect(400, 403, codes=AUTH_ERRORS)
        elif where == "region":
            req.set("Authorization", good.replace(f"/{REGION}/", "/eu-west-1/"))
        else:
            req.set("Authorization", good.replace("SignedHeaders=", "SignedHeaders=content-length;"))
        exp = expect(400, 403, codes=AUTH_ERRORS)
    elif variant == "both-mechanisms":
        req.target += ("&" if "?" in req.target else "?") + "X-Amz-Algorithm=AWS4-HMAC-SHA256"
        exp = expect(400, 403, codes=["InvalidArgument", "SignatureDoesNotMatch"])
    elif variant == "unsigned-x-amz-header":
        req.headers.append(("x-amz-meta-unsigned", "sneaked"))
        exp = expect(403, codes=["AccessDenied"])
    else:  # presigned
        await case_presigned_variant(c, key)
        await c.check(key)
        return
    ans = await c.x(f"{variant} {method}", req, exp)
    if method == "PUT" and ans.status == 200:
        c.after_write(key, body, ans)
    elif method == "DELETE" and ans.status == 204:
        c.run.ledger.delete(key)
    await c.check(key)


async def case_presigned_variant(c: Case, key: str) -> None:
    variant = c.choice(
        [
            "valid",
            "expired",
            "too-long",
            "bad-expires",
            "missing-param",
            "duplicated-param",
            "bad-signature",
            "bad-algorithm",
            "bad-credential",
            "bad-date",
            "sigv2",
            "future",
            "valid-put",
        ]
    )
    exp = expect(
        400,
        403,
        codes=[
            "AuthorizationQueryParametersError",
            "AccessDenied",
            "InvalidRequest",
            "SignatureDoesNotMatch",
        ],
    )
    if variant == "valid":
        req, exp = c.presigned("GET", key), OK if key in c.run.ledger.objects else expect(404)
    elif variant == "valid-put":
        body = c.body(c.rng.randint(0, 5000))
        req = c.presigned("PUT", key)
        req.headers.append(("Content-Length", str(len(body))))
        req.body = body
        ans = await c.x("presigned valid PUT", req, OK)
        c.after_write(key, body, ans)
        return
    elif variant == "expired":
        req = c.presigned("GET", key, expires_s=c.rng.randint(0, 600), when=time.time() - 3600)
        exp = expect(403, codes=["AccessDenied"])
    elif variant == "future":
        req = c.presigned("GET", key, when=time.time() + c.rng.randint(3600, 10**8))
        exp = expect(403, codes=["AccessDenied"])
    elif variant == "too-long":
        req = c.presigned("GET", key, expires_s=c.choice([604801, 10**9, 2**63]))
        exp = expect(400, codes=["AuthorizationQueryParametersError"])
    else:
        req = c.presigned("GET", key)
        target = req.target
        if variant == "bad-expires":
            value = c.choice(["abc", "-1", "", "1e3", "0x10", "%2B5", "99999999999999999999", "%00"])
            target = re.sub(r"X-Amz-Expires=[^&]*", f"X-Amz-Expires={value}", target)
        elif variant == "missing-param":
            name = c.choice(QUERY_AUTH_PARAMS)
            target = re.sub(rf"[?&]{name}=[^&]*", "", target)
            if "?" not in target and "&" in target:
                target = target.replace("&", "?", 1)
        elif variant == "duplicated-param":
            name = c.choice(["X-Amz-Algorithm", "X-Amz-Date", "X-Amz-Expires", "X-Amz-Signature"])
            found = re.search(rf"{name}=([^&]*)", target)
            target += f"&{name}={found.group(1) if found else ''}"
        elif variant == "bad-signature":
            head, _, sig = target.rpartition("X-Amz-Signature=")
            target = head + "X-Amz-Signature=" + _mutate_alnum(c, sig)
        elif variant == "bad-algorithm":
            target = target.replace("AWS4-HMAC-SHA256", c.choice(["AWS4-HMAC-SHA1", "", "aws4-hmac-sha256"]))
        elif variant == "bad-credential":
            target = re.sub(
                r"X-Amz-Credential=[^&]*",
                "X-Amz-Credential="
                + c.choice(
                    ["", "x", "%2F%2F%2F%2F", ACCESS_KEY + "%2F2024%2Fr%2Fs3%2Faws4_request", "%FF%FE"]
                ),
                target,
            )
        elif variant == "bad-date":
            target = re.sub(
                r"X-Amz-Date=[^&]*",
                "X-Amz-Date=" + c.choice(["", "2024", "20240101T000000", "99999999T999999Z", "%00"]),
                target,
            )
        elif variant == "sigv2":
            target = c.path(key) + f"?AWSAccessKeyId={ACCESS_KEY}&Expires=9999999999&Signature=abc%3D"
        req.target = target
    await c.x(f"presigned {variant}", req, exp)


async def case_date(c: Case) -> None:
    """Bad, missing and skewed request dates; a credential date that disagrees with x-amz-date."""
    key, _ = await seed_object(c)
    method = c.choice(["GET", "PUT", "HEAD"])
    body = c.body(c.rng.randint(0, 2000)) if method == "PUT" else b""
    variant = c.choice(["garbage", "no-date", "date-header", "skewed", "within-skew", "extreme", "scope"])
    exp = expect(400, 403, codes=AUTH_ERRORS)
    if variant == "skewed":
        skew = c.rng.choice([-1, 1]) * c.rng.randint(16 * 60, 10 * 365 * 86400)
        req = c.signed(method, key, body=body, when=time.time() + skew)
        exp = expect(403, codes=["RequestTimeTooSkewed"])
    elif variant == "within-skew":
        req = c.signed(method, key, body=body, when=time.time() + c.rng.randint(-600, 600))
        exp = OK if method != "HEAD" or key in c.run.ledger.objects else expect(200, 404)
        if key not in c.run.ledger.objects and method == "GET":
            exp = expect(404)
    else:
        req = c.signed(method, key, body=body)
        amz = req.get("x-amz-date") or ""
        if variant == "garbage":
            req.set(
                "x-amz-date",
                c.choice(
                    [
                        "",
                        "now",
                        "2024-01-01T00:00:00Z",
                        amz[:-1],
                        amz + "Z",
                        amz.lower(),
                        "\uff12\uff10\uff12\uff14\uff10\uff11\uff10\uff11T000000Z",
                        amz.replace("T", " "),
                        "\udcff" * 16,
                    ]
                ),
            )
        elif variant == "no-date":
            req.drop("x-amz-date")
        elif variant == "date-header":
            req.drop("x-amz-date")
            req.set(
                "Date",
                c.choice(
                    [
                        "Mon, 32 Jan 2024 00:00:00 GMT",
                        "yesterday",
                        "",
                        "Mon, 01 Jan 2024",
                        "Mon, 01 Jan 99999 00:00:00 GMT",
                        "Mon, 01 Jan 2024 25:61:61 GMT",
                        time.strftime("%a, %d %b %Y %H:%M:%S", time.gmtime()),
                    ]
                ),
            )
        elif variant == "extreme":
            date = c.choice(
                [
                    "99991231T235959Z",
                    "00010101T000000Z",
                    "19700101T000000Z",
                    "20240230T000000Z",
                    "20241301T000000Z",
                    "20240101T246060Z",
                    "20161231T235960Z",
                ]
            )
            req.set("x-amz-date", date)
            auth = req.get("Authorization") or ""
            req.set("Authorization", re.sub(r"/\d{8}/", f"/{date[:8]}/", auth, count=1))
        else:  # scope: the credential's date is not the request's
            auth = req.get("Authorization") or ""
            req.set("Authorization", re.sub(r"/\d{8}/", "/20200101/", auth, count=1))
    ans = await c.x(f"{variant} {method}", req, exp)
    if method == "PUT":
        c.after_write(key, body, ans)
    await c.check(key)
