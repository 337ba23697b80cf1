"""ListObjects (V1 and V2) and ListObjectVersions over the backend's listing merged with the write spool.
Pure; no I/O. (The version listing's merge is described in its own section below.)

Theory of operation: the spool holds objects acknowledged to clients but not yet in the backend, and
tombstones for keys deleted in the spool that the backend still has. A listing through the gateway must
show the former and hide the latter. SeaweedFS does not return keys in S3 order and its StartAfter is
unreliable, so the shell does not page the backend along with the client. For every client page it reads
the backend's *whole* listing of the prefix (ListObjectsV2 with the client's delimiter and
``encoding-type=url``, paging with the backend's own continuation tokens, each body parsed by
:func:`parse_backend_listing`) and :func:`merge_page` cuts the client's page out of backend + spool.
Pagination uses the gateway's own continuation tokens (:func:`encode_token`): they carry where the next
page starts (the last item returned, or see below), so the next page is "everything after that", which is
stable under concurrent writes.

Items are keys and common prefixes, ordered and continued as the store (SeaweedFS) lists them, so that
a listing does not change when a spooled key reaches the store. SeaweedFS keeps keys in a directory tree
(``/`` separates directories) and lists it depth first, each directory's entries by name: the order is
that of the keys' ``/``-separated segments (:func:`store_order`; ``a/b`` before ``a-c``, which S3's byte
order puts the other way round). A listing continued after a start ``M`` (V1 marker, V2 start-after)
shows the items after ``M`` in that order, except the ones inside the "directory" ``M/`` when ``M`` does
not end in ``/`` (the store skips that directory with the entry it continues after): start-after ``a/b``
does not show ``a/b/c`` (:func:`listed_after`). A common prefix that contains ``M`` sorts before it, so a
prefix is never listed twice. Where a page ends on a key ``K`` that has keys under ``K/``, the store
continues from ``K/`` (V1's NextMarker, and what our V2 token carries), so paging loses nothing; a page
that ends on ``K`` also holds the common prefix (or key) ``K/`` if that comes next, one item over
max-keys: they are one directory entry of the store. Segments compare as ``str``, which is code-point
order, the same as the order of their UTF-8 bytes.

One thing the merge cannot see by itself: the backend rolls its keys up into common prefixes, so a
prefix whose every backend key is hidden by a tombstone still comes back from the backend.
:func:`prefixes_to_expand` names the backend prefixes that contain tombstoned keys; the shell lists each
of them without a delimiter and passes those keys as backend entries instead of the prefix, and
:func:`merge_page` rolls up what survives.

This module is *not* a proxy for every ListObjects: a continuation token that is not ours (e.g. the
backend's own, from a listing the shell passed through) raises :class:`NotOurToken`, and the shell passes
that request to the backend unchanged.
"""

from __future__ import annotations

import base64
import binascii
import html
import math
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import quote_plus, unquote_plus
from xml.sax.saxutils import escape

from s3lanes.core.uri import s3_quote
from s3lanes.errors import InvalidArgument

S3_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_KEYS_LIMIT = 1000  # S3 never returns more than 1000 items per page, whatever max-keys asks for
_INT32_MAX = 2**31 - 1  # S3 rejects a max-keys that does not fit an int32 ("not ... within integer range")
_TOKEN_MAGIC = b"s3lanes1:"
_DIGITS = re.compile(r"[0-9]+")
# Characters XML 1.0 cannot carry at all, not even as character references.
_XML_ILLEGAL = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# '"' as S3 writes it (&quot;), and CR as a reference: a literal CR would reach the client as LF, since
# XML parsers normalise line ends in text.
_XML_ENTITIES = {'"': "&quot;", "\r": "&#13;"}


class NotOurToken(Exception):
    """A continuation token the gateway did not issue. Not an S3 error: the shell proxies the request."""


@dataclass(frozen=True, slots=True)
class ListEntry:
    """One object as a listing shows it."""

    key: str
    size: int
    etag: str  # quoted, as S3 shows it: '"abc..."' or '"abc...-3"'
    last_modified: float  # epoch seconds
    storage_class: str = "STANDARD"
    owner_id: str | None = None
    owner_name: str | None = None


@dataclass(frozen=True, slots=True)
class ListRequest:
    """A client's ListObjects (V1) or ListObjectsV2 request, validated."""

    version: int  # 1 (GET ?) or 2 (GET ?list-type=2)
    prefix: str
    delimiter: str  # "" for none
    max_keys: int  # 0..1000 (capped); 0 gives an empty, untruncated page
    # Effective exclusive start: the V1 marker; for V2 the later (in store order) of start-after and the item
    # decoded from our continuation token (the token was issued after start-after, so S3's "the token wins").
    start: str
    encoding_type: str  # "" or "url"
    fetch_owner: bool  # V2 only; V1 always shows Owner when known
    marker: str  # raw V1 marker, echoed
    start_after: str  # raw V2 start-after, echoed
    continuation_token: str  # raw V2 token, echoed ("" if none)
    token_given: bool = False  # V2: a continuation-token parameter was sent (an empty one is echoed too)


@dataclass(frozen=True, slots=True)
class BackendListing:
    """One backend ListObjectsV2 page, keys already url-decoded."""

    entries: list[ListEntry]
    common_prefixes: list[str]
    is_truncated: bool
    next_continuation_token: str | None  # the backend's own V2 token; the shell pages the backend with it


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page for the client: its keys and common prefixes, each in S3 order."""

    entries: list[ListEntry]
    common_prefixes: list[str]
    is_truncated: bool
    # Where the next page starts on a truncated page, else None: its last item (key or prefix), or K/
    # after a key K with keys under K/ (see the module doc). V1's NextMarker and what our V2
    # NextContinuationToken carries.
    next_item: str | None
    key_count: int  # keys + common prefixes on this page

    def __post_init__(self) -> None:
        if self.is_truncated and self.next_item is None:
            raise ValueError("a truncated page must name its last item")
        if self.key_count != len(self.entries) + len(self.common_prefixes):
            raise ValueError("key_count must count the page's keys and common prefixes")


# -- request --------------------------------------------------------------------------------------------


def parse_list_request(query: Mapping[str, str]) -> ListRequest:
    """Validate a ListObjects/ListObjectsV2 request from its decoded query parameters.

    V2 is ``list-type=2``; anything else is V1, as :mod:`s3lanes.core.s3request` names the operation.
    V1 ignores V2's parameters and vice versa, as S3 does. Raises :class:`InvalidArgument` for a max-keys
    that is not a non-negative int32 and an encoding-type other than ``url``; raises :class:`NotOurToken`
    for a continuation-token the gateway did not issue. An empty continuation-token starts at the beginning
    and is echoed, as the store (SeaweedFS) answers it.
    """
    version = 2 if query.get("list-type") == "2" else 1
    encoding_type = _parse_encoding_type(query)
    max_keys = _parse_max_keys(query.get("max-keys"))
    marker = start_after = continuation_token = ""
    fetch_owner = token_given = False
    if version == 1:
        marker = query.get("marker", "")
        start = marker
    else:
        start_after = query.get("start-after", "")
        fetch_owner = query.get("fetch-owner", "").lower() == "true"
        start = start_after
        token_given = "continuation-token" in query
        continuation_token = query.get("continuation-token", "")
        if continuation_token:
            start = max(start, decode_token(continuation_token), key=store_order)
    return ListRequest(
        version=version,
        prefix=query.get("prefix", ""),
        delimiter=query.get("delimiter", ""),
        max_keys=max_keys,
        start=start,
        encoding_type=encoding_type,
        fetch_owner=fetch_owner,
        marker=marker,
        start_after=start_after,
        continuation_token=continuation_token,
        token_given=token_given,
    )


def _parse_encoding_type(query: Mapping[str, str]) -> str:
    encoding_type = query.get("encoding-type", "")
    if encoding_type not in ("", "url"):
        raise InvalidArgument(
            "Invalid Encoding Method specified in Request",
            ArgumentName="encoding-type",
            ArgumentValue=encoding_type,
        )
    return encoding_type


def _parse_max_keys(raw: str | None) -> int:
    if raw is None:
        return MAX_KEYS_LIMIT
    # Digits only: int() would also take " 5", "+5" and "5_0". Length first: int() of a huge string is slow.
    if not _DIGITS.fullmatch(raw) or len(raw.lstrip("0")) > 10 or int(raw) > _INT32_MAX:
        raise InvalidArgument(
            "Provided max-keys not an integer or within integer range",
            ArgumentName="max-keys",
            ArgumentValue=raw,
        )
    return min(int(raw), MAX_KEYS_LIMIT)


def encode_token(last_item: str) -> str:
    """Our V2 continuation token for a page whose last item was ``last_item``.

    URL-safe base64 without padding of ``b"s3lanes1:" + utf-8``. Not a secret and not signed: a client that
    forges one only chooses where its listing starts, which start-after lets it do anyway.
    """
    return base64.urlsafe_b64encode(_TOKEN_MAGIC + last_item.encode()).rstrip(b"=").decode("ascii")


def decode_token(token: str) -> str:
    """The last item carried by one of our tokens. Raises :class:`NotOurToken` for anything else."""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII token
        raise NotOurToken(token) from None
    if not raw.startswith(_TOKEN_MAGIC):
        raise NotOurToken(token)
    try:
        return raw[len(_TOKEN_MAGIC) :].decode("utf-8")
    except UnicodeDecodeError:
        raise NotOurToken(token) from None


def continues_our_listing(q: Mapping[str, str]) -> bool:
    """Whether a request's query (its names decoded) continues a ListObjectsV2 listing from one of our
    tokens: the store cannot continue from a token it did not issue, so the spool lists that page."""
    token = q.get("continuation-token")
    if q.get("list-type") != "2" or not token:
        return False
    try:
        decode_token(token)
    except NotOurToken:
        return False
    return True


# -- backend --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _BackendBody:
    """What a backend listing body (ListBucketResult or ListVersionsResult) holds besides its items."""

    root: ET.Element
    decode: Callable[[str], str]  # of its key and prefix values (url-decoding if it says EncodingType url)
    items: list[tuple[str, ET.Element]]  # the root's children other than CommonPrefixes, by local name
    common_prefixes: list[str]
    is_truncated: bool


def _backend_body(xml: bytes, root_tag: str, what: str) -> _BackendBody:
    """A backend listing body, checked to have root ``root_tag``. Malformed bodies raise ValueError."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ValueError(f"backend {what} is not XML: {exc}") from None
    if _local(root.tag) != root_tag:
        raise ValueError(f"backend {what} has root <{_local(root.tag)}>, not <{root_tag}>")
    url = (_child_text(root, "EncodingType") or "") == "url"

    def decode(value: str) -> str:
        return unquote_plus(value, errors="strict") if url else value

    items: list[tuple[str, ET.Element]] = []
    prefixes: list[str] = []
    for child in root:
        name = _local(child.tag)
        if name != "CommonPrefixes":
            items.append((name, child))
            continue
        prefix = _child_text(child, "Prefix")
        if prefix is None:
            raise ValueError("<CommonPrefixes> without <Prefix>")
        prefixes.append(decode(prefix))
    truncated = (_child_text(root, "IsTruncated") or "false").strip().lower()
    if truncated not in ("true", "false"):
        raise ValueError(f"<IsTruncated> is {truncated!r}")
    return _BackendBody(root, decode, items, prefixes, truncated == "true")


def parse_backend_listing(xml: bytes) -> BackendListing:
    """Parse one backend ListObjectsV2 (or V1) result body. Malformed bodies raise ValueError.

    With ``<EncodingType>url</EncodingType>``, Key and Prefix values are decoded with ``unquote_plus``, not
    ``unquote``: SeaweedFS encodes the last path segment of a key with Go's ``url.QueryEscape`` (space as
    ``+``; weed/s3api ``entryUrlEncode``), AWS is reported to send ``+`` for spaces too, and every encoder
    sends a literal ``+`` as ``%2B``. botocore decodes these values with ``unquote_plus`` for the same
    reason. V1's NextMarker is not read: the shell pages the backend with V2 tokens.
    """
    body = _backend_body(xml, "ListBucketResult", "listing")
    return BackendListing(
        entries=[_parse_contents(item, body.decode) for name, item in body.items if name == "Contents"],
        common_prefixes=body.common_prefixes,
        is_truncated=body.is_truncated,
        next_continuation_token=_child_text(body.root, "NextContinuationToken") or None,
    )


def _parse_contents(element: ET.Element, decode: Callable[[str], str]) -> ListEntry:
    entry = _listed_object(element, "Contents", decode, size_default="")
    return entry if entry.etag else replace(entry, etag='""')  # a key always shows an ETag


def _listed_object(
    element: ET.Element, what: str, decode: Callable[[str], str], *, size_default: str
) -> ListEntry:
    """What a backend <Contents> and <Version> (or <DeleteMarker>) both hold, the key decoded; the ETag
    quoted, "" if absent. ValueError if its key, time or size is missing."""
    key = _child_text(element, "Key")
    size = (_child_text(element, "Size") or size_default).strip()
    modified = _child_text(element, "LastModified")
    if key is None or modified is None or not _DIGITS.fullmatch(size):
        raise ValueError(f"<{what}> needs <Key>, <LastModified> and a numeric <Size>")
    etag = (_child_text(element, "ETag") or "").strip()
    if etag and not etag.startswith('"'):
        etag = f'"{etag}"'
    owner_id = owner_name = None
    for child in element:
        if _local(child.tag) == "Owner":
            owner_id = _child_text(child, "ID")
            owner_name = _child_text(child, "DisplayName")
    storage_class = _child_text(element, "StorageClass") or "STANDARD"
    return ListEntry(
        decode(key),
        int(size),
        etag=etag,
        last_modified=_parse_time(modified.strip()),
        storage_class=storage_class,
        owner_id=owner_id,
        owner_name=owner_name,
    )


def _parse_time(text: str) -> float:
    moment = datetime.fromisoformat(text)  # ValueError when malformed
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _child_text(element: ET.Element, name: str) -> str | None:
    for child in element:
        if _local(child.tag) == name:
            return child.text or ""
    return None


# -- merge ----------------------------------------------------------------------------------------------


def roll_up(req: ListRequest, key: str) -> str | None:
    """The common prefix ``key`` rolls up into under ``req``'s prefix and delimiter, or None.

    ``key`` must start with ``req.prefix``.
    """
    if not req.delimiter:
        return None
    rest = key[len(req.prefix) :]
    at = rest.find(req.delimiter)
    return None if at < 0 else req.prefix + rest[: at + len(req.delimiter)]


def prefix_visible(prefix: str, start: str) -> bool:
    """Whether a version listing continued after ``start`` shows common prefix ``prefix``: S3's rule, in
    S3's byte order, which the store follows for ListObjectVersions (ListObjects: :func:`listed_after`).
    Shown iff ``prefix > start`` and ``start`` is not inside it.

    The second clause is implied by the first (a ``start`` inside ``prefix`` sorts at or after it); it is
    spelled out because it is the rule S3 clients rely on: a prefix is never listed twice.
    """
    return prefix > start and not start.startswith(prefix)


def store_order(item: str) -> tuple[str, ...]:
    """The sort key of the store's listing order: the item's ``/``-separated segments (see the module
    doc). Not S3's byte order: ``a/b`` sorts before ``a-c`` here."""
    return tuple(item.split("/"))


def prefix_order(req: ListRequest) -> Callable[[str], list[tuple[int, str]] | str]:
    """The sort key of a page's CommonPrefixes as the store sorts them: by bytes, but the delimiter
    before any other character (with ``/``, ``a/`` before ``a+1/``) when it is one byte; plain order for a
    longer delimiter. Only a delimiter other than ``/`` makes this differ from :func:`store_order`."""
    delimiter = req.delimiter
    if len(delimiter.encode()) != 1:
        return lambda prefix: prefix
    return lambda prefix: [(0, "") if c == delimiter else (1, c) for c in prefix]


def listed_after(item: str, start: str) -> bool:
    """Whether a ListObjects continued after ``start`` shows ``item`` (a key or a common prefix), as the
    store answers it: ``item`` after ``start`` in :func:`store_order`, and not inside the directory
    ``start/`` unless ``start`` ends in ``/`` (see the module doc). A prefix containing ``start`` sorts
    before it, so it is not shown again."""
    if store_order(item) <= store_order(start):
        return False
    return not start or start.endswith("/") or not item.startswith(start + "/")


def prefixes_to_expand(
    req: ListRequest, backend_prefixes: Iterable[str], hidden_keys: Collection[str]
) -> list[str]:
    """Backend common prefixes the page would show that contain a tombstoned key, in S3 order.

    The backend's common prefix says only that *some* key lies under it; if those are all deleted in the
    spool, the prefix must go. The shell lists each of these prefixes in the backend without a delimiter
    and passes its keys to :func:`merge_page` as backend entries, in place of the prefix.
    """
    hidden_rollups = {
        rolled
        for key in hidden_keys
        if key.startswith(req.prefix) and (rolled := roll_up(req, key)) is not None
    }
    return sorted({p for p in backend_prefixes if p in hidden_rollups and listed_after(p, req.start)})


def merge_page(
    req: ListRequest,
    backend_entries: Iterable[ListEntry],
    backend_prefixes: Iterable[str],
    spool_entries: Iterable[ListEntry],
    hidden_keys: Collection[str],
) -> ListPage:
    """Cut the page ``req`` asks for out of the backend's listing merged with the spool.

    ``backend_entries`` and ``backend_prefixes`` are the backend's whole listing of ``req.prefix``, in any
    order. ``spool_entries`` are the latest version of each spooled key (one per key; if a key repeats,
    the last one wins); they win over a backend entry of the same key. ``hidden_keys`` are the keys deleted
    in the spool; backend entries with those keys are dropped. Keys outside ``req.prefix`` are ignored, and
    with a delimiter a key rolls up into its common prefix (:func:`roll_up`). Only items after
    ``req.start`` count (:func:`listed_after`); keys and prefixes together fill up to ``req.max_keys`` in
    :func:`store_order` (one more where a key ``K`` is followed by ``K/``, see the module doc).

    ``max_keys == 0`` gives an empty page with ``is_truncated`` false. That is what S3 answers (ceph's
    s3-tests, written against AWS, pin it in ``test_bucket_list_maxkeys_zero``), and a truncated page with
    no item to continue after would leave a V2 client without a NextContinuationToken.
    """
    start = req.start
    keys: dict[str, ListEntry] = {}
    prefixes: set[str] = set()

    def admit(entry: ListEntry) -> None:
        if not entry.key.startswith(req.prefix):
            return
        rolled = roll_up(req, entry.key)
        if rolled is not None:
            if listed_after(rolled, start):
                prefixes.add(rolled)
        elif listed_after(entry.key, start):
            keys[entry.key] = entry

    for entry in backend_entries:
        if entry.key not in hidden_keys:
            admit(entry)
    for prefix in backend_prefixes:
        if prefix.startswith(req.prefix) and listed_after(prefix, start):
            prefixes.add(prefix)
    for entry in spool_entries:
        admit(entry)

    # A key is never also a prefix (a key equal to a prefix contains the delimiter, so it rolls up), but a
    # backend answer could still say so; the key then shows once, as a key.
    prefixes.difference_update(keys)
    if req.max_keys <= 0:
        return ListPage([], [], is_truncated=False, next_item=None, key_count=0)
    items = sorted([*keys, *prefixes], key=store_order)
    size = min(req.max_keys, len(items))
    if size < len(items) and items[size - 1] in keys and items[size] == items[size - 1] + "/":
        size += 1  # the key K and the prefix (or key) K/ are one directory entry of the store: one page
    page_items = items[:size]
    truncated = size < len(items)
    next_item = None
    if truncated:
        last = page_items[-1]
        next_item = last
        if last in keys and not last.endswith("/") and items[size].startswith(last + "/"):
            next_item = last + "/"  # continue inside K/, which a start of K would skip
    return ListPage(
        entries=[keys[item] for item in page_items if item in keys],
        common_prefixes=sorted((item for item in page_items if item not in keys), key=prefix_order(req)),
        is_truncated=truncated,
        next_item=next_item,
        key_count=len(page_items),
    )


# -- rendering ------------------------------------------------------------------------------------------


def render_list_xml(req: ListRequest, bucket: str, page: ListPage) -> bytes:
    """The ListBucketResult document the store answers ``req`` with for ``page``.

    Elements come in the order of AWS's documented example responses. V1 shows NextMarker on every
    truncated page, as the store does (S3 only with a delimiter). With ``encoding-type=url`` keys and
    common prefixes are encoded as the store encodes them (:func:`encode_key`, :func:`encode_prefix`);
    the echoed Prefix, Marker, StartAfter, Delimiter and NextMarker are not, as the store sends them.

    A value holding a character XML 1.0 cannot carry (controls other than tab, LF and CR; U+FFFE, U+FFFF)
    raises :class:`InvalidArgument` asking for ``encoding-type=url``, rather than sending a document no
    XML parser accepts (AWS documents encoding-type as the answer for such keys); an echoed value holding
    one is percent-encoded under ``encoding-type=url``.
    """
    url = req.encoding_type == "url"

    def echo(value: str) -> str:
        return s3_quote(value, safe="/") if url and _XML_ILLEGAL.search(value) else value

    def key(value: str) -> str:
        return encode_key(value) if url else value

    def prefix(value: str) -> str:
        return encode_prefix(value) if url else value

    out = ['<?xml version="1.0" encoding="UTF-8"?>\n', f'<ListBucketResult xmlns="{S3_XMLNS}">']
    out.append(_element("Name", bucket))
    out.append(_element("Prefix", echo(req.prefix)))
    if req.version == 1:
        out.append(_element("Marker", echo(req.marker)))
        if page.is_truncated and page.next_item is not None:
            out.append(_element("NextMarker", echo(page.next_item)))
    else:
        if req.continuation_token or req.token_given:
            out.append(_element("ContinuationToken", req.continuation_token))
        if page.is_truncated and page.next_item is not None:
            out.append(_element("NextContinuationToken", encode_token(page.next_item)))
        if req.start_after:
            out.append(_element("StartAfter", echo(req.start_after)))
        out.append(_element("KeyCount", str(page.key_count)))
    out.append(_element("MaxKeys", str(req.max_keys)))
    if req.delimiter:
        out.append(_element("Delimiter", echo(req.delimiter)))
    if url:
        out.append(_element("EncodingType", "url"))
    out.append(_element("IsTruncated", "true" if page.is_truncated else "false"))
    show_owner = req.version == 1 or req.fetch_owner
    for entry in page.entries:
        out.append("<Contents>")
        out.append(_element("Key", key(entry.key)))
        out.append(_element("LastModified", iso8601(entry.last_modified)))
        out.append(_element("ETag", entry.etag))
        out.append(_element("Size", str(entry.size)))
        if show_owner:
            out.append(_owner_element(entry.owner_id, entry.owner_name))
        out.append(_element("StorageClass", entry.storage_class))
        out.append("</Contents>")
    for common in page.common_prefixes:
        out.append(f"<CommonPrefixes>{_element('Prefix', prefix(common))}</CommonPrefixes>")
    out.append("</ListBucketResult>")
    return "".join(out).encode("utf-8")


def _owner_element(owner_id: str | None, owner_name: str | None) -> str:
    """An object's <Owner> with what is known of it; "" if nothing is."""
    if owner_id is None and owner_name is None:
        return ""
    id_element = "" if owner_id is None else _element("ID", owner_id)
    name_element = "" if owner_name is None else _element("DisplayName", owner_name)
    return f"<Owner>{id_element}{name_element}</Owner>"


def encode_key(key: str) -> str:
    """A key as the store writes it under ``encoding-type=url``: its directory segments percent-encoded
    (space as ``%20``), its last segment as a query component (space as ``+``), every byte but
    ``A-Za-z0-9-_.~`` encoded (SeaweedFS: ``a b/c d`` is ``a%20b/c+d``). Clients decode both forms
    (botocore with ``unquote_plus``)."""
    directory, sep, name = key.rpartition("/")
    head = "/".join(s3_quote(segment) for segment in directory.split("/")) + sep if sep else ""
    return head + quote_plus(name, safe="~", encoding="utf-8", errors="strict")


def encode_prefix(prefix: str) -> str:
    """A common prefix as the store writes it under ``encoding-type=url``: percent-encoded, space as
    ``%20``, ``/`` kept."""
    return s3_quote(prefix, safe="/")


def _element(name: str, value: str) -> str:
    if _XML_ILLEGAL.search(value):
        raise InvalidArgument(
            f"The {name} value contains characters XML 1.0 cannot carry; use encoding-type=url",
            ArgumentName="encoding-type",
        )
    return f"<{name}>{escape(value, _XML_ENTITIES)}</{name}>"


def iso8601(epoch_s: float) -> str:
    """S3's listing timestamp. Whole seconds with ``.000Z``, as S3 shows them and as HEAD's Last-Modified
    (seconds) agrees with; a sync tool comparing the two must not see a sub-second difference."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(math.floor(epoch_s)))


# -- ListObjectVersions ---------------------------------------------------------------------------------
#
# The same merge for the listing of object versions (the call tools use to empty a bucket). The spool
# models an unversioned bucket: a spooled key has exactly one version, ``null``, which is the latest; it
# replaces the backend's ``null`` version of that key (an overwrite), and a tombstone removes it (a delete).
# Other backend versions of the key (a versioned bucket's history) stay, no longer the latest. Items are
# versions, delete markers and common prefixes, ordered by key (S3 order), and within a key as the backend
# lists them (newest first), the spooled version first. ``key-marker`` continues after every version of that
# key; with ``version-id-marker`` too, after that version of it (the rest of the key's versions come first).

NULL_VERSION = "null"


@dataclass(frozen=True, slots=True)
class VersionEntry:
    """One version or delete marker as ListObjectVersions shows it: the object as a listing shows it (a
    delete marker's with size 0 and ETag ""), and which version of it this is."""

    entry: ListEntry
    version_id: str
    is_latest: bool
    delete_marker: bool = False


@dataclass(frozen=True, slots=True)
class VersionsRequest:
    """A client's ListObjectVersions request, validated."""

    prefix: str
    delimiter: str
    max_keys: int  # 0..1000 (capped)
    key_marker: str
    version_id_marker: str
    encoding_type: str  # "" or "url"

    @property
    def start(self) -> str:
        """The key every listed item follows (common prefixes are shown by :func:`prefix_visible`)."""
        return self.key_marker


@dataclass(frozen=True, slots=True)
class BackendVersions:
    """One backend ListObjectVersions page."""

    versions: list[VersionEntry]
    common_prefixes: list[str]
    is_truncated: bool
    next_key_marker: str
    next_version_id_marker: str


@dataclass(frozen=True, slots=True)
class VersionsPage:
    """One page for the client: versions/delete markers and common prefixes, each in S3 order."""

    versions: list[VersionEntry]
    common_prefixes: list[str]
    is_truncated: bool
    next_key_marker: str  # "" unless truncated
    next_version_id_marker: str  # "" unless truncated after a version


def parse_versions_request(query: Mapping[str, str]) -> VersionsRequest:
    """Validate a ListObjectVersions request (decoded query). Raises :class:`InvalidArgument` as S3 does.

    A version-id-marker without a key-marker is ignored, as the store (SeaweedFS) ignores it."""
    encoding_type = _parse_encoding_type(query)
    key_marker = query.get("key-marker", "")
    return VersionsRequest(
        prefix=query.get("prefix", ""),
        delimiter=query.get("delimiter", ""),
        max_keys=_parse_max_keys(query.get("max-keys")),
        key_marker=key_marker,
        version_id_marker=query.get("version-id-marker", "") if key_marker else "",
        encoding_type=encoding_type,
    )


def parse_backend_versions(xml: bytes) -> BackendVersions:
    """Parse one backend ListVersionsResult body (values url-decoded if it says EncodingType url).

    Malformed bodies raise ValueError."""
    body = _backend_body(xml, "ListVersionsResult", "version listing")
    return BackendVersions(
        versions=[
            _parse_version(item, body.decode, delete_marker=name == "DeleteMarker")
            for name, item in body.items
            if name in ("Version", "DeleteMarker")
        ],
        common_prefixes=body.common_prefixes,
        is_truncated=body.is_truncated,
        next_key_marker=body.decode(_child_text(body.root, "NextKeyMarker") or ""),
        next_version_id_marker=_child_text(body.root, "NextVersionIdMarker") or "",
    )


def _parse_version(element: ET.Element, decode: Callable[[str], str], *, delete_marker: bool) -> VersionEntry:
    return VersionEntry(
        _listed_object(element, "Version", decode, size_default="0"),
        version_id=(_child_text(element, "VersionId") or NULL_VERSION).strip(),
        is_latest=(_child_text(element, "IsLatest") or "").strip().lower() == "true",
        delete_marker=delete_marker,
    )


def versions_prefixes_to_expand(
    req: VersionsRequest, backend_prefixes: Iterable[str], hidden_keys: Collection[str]
) -> list[str]:
    """Backend common prefixes the page would show that contain a tombstoned key (see
    :func:`prefixes_to_expand`): the shell lists them without a delimiter and passes their versions in."""
    hidden_rollups = {
        rolled
        for key in hidden_keys
        if key.startswith(req.prefix) and (rolled := _roll_up(req.prefix, req.delimiter, key)) is not None
    }
    return sorted({p for p in backend_prefixes if p in hidden_rollups and prefix_visible(p, req.start)})


def _roll_up(prefix: str, delimiter: str, key: str) -> str | None:
    if not delimiter:
        return None
    rest = key[len(prefix) :]
    at = rest.find(delimiter)
    return None if at < 0 else prefix + rest[: at + len(delimiter)]


def merge_versions_page(
    req: VersionsRequest,
    backend_versions: Iterable[VersionEntry],
    backend_prefixes: Iterable[str],
    spool_versions: Iterable[VersionEntry],
    hidden_keys: Collection[str],
) -> VersionsPage:
    """Cut the page ``req`` asks for out of the backend's version listing merged with the spool.

    ``backend_versions``/``backend_prefixes`` are the backend's whole version listing of ``req.prefix``
    (each key's versions in the backend's order). ``spool_versions`` are the spooled keys' versions (one per
    key, version ``null``, latest); ``hidden_keys`` the keys deleted in the spool. ``max_keys`` counts
    versions, delete markers and common prefixes; 0 gives an empty, untruncated page (as ListObjects)."""
    by_key: dict[str, list[VersionEntry]] = {}
    for version in backend_versions:
        key = version.entry.key
        if key.startswith(req.prefix):
            by_key.setdefault(key, []).append(version)
    for key in hidden_keys:
        kept = [v for v in by_key.get(key, []) if v.version_id != NULL_VERSION]
        if kept:
            by_key[key] = kept
        else:
            by_key.pop(key, None)
    for spooled in spool_versions:
        key = spooled.entry.key
        if not key.startswith(req.prefix):
            continue
        older = [_not_latest(v) for v in by_key.get(key, []) if v.version_id != spooled.version_id]
        by_key[key] = [spooled, *older]

    start = req.key_marker
    prefixes: set[str] = {
        p for p in backend_prefixes if p.startswith(req.prefix) and prefix_visible(p, start)
    }
    keys: dict[str, list[VersionEntry]] = {}
    for key, versions in by_key.items():
        rolled = _roll_up(req.prefix, req.delimiter, key)
        if rolled is not None:
            if prefix_visible(rolled, start):
                prefixes.add(rolled)
        elif key > start:
            keys[key] = versions
        elif key == start and req.version_id_marker:
            ids = [v.version_id for v in versions]
            if req.version_id_marker in ids:
                rest = versions[ids.index(req.version_id_marker) + 1 :]
                if rest:
                    keys[key] = rest
    prefixes.difference_update(keys)

    if req.max_keys <= 0:
        return VersionsPage([], [], False, "", "")
    page_versions: list[VersionEntry] = []
    page_prefixes: list[str] = []
    count = 0
    last: tuple[str, str] = ("", "")
    truncated = False
    for name in sorted([*keys, *prefixes]):
        items: list[VersionEntry | None] = list(keys[name]) if name in keys else [None]
        for item in items:
            if count == req.max_keys:
                truncated = True
                break
            count += 1
            if item is None:
                page_prefixes.append(name)
                last = (name, "")
            else:
                page_versions.append(item)
                last = (item.entry.key, item.version_id)
        if truncated:
            break
    if not truncated:
        last = ("", "")
    return VersionsPage(page_versions, page_prefixes, truncated, last[0], last[1])


def _not_latest(version: VersionEntry) -> VersionEntry:
    return replace(version, is_latest=False) if version.is_latest else version


def render_versions_xml(req: VersionsRequest, bucket: str, page: VersionsPage) -> bytes:
    """The ListVersionsResult document for ``page``, as the store answers it: Prefix, KeyMarker and
    VersionIdMarker only when not empty, and no encoding (the store ignores ``encoding-type`` here: no
    EncodingType element, keys as they are, so a client decodes nothing)."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>\n', f'<ListVersionsResult xmlns="{S3_XMLNS}">']
    out.append(_element("Name", bucket))
    if req.prefix:
        out.append(_element("Prefix", req.prefix))
    if req.key_marker:
        out.append(_element("KeyMarker", req.key_marker))
    if req.version_id_marker:
        out.append(_element("VersionIdMarker", req.version_id_marker))
    if page.is_truncated:
        out.append(_element("NextKeyMarker", page.next_key_marker))
        if page.next_version_id_marker:
            out.append(_element("NextVersionIdMarker", page.next_version_id_marker))
    out.append(_element("MaxKeys", str(req.max_keys)))
    if req.delimiter:
        out.append(_element("Delimiter", req.delimiter))
    out.append(_element("IsTruncated", "true" if page.is_truncated else "false"))
    for v in page.versions:
        e = v.entry
        out.append("<DeleteMarker>" if v.delete_marker else "<Version>")
        out.append(_element("Key", e.key))
        out.append(_element("VersionId", v.version_id))
        out.append(_element("IsLatest", "true" if v.is_latest else "false"))
        out.append(_element("LastModified", iso8601(e.last_modified)))
        if not v.delete_marker:
            out.append(_element("ETag", e.etag))
            out.append(_element("Size", str(e.size)))
        out.append(_owner_element(e.owner_id, e.owner_name))
        if not v.delete_marker:
            out.append(_element("StorageClass", e.storage_class))
        out.append("</DeleteMarker>" if v.delete_marker else "</Version>")
    for prefix in page.common_prefixes:
        out.append(f"<CommonPrefixes>{_element('Prefix', prefix)}</CommonPrefixes>")
    out.append("</ListVersionsResult>")
    return "".join(out).encode("utf-8")


# -- one merge path for ListObjects and ListObjectVersions ---------------------------------------------
#
# The shell reads the backend's whole listing of the prefix (:func:`backend_query`, paged with
# :func:`parse_backend_page`'s cursor), lists the prefixes :func:`expand_prefixes` names without a
# delimiter, and hands everything with the spool's live keys to :func:`merged_listing_xml`. Which listing
# it is follows from the request's type.

AnyListRequest = ListRequest | VersionsRequest
BackendCursor = str | tuple[str, str]  # a V2 continuation token, or (key-marker, version-id-marker)


@dataclass(frozen=True, slots=True)
class SpooledObject:
    """A spooled object as listings show it (the latest write of its key)."""

    key: str
    size: int
    etag: str
    acked_at: float
    owner: tuple[str, str] | None = None  # (ID, DisplayName) the store will list it with, if known

    @property
    def owner_id(self) -> str | None:
        return self.owner[0] if self.owner else None

    @property
    def owner_name(self) -> str | None:
        return self.owner[1] if self.owner else None

    @property
    def entry(self) -> ListEntry:
        """The object as listings show it once drained."""
        return ListEntry(
            self.key, self.size, self.etag, self.acked_at, owner_id=self.owner_id, owner_name=self.owner_name
        )


def backend_query(
    req: AnyListRequest, prefix: str, delimiter: str, cursor: BackendCursor | None
) -> list[tuple[str, str]]:
    """The query parameters of one backend page of the listing ``req`` merges (decoded values)."""
    if isinstance(req, VersionsRequest):
        params = [("versions", ""), ("max-keys", "1000"), ("prefix", prefix)]
        if delimiter:
            params.append(("delimiter", delimiter))
        if isinstance(cursor, tuple):
            params.append(("key-marker", cursor[0]))
            if cursor[1]:
                params.append(("version-id-marker", cursor[1]))
        return params
    params = [("list-type", "2"), ("encoding-type", "url"), ("max-keys", "1000"), ("prefix", prefix)]
    params.append(("fetch-owner", "true"))
    if delimiter:
        params.append(("delimiter", delimiter))
    if isinstance(cursor, str):
        params.append(("continuation-token", cursor))
    return params


def parse_backend_page(
    req: AnyListRequest, xml: bytes, cursor: BackendCursor | None
) -> tuple[list[ListEntry] | list[VersionEntry], list[str], BackendCursor | None]:
    """One backend page of the listing ``req`` merges: its items, common prefixes and the cursor of the
    next page (None at the end, or where the backend would not move on). Malformed bodies raise
    ValueError."""
    if isinstance(req, VersionsRequest):
        versions = parse_backend_versions(xml)
        following = (versions.next_key_marker, versions.next_version_id_marker)
        done = not versions.is_truncated or not versions.next_key_marker or following == cursor
        return versions.versions, versions.common_prefixes, None if done else following
    listing = parse_backend_listing(xml)
    token = listing.next_continuation_token if listing.is_truncated else None
    return listing.entries, listing.common_prefixes, token or None


def expand_prefixes(
    req: AnyListRequest, backend_prefixes: Iterable[str], hidden_keys: Collection[str]
) -> list[str]:
    """:func:`prefixes_to_expand` or :func:`versions_prefixes_to_expand`, as ``req`` is."""
    if isinstance(req, VersionsRequest):
        return versions_prefixes_to_expand(req, backend_prefixes, hidden_keys)
    return prefixes_to_expand(req, backend_prefixes, hidden_keys)


def merged_listing_xml(
    req: AnyListRequest,
    bucket: str,
    backend_items: Iterable[ListEntry | VersionEntry],
    backend_prefixes: Iterable[str],
    spooled: Iterable[SpooledObject],
    hidden_keys: Collection[str],
) -> bytes:
    """The answer to ``req``: the backend's listing merged with the spool (:func:`merge_page` or
    :func:`merge_versions_page`), rendered. A spooled object is listed as the store will list it once
    drained: a key, or its one version ``null``, the latest."""
    if isinstance(req, VersionsRequest):
        versions = [VersionEntry(o.entry, NULL_VERSION, is_latest=True) for o in spooled]
        backend_versions = [v for v in backend_items if isinstance(v, VersionEntry)]
        page = merge_versions_page(req, backend_versions, backend_prefixes, versions, hidden_keys)
        return render_versions_xml(req, bucket, page)
    entries = [o.entry for o in spooled]
    backend_entries = [e for e in backend_items if isinstance(e, ListEntry)]
    page_ = merge_page(req, backend_entries, backend_prefixes, entries, hidden_keys)
    return render_list_xml(req, bucket, page_)


def shows_owner(req: AnyListRequest) -> bool:
    """Whether the listing shows each object's Owner (V1 and ListObjectVersions always, V2 on request)."""
    return isinstance(req, VersionsRequest) or req.version == 1 or req.fetch_owner


# -- ListParts ------------------------------------------------------------------------------------------

STORE_MAX_PARTS = 10000  # SeaweedFS's MaxParts when a ListParts does not give one (AWS: 1000)


@dataclass(frozen=True, slots=True)
class PartsPage:
    parts: list[int]  # part numbers on the page, ascending
    max_parts: int  # as echoed in MaxParts
    is_truncated: bool


def list_parts_page(part_numbers: Iterable[int], marker: int, max_parts_raw: str | None) -> PartsPage:
    """A ListParts page as the store cuts it: the parts after ``marker``, at most ``max-parts`` of them.
    Not given, max-parts is 10000; one that is not a number is echoed as 0; 0 or less limits nothing
    (SeaweedFS lists every part then)."""
    if max_parts_raw is None:
        max_parts = STORE_MAX_PARTS
    else:
        try:
            max_parts = int(max_parts_raw.strip())
        except ValueError:
            max_parts = 0
    after = sorted(n for n in part_numbers if n > marker)
    page = after[:max_parts] if max_parts > 0 else after
    return PartsPage(page, max_parts, len(page) < len(after))


def parse_owner(xml: bytes) -> tuple[str, str] | None:
    """(ID, DisplayName) of the ``<Owner>`` of a ListAllMyBucketsResult (ListBuckets), or None."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    for child in root:
        if _local(child.tag) == "Owner":
            return _child_text(child, "ID") or "", _child_text(child, "DisplayName") or ""
    return None


# -- ListMultipartUploads -------------------------------------------------------------------------------

_UPLOAD_ELEMENT = re.compile(rb"<Upload>.*?</Upload>", re.DOTALL)
_UPLOAD_ID_ELEMENT = re.compile(rb"<UploadId>(.*?)</UploadId>", re.DOTALL)


def drop_listed_uploads(xml: bytes, upload_ids: Collection[str], keys: Collection[str] = ()) -> bytes:
    """A backend ListMultipartUploadsResult without the ``<Upload>`` elements of ``upload_ids`` (the
    drain's own uploads) nor those of ``keys`` (keys whose drain upload is being created: its id is not
    known yet), everything else byte for byte. A page may then hold fewer uploads than max-uploads, which
    S3 allows; its markers still continue the listing where the backend would."""
    if not upload_ids and not keys:
        return xml
    wanted = {escape(u).encode() for u in upload_ids}
    url = b"<EncodingType>url</EncodingType>" in xml

    def keep(match: re.Match[bytes]) -> bytes:
        found = _UPLOAD_ID_ELEMENT.search(match.group(0))
        if found is not None and found.group(1).strip() in wanted:
            return b""
        if keys:
            key = _KEY_ELEMENT.search(match.group(0))
            raw = html.unescape(key.group(1).decode()) if key is not None else None
            if raw is not None and (unquote_plus(raw) if url else raw) in keys:
                return b""
        return match.group(0)

    return _UPLOAD_ELEMENT.sub(keep, xml)


def add_listed_uploads(xml: bytes, extra: Iterable[tuple[str, bytes]]) -> bytes:
    """A backend ListMultipartUploadsResult page with ``extra`` uploads (``(key, <Upload> element)``) merged
    in among the page's own, in key order (S3's order; a stable merge keeps the backend's order of one key's
    uploads, the extra ones after them). Everything outside the uploads is kept byte for byte. Raises
    ValueError for a body that is not a ListMultipartUploadsResult."""
    end = xml.rfind(b"</ListMultipartUploadsResult>")
    if end < 0:
        raise ValueError("not a ListMultipartUploadsResult")
    added = list(extra)
    if not added:
        return xml
    url = b"<EncodingType>url</EncodingType>" in xml
    blocks = list(_UPLOAD_ELEMENT.finditer(xml))
    items: list[tuple[str, int, bytes]] = []
    for n, match in enumerate(blocks):
        found = _KEY_ELEMENT.search(match.group(0))
        raw = html.unescape(found.group(1).decode()) if found is not None else ""
        items.append((unquote_plus(raw) if url else raw, n, match.group(0)))
    items += [(key, len(blocks) + n, element) for n, (key, element) in enumerate(added)]
    merged = b"".join(element for _, _, element in sorted(items, key=lambda item: (item[0], item[1])))
    if blocks:
        start, stop = blocks[0].start(), blocks[-1].end()
        if xml[start:stop].count(b"<Upload>") != len(blocks):
            raise ValueError("backend uploads are not contiguous")
    else:
        prefixes = xml.find(b"<CommonPrefixes>")
        start = stop = prefixes if 0 <= prefixes < end else end
    return xml[:start] + merged + xml[stop:]


_KEY_ELEMENT = re.compile(rb"<Key>(.*?)</Key>", re.DOTALL)
