"""Hostile input against the pure cores: property tests with hypothesis.

What each core must do with any input, whatever it is:

* SigV4 (``s3lanes.core.sigv4``): a request signed by :func:`sign_headers` (random method, path, query and
  header values, odd characters included) verifies, and so does a presigned URL built here independently;
  changing any one character the signature covers makes verification fail; canonical forms are
  deterministic and idempotent; the order and case of header names do not change a signature.
* aws-chunked (``s3lanes.core.chunked``): any payload, cut into any chunks, encoded (signed or not, with or
  without a trailer) and fed in any splits, decodes to exactly that payload and those trailers; any one
  changed byte in a signed body is refused, unless the change means the same thing (a hex digit's case).
* Journal codec (``s3lanes.core.journal``): any record either refuses to encode (TypeError, ValueError,
  OverflowError) or replays to itself; any one changed, inserted or removed byte in a journal replays to a
  prefix of the records or raises JournalCorrupt, never to a different record.
* Range and conditional headers (``s3lanes.core.objectread``): whatever the Range, partNumber and response
  overrides, the plan lies within the object, its headers agree with it, and no header value carries CR,
  LF or NUL; otherwise an S3 error with status 400, 412 or 416.
* XML (``s3lanes.http.s3xml``, ``s3lanes.core.listing``): the documents parse with ElementTree for arbitrary
  unicode (control characters, U+FFFE, lone surrogates from undecodable wire bytes) and give back the text
  that went in (what XML cannot carry replaced by U+FFFD in error documents; listings refuse it unless
  ``encoding-type=url``).
* Targets and digests (``s3lanes.core.s3request``, ``s3lanes.core.checksums``): any path, query and header
  values give a target or an S3 error; any digest headers give a verifier or an S3 error.

Existing tests already cover some of this with narrower inputs (``test_sigv4.py``, ``test_chunked.py``,
``test_journal.py``, ``test_objectread.py``, ``test_listing.py``); these add the inputs an attacker picks.

Example counts follow ``HYPOTHESIS_PROFILE``: ``ci`` (the default: a few hundred examples per test, seconds
in all) or ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz pytest tests/core/test_fuzz_cores.py``: thousands each).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import random
import re
import string
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, unquote_plus

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument

from s3lanes.core.checksums import BodyVerifier
from s3lanes.core.chunked import AwsChunkedDecoder, encode_aws_chunked
from s3lanes.core.journal import JournalCorrupt, encode_batch, encode_record, file_header, replay
from s3lanes.core.listing import ListEntry, ListPage, ListRequest, render_list_xml
from s3lanes.core.objectread import StoredObject, plan_read
from s3lanes.core.s3request import parse_target
from s3lanes.core.sigv4 import (
    PAYLOAD_LITERALS,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    ChunkSignatureChain,
    ChunkSigner,
    RequestView,
    Verified,
    canonical_query,
    canonical_uri,
    parse_auth,
    sign_headers,
    signing_key,
    verify,
)
from s3lanes.errors import AccessDenied, S3Error
from s3lanes.http.s3xml import error_xml
from tests.budget import examples

# --------------------------------------------------------------------------------------------------
# Profiles: "ci" (default) and "fuzz", chosen with HYPOTHESIS_PROFILE. Registered here unless the suite
# registers them itself; only this module's tests read them (no global load_profile).

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ_EXAMPLES = 5000
for _name, _examples in (("ci", 200), ("fuzz", FUZZ_EXAMPLES)):
    try:
        settings.get_profile(_name)
    except HypothesisInvalidArgument:
        settings.register_profile(_name, max_examples=_examples, deadline=None)


def fuzz_settings(ci_examples: int) -> settings:
    """``ci_examples`` under the ci profile; the profile's own count (thousands) under any other."""
    n = examples(ci_examples) if PROFILE == "ci" else settings.get_profile(PROFILE).max_examples
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


# --------------------------------------------------------------------------------------------------
# Strategies

NOW = 1_717_000_000.0  # a fixed wall clock: these tests never read one
SECRET = "fuzz-secret-key/with+odd=chars"
ACCESS = "AKIAFUZZCORES0000001"
REGION = "us-east-1"

#: Everything, including lone surrogates (what undecodable wire bytes become) and XML's non-characters.
any_char = st.characters(codec=None, categories=None)
hostile_text = st.one_of(
    st.text(any_char, max_size=40),
    st.lists(
        st.sampled_from(
            [
                "\x00",
                "\x01",
                "\r",
                "\n",
                "\t",
                "\x7f",
                "\x85",
                "\u2028",
                "\ufffe",
                "\uffff",
                "\udcff",
                "&",
                "<",
                ">",
                '"',
                "'",
                "]]>",
                "%",
                "+",
                " ",
                "é",
                "\U0001f600",
            ]
        ),
        max_size=20,
    ).map("".join),
)
#: Text an XML document of S3 carries: no lone surrogates (the gateway decodes wire text strictly).
wire_text = st.text(st.characters(codec="utf-8"), max_size=40) | st.lists(
    st.sampled_from(["\x00", "\x01", "\r", "\n", "\t", "\x7f", "\ufffe", "\uffff", "&", "<", "]]>", "é"]),
    max_size=20,
).map("".join)
header_value = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")) | st.sampled_from([" ", "\t"]),
    max_size=30,
)
path_segment = st.text(st.characters(codec="utf-8", exclude_characters="/?#"), max_size=12)
query_atom = st.text(
    st.sampled_from(
        [*string.ascii_letters, *string.digits, "-", "_", ".", "~", "+", " ", "é", "/", "%", "*"]
    ),
    max_size=8,
)


def _encode_path(segments: list[str], style: str) -> str:
    if style == "botocore":
        return "/" + "/".join(quote(s, safe="~") for s in segments)
    # A client that leaves sub-delimiters raw (as some do): S3's rules still give one canonical form.
    return "/" + "/".join(quote(s, safe="~!$'()*,;:@") for s in segments)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, str, dict[str, str]]:
    """(method, raw path, raw query, lower-case headers) of a request a client could sign."""
    method = draw(st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD"]))
    path = _encode_path(
        draw(st.lists(path_segment, min_size=1, max_size=4)), draw(st.sampled_from(["botocore", "raw"]))
    )
    pairs = draw(st.lists(st.tuples(query_atom, st.none() | query_atom), max_size=5))
    query = "&".join(quote(k, safe="~") + ("" if v is None else "=" + quote(v, safe="~")) for k, v in pairs)
    assume("X-Amz-Algorithm" not in query)
    headers = {"host": draw(st.sampled_from(["127.0.0.1:9000", "bucket.s3.example:443", "gw"]))}
    for i in range(draw(st.integers(0, 3))):
        headers[f"x-amz-meta-f{i}"] = draw(header_value)
    if draw(st.booleans()):
        headers["content-type"] = draw(header_value)
    return method, path, query, headers


def _signed_view(
    method: str, path: str, query: str, headers: Mapping[str, str], payload_hash: str = UNSIGNED_PAYLOAD
) -> RequestView:
    signed = sign_headers(
        method,
        path,
        query,
        headers,
        access_key=ACCESS,
        secret_key=SECRET,
        region=REGION,
        payload_hash=payload_hash,
        now_wall=NOW,
    )
    return RequestView(method, path, query, {**headers, **signed})


def _verify(view: RequestView, now: float = NOW) -> Verified:
    auth = parse_auth(view)
    assert auth is not None
    return verify(view, auth, SECRET, now)


# --------------------------------------------------------------------------------------------------
# SigV4


@fuzz_settings(300)
@given(requests())
def test_a_request_signed_with_random_parts_verifies(req: tuple[str, str, str, dict[str, str]]) -> None:
    method, path, query, headers = req
    verified = _verify(_signed_view(method, path, query, headers))
    assert verified.auth.access_key == ACCESS


@fuzz_settings(200)
@given(requests(), st.randoms(use_true_random=False))
def test_signatures_do_not_depend_on_header_order_or_name_case(
    req: tuple[str, str, str, dict[str, str]], rnd: random.Random
) -> None:
    method, path, query, headers = req
    items = list(headers.items())
    rnd.shuffle(items)
    shuffled = {(k.upper() if rnd.random() < 0.5 else k): v for k, v in items}
    a = sign_headers(
        method,
        path,
        query,
        headers,
        access_key=ACCESS,
        secret_key=SECRET,
        region=REGION,
        payload_hash=UNSIGNED_PAYLOAD,
        now_wall=NOW,
    )
    b = sign_headers(
        method,
        path,
        query,
        shuffled,
        access_key=ACCESS,
        secret_key=SECRET,
        region=REGION,
        payload_hash=UNSIGNED_PAYLOAD,
        now_wall=NOW,
    )
    assert a == b


@fuzz_settings(300)
@given(st.text(any_char, max_size=60), st.text(any_char, max_size=60))
def test_canonical_forms_are_idempotent(raw_path: str, raw_query: str) -> None:
    uri = canonical_uri("/" + raw_path)
    assert canonical_uri(uri) == uri
    assert uri.isascii()
    query = canonical_query(raw_query)
    assert canonical_query(query) == query
    assert query.isascii()
    pairs = [p.split("=", 1) for p in query.split("&")] if query else []
    assert pairs == sorted(pairs)


def _mutable_positions(text: str, *, skip_escapes: bool) -> list[int]:
    """Alphanumeric positions (outside %XX escapes when asked): changing one there changes the meaning."""
    out = []
    i = 0
    while i < len(text):
        if skip_escapes and text[i] == "%":
            i += 3
            continue
        if text[i].isascii() and text[i].isalnum():
            out.append(i)
        i += 1
    return out


def _replace(text: str, pos: int, rnd: random.Random) -> str:
    old = text[pos]
    if old in string.hexdigits and rnd.random() < 0.7:
        new = rnd.choice([h for h in "0123456789abcdef" if h != old.lower()])
    else:
        new = rnd.choice([ch for ch in "ghjkmnpqrstuvwxyz0123456789" if ch != old.lower()])
    return text[:pos] + new + text[pos + 1 :]


@fuzz_settings(400)
@given(
    requests(),
    st.randoms(use_true_random=False),
    st.sampled_from(
        ["path", "query", "header", "date", "signature", "scope", "signed-headers", "payload-hash", "method"]
    ),
)
def test_changing_any_covered_character_makes_verification_fail(
    req: tuple[str, str, str, dict[str, str]], rnd: random.Random, where: str
) -> None:
    """Each change is a real one (an alphanumeric character for another, never a mere case change of a
    hex digit, never inside a %XX escape), so the signed meaning changes: verification must refuse it.
    The access key is not covered by the HMAC by design (it only selects the secret), so it is not mutated.
    """
    method, path, query, headers = req
    payload = hashlib.sha256(b"body").hexdigest()
    view = _signed_view(method, path, query, headers, payload)
    h = dict(view.headers)
    auth = h["authorization"]
    if where == "path":
        positions = _mutable_positions(path, skip_escapes=True)
        assume(positions)
        path = _replace(path, rnd.choice(positions), rnd)
    elif where == "query":
        positions = _mutable_positions(query, skip_escapes=True)
        assume(positions)
        query = _replace(query, rnd.choice(positions), rnd)
    elif where == "header":
        names = [n for n in h if n.startswith("x-amz-meta-") or n in ("host", "content-type")]
        name = rnd.choice(names)
        positions = _mutable_positions(h[name], skip_escapes=False)
        h[name] = _replace(h[name], rnd.choice(positions), rnd) if positions else h[name] + "x"
    elif where == "date":
        h["x-amz-date"] = _replace(
            h["x-amz-date"], rnd.choice(_mutable_positions(h["x-amz-date"][9:], skip_escapes=False)) + 9, rnd
        )
    elif where == "signature":
        at = auth.rindex("Signature=") + len("Signature=")
        h["authorization"] = _replace(auth, rnd.randrange(at, len(auth)), rnd)
    elif where == "scope":
        at = auth.index("/") + 1  # after the access key: date, region, service, terminator
        end = auth.index(",")
        positions = [i for i in range(at, end) if auth[i].isalnum()]
        h["authorization"] = _replace(auth, rnd.choice(positions), rnd)
    elif where == "signed-headers":
        at = auth.index("SignedHeaders=") + len("SignedHeaders=")
        end = auth.index(",", at)
        positions = [i for i in range(at, end) if auth[i].isalnum()]
        h["authorization"] = _replace(auth, rnd.choice(positions), rnd)
    elif where == "payload-hash":
        h["x-amz-content-sha256"] = _replace(payload, rnd.randrange(64), rnd)
    else:
        method = rnd.choice([m for m in ("GET", "PUT", "POST", "DELETE", "HEAD", "PATCH") if m != method])
    with pytest.raises(S3Error):
        _verify(RequestView(method, path, query, h))


def presign(method: str, path: str, query: str, host: str, amz_date: str, expires_s: int) -> str:
    """A presigned query string, computed here from the published algorithm (not with the module's own
    signing code): an independent check of :func:`verify`'s query-auth path."""
    scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
    params = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", f"{ACCESS}/{scope}"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires_s)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    full = "&".join(filter(None, [query, *(f"{quote(k, safe='~')}={quote(v, safe='~')}" for k, v in params)]))
    pairs = sorted(
        (quote(unquote(k), safe="~"), quote(unquote(v), safe="~"))
        for k, _, v in (p.partition("=") for p in full.split("&") if p)
    )
    creq = "\n".join(
        [
            method,
            canonical_uri(path),
            "&".join(f"{k}={v}" for k, v in pairs),
            f"host:{host}\n",
            "host",
            UNSIGNED_PAYLOAD,
        ]
    )
    sts = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(creq.encode()).hexdigest()}"
    key = signing_key(SECRET, amz_date[:8], REGION, "s3")
    return full + "&X-Amz-Signature=" + hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()


@fuzz_settings(300)
@given(requests(), st.integers(1, 7 * 24 * 3600), st.floats(0, 1), st.randoms(use_true_random=False))
def test_presigned_urls_verify_until_they_expire_and_not_when_changed(
    req: tuple[str, str, str, dict[str, str]], expires_s: int, when: float, rnd: random.Random
) -> None:
    method, path, query, headers = req
    host = headers["host"]
    amz_date = "20240529T163000Z"
    signed_at = 1_717_000_200.0
    full = presign(method, path, query, host, amz_date, expires_s)
    view = RequestView(method, path, full, {"host": host})
    _verify(view, signed_at + when * expires_s)  # any time within the validity window
    with pytest.raises(AccessDenied):
        _verify(view, signed_at + expires_s + 1)
    at = full.rindex("=") + 1
    tampered = RequestView(method, path, _replace(full, rnd.randrange(at, len(full)), rnd), {"host": host})
    with pytest.raises(S3Error):
        _verify(tampered, signed_at)


@fuzz_settings(300)
@given(
    method=st.sampled_from(["GET", "PUT", "\udcff", ""]),
    path=hostile_text,
    query=hostile_text,
    authorization=st.none() | hostile_text | st.builds(lambda t: "AWS4-HMAC-SHA256 " + t, hostile_text),
    extra=st.dictionaries(
        st.sampled_from(["x-amz-date", "date", "x-amz-content-sha256", "x-amz-meta-a"]),
        hostile_text,
        max_size=4,
    ),
)
def test_parse_auth_and_verify_raise_only_s3_errors_for_hostile_text(
    method: str, path: str, query: str, authorization: str | None, extra: dict[str, str]
) -> None:
    headers = {"host": "h", **extra}
    if authorization is not None:
        headers["authorization"] = authorization
    view = RequestView(method, "/" + path, query, headers)
    try:
        auth = parse_auth(view)
        if auth is not None:
            verify(view, auth, SECRET, NOW)
    except S3Error:
        pass


# --------------------------------------------------------------------------------------------------
# aws-chunked


def _verified_streaming(payload_hash: str) -> tuple[Verified, str]:
    headers = {"host": "h", "x-amz-decoded-content-length": "0"}
    view = _signed_view("PUT", "/b/k", "", headers, payload_hash)
    return _verify(view), view.headers["x-amz-date"]


def _decode(
    body: bytes,
    cuts: list[int],
    *,
    chain: ChunkSignatureChain | None,
    names: tuple[str, ...],
    decoded_length: int | None,
) -> tuple[bytes, dict[str, str]]:
    decoder = AwsChunkedDecoder(chain=chain, trailer_names=names, decoded_length=decoded_length)
    out: list[bytes] = []
    start = 0
    for cut in [*sorted({c % (len(body) + 1) for c in cuts}), len(body)]:
        out += decoder.feed(body[start:cut])
        start = cut
    trailers = decoder.finish()
    assert decoder.complete
    assert decoder.decoded_bytes == len(b"".join(out))
    return b"".join(out), trailers


chunked_modes = st.sampled_from(["unsigned", "unsigned-trailer", "signed", "signed-trailer"])


@st.composite
def chunked_bodies(draw: st.DrawFn) -> dict[str, Any]:
    payload = draw(st.binary(max_size=3000))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(payload) - 1, 1)), max_size=6))))
    chunks = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
    mode = draw(chunked_modes)
    trailers = (
        {
            "x-amz-checksum-crc32": draw(
                st.text(string.ascii_letters + string.digits + "+/=", min_size=1, max_size=12)
            )
        }
        if "trailer" in mode
        else None
    )
    return {"payload": payload, "chunks": chunks, "mode": mode, "trailers": trailers}


def _encode(spec: dict[str, Any]) -> tuple[bytes, Verified | None]:
    if not spec["mode"].startswith("signed"):
        return encode_aws_chunked(spec["chunks"], trailers=spec["trailers"]), None
    mode = STREAMING_SIGNED_TRAILER if spec["trailers"] else STREAMING_SIGNED
    verified, amz_date = _verified_streaming(mode)
    signer = ChunkSigner.for_request(
        secret_key=SECRET, amz_date=amz_date, region=REGION, seed_signature=verified.seed_signature
    )
    return encode_aws_chunked(spec["chunks"], signer=signer, trailers=spec["trailers"]), verified


@fuzz_settings(300)
@given(chunked_bodies(), st.lists(st.integers(0, 10_000), max_size=12), st.booleans())
def test_any_payload_round_trips_through_aws_chunked_in_any_feeds(
    spec: dict[str, Any], feeds: list[int], announce_length: bool
) -> None:
    body, verified = _encode(spec)
    names = tuple(spec["trailers"] or ())
    out, trailers = _decode(
        body,
        feeds,
        chain=ChunkSignatureChain(verified) if verified else None,
        names=names,
        decoded_length=len(spec["payload"]) if announce_length else None,
    )
    assert out == spec["payload"]
    assert trailers == (spec["trailers"] or {})


@fuzz_settings(300)
@given(chunked_bodies().filter(lambda s: s["mode"].startswith("signed")), st.data())
def test_a_changed_byte_in_a_signed_aws_chunked_body_is_refused_or_means_the_same(
    spec: dict[str, Any], data: st.DataObject
) -> None:
    body, verified = _encode(spec)
    assert verified is not None
    pos = data.draw(st.integers(0, len(body) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != body[pos]))
    mutated = body[:pos] + bytes([new]) + body[pos + 1 :]
    names = tuple(spec["trailers"] or ())
    try:
        out, trailers = _decode(
            mutated, [], chain=ChunkSignatureChain(verified), names=names, decoded_length=len(spec["payload"])
        )
    except S3Error:
        return
    # Accepted: only a change that means the same (the case of a hex digit in a size or signature).
    assert out == spec["payload"]
    assert trailers == (spec["trailers"] or {})
    assert chr(body[pos]).lower() == chr(new).lower()


# --------------------------------------------------------------------------------------------------
# Journal codec

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(any_char, max_size=12)
    | st.binary(max_size=20)
)
values = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.tuples(kids, kids)
        | st.dictionaries(st.text(max_size=5) | st.integers() | st.none(), kids, max_size=4)
    ),
    max_leaves=12,
)
records = st.dictionaries(st.text(any_char, max_size=8) | st.integers(), values, max_size=5)


def _normal(value: Any) -> Any:
    """What msgpack gives back: tuples become lists; NaN is compared by what it is."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


@fuzz_settings(400)
@given(records)
def test_any_record_encodes_to_a_frame_that_replays_to_it_or_is_refused(record: dict[Any, Any]) -> None:
    try:
        frame = encode_record(record)
    except (TypeError, ValueError, OverflowError):
        return
    result = replay(file_header() + frame)
    assert [_normal(r) for r in result.records] == [_normal(record)]
    assert not result.torn


good_records = st.lists(
    st.dictionaries(
        st.text(max_size=6),
        st.integers(-(2**40), 2**40) | st.text(max_size=12) | st.binary(max_size=12),
        max_size=4,
    ),
    min_size=1,
    max_size=8,
)


@fuzz_settings(400)
@given(good_records, st.data())
def test_a_damaged_journal_replays_to_a_prefix_or_is_refused(
    recs: list[dict[str, Any]], data: st.DataObject
) -> None:
    journal = file_header() + encode_batch(recs)
    pos = data.draw(st.integers(0, len(journal) - 1))
    how = data.draw(st.sampled_from(["flip", "insert", "delete"]))
    if how == "flip":
        damaged = journal[:pos] + bytes([journal[pos] ^ data.draw(st.integers(1, 255))]) + journal[pos + 1 :]
    elif how == "insert":
        damaged = journal[:pos] + data.draw(st.binary(min_size=1, max_size=8)) + journal[pos:]
    else:
        damaged = journal[:pos] + journal[pos + data.draw(st.integers(1, 8)) :]
    try:
        result = replay(damaged)
    except JournalCorrupt:
        return
    assert result.records == recs[: len(result.records)]
    assert result.valid_bytes + result.torn_bytes == len(damaged)


# --------------------------------------------------------------------------------------------------
# Range, partNumber, conditional headers and response overrides

big = st.integers(0, 10**40)
range_headers = st.one_of(
    st.builds(lambda a, b: f"bytes={a}-{b}", big, big),
    st.builds(lambda a: f"bytes={a}-", big),
    st.builds(lambda a: f"bytes=-{a}", big),
    st.builds(
        lambda u, a, b, sp: f"{u}{sp}={sp}{a}-{b}",
        st.sampled_from(["bytes", "BYTES", "Bytes", "items", ""]),
        st.sampled_from(["0", "1", "\u0661", "\uff11", "+1", "0x1", "1_0", " 1", "99999999999999999999"]),
        st.sampled_from(["", "0", "2", "\u0662", "-1", "1e3"]),
        st.sampled_from(["", " ", "\t"]),
    ),
    st.lists(
        st.builds(lambda a, b: f"{a}-{b}", st.integers(0, 50), st.integers(0, 50)), min_size=2, max_size=4
    ).map(lambda rs: "bytes=" + ",".join(rs)),
    hostile_text,
)
sizes = st.integers(0, 100) | st.integers(0, 2**63 - 1)


@fuzz_settings(500)
@given(
    size=sizes,
    range_header=st.none() | range_headers,
    part_number=st.none()
    | hostile_text
    | st.sampled_from(["1", "2", "10000", "10001", "0", "\u00b2", "\u0661"]),
    overrides=st.dictionaries(
        st.sampled_from(
            [
                "response-content-type",
                "response-content-disposition",
                "response-cache-control",
                "response-expires",
                "response-content-language",
                "response-content-encoding",
            ]
        ),
        hostile_text,
        max_size=3,
    ),
    conditional=st.dictionaries(
        st.sampled_from(["if-match", "if-none-match", "if-modified-since", "if-unmodified-since"]),
        hostile_text,
        max_size=2,
    ),
    method=st.sampled_from(["GET", "HEAD"]),
)
def test_read_plans_stay_within_the_object_and_carry_no_control_characters(
    size: int,
    range_header: str | None,
    part_number: str | None,
    overrides: dict[str, str],
    conditional: dict[str, str],
    method: str,
) -> None:
    obj = StoredObject(
        size=size,
        etag='"0123456789abcdef0123456789abcdef"',
        last_modified=NOW,
        content_type="binary/octet-stream",
        headers=(("x-amz-meta-a", "b"),),
    )
    headers = dict(conditional)
    if range_header is not None:
        headers["range"] = range_header
    query = dict(overrides)
    if part_number is not None:
        query["partNumber"] = part_number
    try:
        plan = plan_read(obj, method, headers, query, NOW)
    except S3Error as error:
        assert error.status in (400, 412, 416)
        return
    assert plan.status in (200, 206, 304)
    assert plan.start >= 0 and plan.length >= 0 and plan.start + plan.length <= size
    out = dict(plan.headers)
    for name, value in plan.headers:
        assert re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name)
        assert not set(value) & {"\r", "\n", "\x00"}, (name, value)
    if plan.status == 304:
        return
    assert out["Content-Length"] == str(plan.length)
    if plan.status == 206:
        first, last, total = map(int, re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", out["Content-Range"]).groups())  # type: ignore[union-attr]
        assert (first, last - first + 1, total) == (plan.start, plan.length, size)
    else:
        assert "Content-Range" not in out
        if part_number is None:
            assert (plan.start, plan.length) == (0, size)


# --------------------------------------------------------------------------------------------------
# XML: error documents and listings

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ELEMENT_NAME = st.from_regex(r"\A[A-Z][A-Za-z0-9-]{0,15}\Z")


def _as_xml_text(value: str) -> str:
    """What an error document may show for ``value``: characters XML cannot carry as U+FFFD, and line ends
    as an XML parser reports them (CR LF and CR become LF)."""
    return _NOT_XML.sub("\ufffd", value).replace("\r\n", "\n").replace("\r", "\n")


class _Error(S3Error):
    code = "FuzzError"
    status = 400


@fuzz_settings(500)
@given(
    message=hostile_text,
    extra=st.dictionaries(_ELEMENT_NAME, hostile_text, max_size=4),
    resource=hostile_text,
    request_id=hostile_text,
)
def test_error_xml_is_well_formed_and_keeps_the_text_for_any_unicode(
    message: str, extra: dict[str, str], resource: str, request_id: str
) -> None:
    extra = {k: v for k, v in extra.items() if k not in ("Code", "Message", "Resource", "RequestId")}
    document = error_xml(_Error(message or None, **extra), resource=resource, request_id=request_id)
    root = ET.fromstring(document)
    fields = {child.tag: child.text or "" for child in root}
    assert root.tag == "Error"
    assert fields["Code"] == "FuzzError"
    assert fields["Message"] == _as_xml_text(message or _Error.default_message)
    assert fields["Resource"] == _as_xml_text(resource)
    assert fields["RequestId"] == _as_xml_text(request_id)
    for name, value in extra.items():
        assert fields[name] == _as_xml_text(value)


entries = st.builds(
    ListEntry,
    key=wire_text,
    size=st.integers(0, 2**63),
    etag=st.sampled_from(['"0123456789abcdef0123456789abcdef"', '"abc-3"']),
    last_modified=st.floats(0, 4e9),
    # Owners come from the store's listing and are never url-encoded (nor are they by S3): printable only.
    owner_id=st.none() | st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=10),
    owner_name=st.none()
    | st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=10),
)


@fuzz_settings(300)
@given(
    version=st.sampled_from([1, 2]),
    url=st.booleans(),
    prefix=wire_text,
    delimiter=wire_text,
    start=wire_text,
    page_entries=st.lists(entries, max_size=5),
    prefixes=st.lists(wire_text, max_size=3),
    truncated=st.booleans(),
)
def test_listing_xml_parses_and_shows_every_key_as_it_is(
    version: int,
    url: bool,
    prefix: str,
    delimiter: str,
    start: str,
    page_entries: list[ListEntry],
    prefixes: list[str],
    truncated: bool,
) -> None:
    req = ListRequest(
        version=version,
        prefix=prefix,
        delimiter=delimiter,
        max_keys=1000,
        start=start,
        encoding_type="url" if url else "",
        fetch_owner=True,
        marker=start if version == 1 else "",
        start_after=start if version == 2 else "",
        continuation_token="",
    )
    items = [e.key for e in page_entries] + prefixes
    page = ListPage(
        entries=page_entries,
        common_prefixes=prefixes,
        is_truncated=truncated and bool(items),
        next_item=items[-1] if truncated and items else None,
        key_count=len(items),
    )
    try:
        document = render_list_xml(req, "bucket", page)
    except S3Error as error:
        # Only a value XML cannot carry, without encoding-type=url, may be refused.
        assert not url and error.code == "InvalidArgument"
        assert any(_NOT_XML.search(v) for v in [prefix, delimiter, start, *items])
        return
    root = ET.fromstring(document)
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    keys = [el.text or "" for el in root.iter(ns + "Key")]
    shown_prefixes = [el.text or "" for cp in root.iter(ns + "CommonPrefixes") for el in cp]
    # Under encoding-type=url keys come as the store writes them (space as "+" in the last segment),
    # prefixes percent-encoded; the echoed Prefix as sent, unless XML cannot carry it.
    assert [unquote_plus(k) if url else k for k in keys] == [e.key for e in page_entries]
    assert [unquote(p) if url else p for p in shown_prefixes] == prefixes
    echoed = root.findtext(ns + "Prefix") or ""
    assert (unquote(echoed) if url and _NOT_XML.search(prefix) else echoed) == prefix


# --------------------------------------------------------------------------------------------------
# Request targets and digest headers


@fuzz_settings(500)
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS", "get", "\udcff"]),
    path=st.text(any_char, max_size=40)
    | st.lists(
        st.sampled_from(["%FF", "%C3%28", "%ED%A0%80", "%2F", "%00", "..", ".", "", "a", "%", "%Z"]),
        max_size=6,
    ).map("/".join),
    query=hostile_text,
    host=hostile_text,
)
def test_any_target_gives_an_s3_target_or_an_s3_error(method: str, path: str, query: str, host: str) -> None:
    try:
        target = parse_target(method, "/" + path, query, {"host": host}, ("localhost", "s3.example"))
    except S3Error:
        return
    assert target.key is None or isinstance(target.key, str)


@fuzz_settings(500)
@given(
    headers=st.dictionaries(
        st.sampled_from(
            [
                "content-md5",
                "x-amz-checksum-crc32",
                "x-amz-checksum-crc32c",
                "x-amz-checksum-sha1",
                "x-amz-checksum-sha256",
                "x-amz-checksum-crc64nvme",
                "x-amz-checksum-foo",
                "x-amz-sdk-checksum-algorithm",
                "x-amz-trailer",
                "x-amz-checksum-algorithm",
            ]
        ),
        hostile_text | st.sampled_from(["AAAAAA==", "1B2M2Y8AsgTpgAmY7PhCfg==", "CRC32", "SHA256", ""]),
        max_size=4,
    ),
    payload_hash=st.sampled_from([*sorted(PAYLOAD_LITERALS), hashlib.sha256(b"").hexdigest()]) | hostile_text,
    body=st.binary(max_size=64),
    trailers=st.dictionaries(
        st.sampled_from(["x-amz-checksum-crc32", "x-amz-checksum-sha256"]), hostile_text, max_size=2
    ),
)
def test_any_digest_headers_give_a_verifier_or_an_s3_error(
    headers: dict[str, str], payload_hash: str, body: bytes, trailers: dict[str, str]
) -> None:
    try:
        verifier = BodyVerifier.from_headers(headers, payload_hash)
        verifier.update(body)
        verifier.finish(trailers)
    except S3Error:
        pass
