"""GET and HEAD of an object the gateway serves itself (from the write spool). Pure; no I/O.

Theory of operation: an object that is acknowledged but not yet uploaded is read back from the spool, so
the gateway has to answer exactly as S3's GetObject/HeadObject would. :func:`plan_read` takes what the
spool knows about the object (:class:`StoredObject`) and the request's headers and query, and returns a
:class:`ReadPlan`: a status, the byte span to send and every response header. It raises the S3 errors
(400, 412, 416) instead. The async shell only opens the spool file and sends ``length`` bytes from
``start`` (nothing for HEAD and 304).

The steps run in this order, which is RFC 7232 section 6 plus S3's argument checks:

1. Request arguments: ``partNumber`` must be an integer 1..10000 (400 InvalidArgument) and may not come
   with a ``Range`` header (400 InvalidRequest). S3 rejects these before it looks at the object, so they
   win over any precondition. (Choice: the docs do not give the order; a client error about the request
   itself not depending on the object's state is how S3 behaves for other arguments.)
2. Preconditions, RFC 7232 section 6, which is what the AWS GetObject/HeadObject docs describe:
   If-Match false -> 412; only without If-Match, If-Unmodified-Since false -> 412 (AWS: "If-Match true and
   If-Unmodified-Since false -> 200 OK"). Then If-None-Match false (an ETag matched) -> 304; only without
   If-None-Match, If-Modified-Since false -> 304 (AWS: "If-None-Match false and If-Modified-Since true ->
   304"; the converse, If-None-Match true and If-Modified-Since false, is not in the AWS docs: RFC 7232
   says the If-Modified-Since is ignored, so the answer is 200).
3. The byte span: a part (``partNumber``), a single range, or the whole object. A range is evaluated only
   after the preconditions (RFC 7233 section 3.1), so a 304/412 wins over a 416. HEAD ignores ``Range``
   (200 with the whole length, never 416), as the store (SeaweedFS) does: the object answers the same in
   the spool and once drained (AWS would answer 206/416; docs/compatibility.md).
4. Headers: validators, x-amz-tagging-count, the stored headers with the ``response-*`` overrides applied,
   x-amz-mp-parts-count (with partNumber; 1 for a single PUT, as the store answers), Accept-Ranges,
   Content-Range, Content-Type, Content-Length. Stored x-amz-checksum-* are sent only as S3 does: with
   x-amz-checksum-mode ENABLED and for the whole object.

Not handled here (the shell's business): authorization (S3 only honours ``response-*`` overrides on signed
requests), versionId, SSE-C, x-amz-request-id and Date, and sending no body for HEAD. ``If-Range`` is
ignored: S3 does not document it, so a Range is always applied.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import formatdate, parsedate_to_datetime

from s3lanes.errors import InvalidArgument, InvalidRange, InvalidRequest, PreconditionFailed, S3Error

DEFAULT_CONTENT_TYPE = "binary/octet-stream"  # what S3 stores when a PUT has no Content-Type
MAX_PART_NUMBER = 10_000
READ_METHODS = frozenset({"GET", "HEAD"})

# The standard HTTP headers S3 keeps with an object (from its PUT) and answers its GET/HEAD with.
CONTENT_HEADERS = (
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
)

# Query parameter -> the response header it overrides (GetObject "Overriding response header values").
RESPONSE_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("response-content-type", "content-type"),
    ("response-content-language", "content-language"),
    ("response-expires", "expires"),
    ("response-cache-control", "cache-control"),
    ("response-content-disposition", "content-disposition"),
    ("response-content-encoding", "content-encoding"),
)

# Headers plan_read computes itself; a StoredObject may not carry them among its stored headers.
_GENERATED_HEADERS = frozenset(
    {
        "accept-ranges",
        "content-length",
        "content-range",
        "content-type",
        "etag",
        "last-modified",
        "x-amz-mp-parts-count",
        "x-amz-tagging-count",
    }
)
_CHECKSUM_PREFIX = "x-amz-checksum-"

# RFC 7233 byte-range-spec / suffix-byte-range-spec. ASCII digits only: int() also takes "+1" or "1_0".
_RANGE_RE = re.compile(r"([0-9]*)-([0-9]*)", re.ASCII)
_PART_NUMBER_RE = re.compile(r"[0-9]+", re.ASCII)
# Control characters a decoded query value could smuggle into a response header (CR/LF injection).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class InvalidPartNumber(S3Error):
    """``partNumber`` names a part the object does not have (S3 answers 416, like an unsatisfiable range)."""

    code = "InvalidPartNumber"
    status = 416
    default_message = "The requested partnumber is not satisfiable"


@dataclass(frozen=True, slots=True)
class StoredObject:
    """What the spool knows about an object: its size, identity and the headers a GET returns.

    ``headers`` are the stored response headers with lower-case names (x-amz-meta-*, content-encoding,
    cache-control, x-amz-checksum-* ...). It is *not* a place for the headers :func:`plan_read` computes
    (Content-Type, Content-Length, ETag, Last-Modified ...): those come from the other fields.
    """

    size: int
    etag: str  # quoted: '"<md5hex>"' or '"<hex>-<n>"'
    last_modified: float  # epoch seconds; HTTP shows (and compares) whole seconds
    content_type: str  # DEFAULT_CONTENT_TYPE if the PUT had none
    headers: tuple[tuple[str, str], ...]
    tag_count: int = 0
    part_sizes: tuple[int, ...] = ()  # multipart: the client's part sizes in order; empty for a single PUT

    def __post_init__(self) -> None:
        if self.size < 0 or self.tag_count < 0:
            raise ValueError(f"negative size or tag count: {self.size}, {self.tag_count}")
        if self.part_sizes:
            if len(self.part_sizes) > MAX_PART_NUMBER or any(n < 0 for n in self.part_sizes):
                raise ValueError(f"invalid part sizes for a multipart object: {len(self.part_sizes)} parts")
            if sum(self.part_sizes) != self.size:
                raise ValueError(f"part sizes add up to {sum(self.part_sizes)}, not the size {self.size}")
        for name, _ in self.headers:
            if name != name.lower() or name in _GENERATED_HEADERS:
                raise ValueError(f"stored header {name!r} is not lower-case or is one plan_read computes")


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """The answer to a GET/HEAD: status, the span of the object to send, and every response header.

    ``length`` is the body a GET sends; a HEAD gets the same plan and the shell sends no body. Headers do
    not include x-amz-request-id and Date, which the shell adds to every response.
    """

    status: int  # 200, 206 or 304
    start: int
    length: int
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class _Span:
    start: int
    length: int
    content_range: str | None  # None: the response is a 200 (or a part that has no bytes to name)


def plan_read(
    obj: StoredObject, method: str, headers: Mapping[str, str], query: Mapping[str, str], now: float
) -> ReadPlan:
    """Decide the response to GET/HEAD ``obj``. ``headers`` have lower-case names; ``query`` is decoded.

    Raises InvalidArgument/InvalidRequest (400), PreconditionFailed (412), InvalidRange and
    InvalidPartNumber (416). A 304 is a plan, not an error.
    """
    if method not in READ_METHODS:
        raise ValueError(f"plan_read() plans GET and HEAD, not {method}")
    part_number = _parse_part_number(query.get("partNumber"))
    range_header = headers.get("range")
    if part_number is not None and range_header is not None:
        # Choice: any Range header counts, even one that would otherwise be ignored as malformed.
        raise InvalidRequest("Cannot specify both Range header and partNumber query parameter")
    overrides = _overrides(query)

    etag = obj.etag
    last_modified_s = math.floor(obj.last_modified)
    last_modified = formatdate(last_modified_s, usegmt=True)
    if _not_modified(obj.etag, last_modified_s, headers, now):
        # Choice (the brief's, and what S3 is seen to send): only the validators, no entity headers.
        return ReadPlan(
            status=304, start=0, length=0, headers=(("Last-Modified", last_modified), ("ETag", etag))
        )

    span: _Span | None
    if part_number is not None:
        span = _part_span(obj, part_number)
    elif range_header is not None and method == "GET":
        span = _range_span(range_header, obj.size)
    else:
        span = None
    if span is None:
        span = _Span(start=0, length=obj.size, content_range=None)
        status = 200
    else:
        status = 206 if span.content_range is not None else 200

    # S3 sends stored checksums only with x-amz-checksum-mode: ENABLED, and never for a range (they would
    # not verify against a partial body; botocore would fail the download). A part of a multipart object
    # has its own checksum, which the spool does not keep; part 1 of a single PUT is the whole object.
    # Choice: a Range that was ignored (malformed, several ranges) is a plain 200 and gets them.
    range_applied = range_header is not None and status == 206
    whole_object = not range_applied and (part_number is None or not obj.part_sizes)
    send_checksums = whole_object and headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"

    out: list[tuple[str, str]] = [("Last-Modified", last_modified), ("ETag", etag)]
    if obj.tag_count > 0:
        out.append(("x-amz-tagging-count", str(obj.tag_count)))
    stored = [
        (name, value)
        for name, value in obj.headers
        if send_checksums or not name.startswith(_CHECKSUM_PREFIX)
    ]
    content_type = obj.content_type
    for name, value in overrides:
        if name == "content-type":
            content_type = value
            continue
        # The override replaces the stored header (and goes last); one the object lacks is added.
        stored = [(n, v) for n, v in stored if n != name]
        stored.append((name, value))
    out += stored
    if part_number is not None:
        # A single PUT is one part (the store answers a count of 1 for it too).
        out.append(("x-amz-mp-parts-count", str(len(obj.part_sizes) or 1)))
    out.append(("Accept-Ranges", "bytes"))
    if span.content_range is not None:
        out.append(("Content-Range", span.content_range))
    out.append(("Content-Type", content_type))
    out.append(("Content-Length", str(span.length)))
    return ReadPlan(status=status, start=span.start, length=span.length, headers=tuple(out))


def _parse_part_number(raw: str | None) -> int | None:
    if raw is None:
        return None
    number = int(raw) if _PART_NUMBER_RE.fullmatch(raw) else 0
    if not 1 <= number <= MAX_PART_NUMBER:
        raise InvalidArgument(
            f"Part number must be an integer between 1 and {MAX_PART_NUMBER}, inclusive",
            ArgumentName="partNumber",
            ArgumentValue=raw,
        )
    return number


def _overrides(query: Mapping[str, str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for param, header in RESPONSE_OVERRIDES:
        value = query.get(param)
        if value is None:
            continue
        if _CONTROL_RE.search(value):
            # Choice: S3's behaviour is not documented; a 400 beats a header-injection or a 500 from the
            # HTTP library refusing a newline in a header value.
            raise InvalidArgument(
                f"{param} must not contain control characters", ArgumentName=param, ArgumentValue=value
            )
        out.append((header, value))
    return out


# -- preconditions ---------------------------------------------------------------------------------------


def _not_modified(etag: str, last_modified_s: int, headers: Mapping[str, str], now: float) -> bool:
    """RFC 7232 section 6 steps 1-4: raise 412, return True for 304, False to go on."""
    if_match = _present(headers, "if-match")
    if if_match is not None:
        if not _etag_listed(etag, if_match):
            raise PreconditionFailed(Condition="If-Match")
    else:
        unmodified_since = _http_date(_present(headers, "if-unmodified-since"))
        if unmodified_since is not None and last_modified_s > unmodified_since:
            raise PreconditionFailed(Condition="If-Unmodified-Since")
    if_none_match = _present(headers, "if-none-match")
    if if_none_match is not None:
        return _etag_listed(etag, if_none_match)
    modified_since = _http_date(_present(headers, "if-modified-since"))
    # RFC 7232 section 3.3 would ignore a date later than the server's clock; S3 stores (SeaweedFS, and
    # clients that send Last-Modified + 1 s) compare it plainly, so the gateway does too: 304.
    return modified_since is not None and last_modified_s <= modified_since


def _present(headers: Mapping[str, str], name: str) -> str | None:
    """The header's value, or None if absent or blank (choice: a blank conditional header is ignored)."""
    value = headers.get(name)
    if value is None or not value.strip():
        return None
    return value


def _etag_listed(etag: str, header: str) -> bool:
    """Whether ``header`` (``*`` or a comma-separated list of entity tags) lists ``etag``.

    Lenient like S3: quotes are optional and a weak ``W/`` prefix is ignored (so If-Match compares weakly).
    """
    wanted = _opaque(etag)
    for element in header.split(","):
        tag = element.strip()
        if tag == "*":
            return True
        if tag and _opaque(tag) == wanted:
            return True
    return False


def _opaque(tag: str) -> str:
    tag = tag.removeprefix("W/")
    if len(tag) >= 2 and tag.startswith('"') and tag.endswith('"'):
        return tag[1:-1]
    return tag


def _http_date(value: str | None) -> int | None:
    """Epoch seconds of an HTTP date (IMF-fixdate, RFC 850, asctime), or None if absent or unparsable."""
    if value is None:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:  # asctime and "-0000" carry no zone; HTTP dates are always GMT
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return math.floor(parsed.timestamp())
    except (OverflowError, ValueError, OSError):  # pragma: no cover - parsed dates lie within years 1-9999
        return None


# -- byte spans ------------------------------------------------------------------------------------------


def _part_span(obj: StoredObject, part_number: int) -> _Span:
    if not obj.part_sizes:
        # A single PUT is one part: part 1 is the whole object, served as a 206 with a Content-Range (as
        # S3 does). Choice: an empty object has no range to name, so it is a plain 200.
        if part_number != 1:
            raise InvalidPartNumber(PartNumberRequested=str(part_number), ActualPartCount="1")
        return _Span(start=0, length=obj.size, content_range=_content_range(0, obj.size, obj.size))
    if part_number > len(obj.part_sizes):
        raise InvalidPartNumber(
            PartNumberRequested=str(part_number), ActualPartCount=str(len(obj.part_sizes))
        )
    start = sum(obj.part_sizes[: part_number - 1])
    length = obj.part_sizes[part_number - 1]
    # Choice: an empty part (possible only as the last or only part) cannot be named by a Content-Range.
    return _Span(start=start, length=length, content_range=_content_range(start, length, obj.size))


def _content_range(start: int, length: int, size: int) -> str | None:
    return f"bytes {start}-{start + length - 1}/{size}" if length > 0 else None


def _range_span(header: str, size: int) -> _Span | None:
    """The span of a single byte range, None when S3 ignores the header, InvalidRange if unsatisfiable.

    S3 ignores (answers 200 with the whole object) what it cannot parse as one byte range: other units,
    several ranges (S3 does not serve multipart/byteranges: it sends the whole object with 200), and garbage
    (RFC 7233 section 3.1 lets a server ignore Range); ``a-b`` with b < a is 416, as the store answers it.
    Choices the docs do not settle:
    the unit name is case-insensitive (RFC 7233 section 2), whitespace around the value and around the
    ``=`` is tolerated, and any comma makes it a multi-range header, even with empty list elements.
    """
    unit, sep, spec = header.partition("=")
    if not sep or unit.strip().lower() != "bytes":
        return None
    match = _RANGE_RE.fullmatch(spec.strip())
    if match is None:
        return None
    first_raw, last_raw = match.groups()
    if not first_raw and not last_raw:
        return None
    if first_raw and last_raw and int(last_raw) < int(first_raw):
        # RFC 7233 would ignore it; the store (SeaweedFS) answers 416, and a spooled object as the store.
        raise InvalidRange(RangeRequested=header, ActualObjectSize=str(size))

    if first_raw:
        start = int(first_raw)
        satisfiable = start < size
        end = min(int(last_raw), size - 1) if last_raw else size - 1
    else:
        suffix = int(last_raw)
        satisfiable = suffix > 0 and size > 0
        start = max(size - suffix, 0)
        end = size - 1
    if not satisfiable:
        raise InvalidRange(RangeRequested=header, ActualObjectSize=str(size))
    length = end - start + 1
    return _Span(start=start, length=length, content_range=_content_range(start, length, size))


# -- conditional writes ----------------------------------------------------------------------------------


def check_write_preconditions(current_etag: str | None, headers: Mapping[str, str]) -> None:
    """If-Match / If-None-Match of a PutObject or CompleteMultipartUpload against the object now at the key
    (``current_etag``, quoted; None if there is none). Raises PreconditionFailed (412) as the store does:
    If-None-Match ``*`` (or a listed ETag) when the object exists; If-Match when it does not list the
    object's ETag, and also when there is no object (AWS answers 404 NoSuchKey there; the store, SeaweedFS,
    412: the gateway follows the store). Blank headers are ignored, as on reads."""
    if_match = _present(headers, "if-match")
    if if_match is not None and (current_etag is None or not _etag_listed(current_etag, if_match)):
        raise PreconditionFailed(Condition="If-Match")
    if_none_match = _present(headers, "if-none-match")
    if if_none_match is not None and current_etag is not None and _etag_listed(current_etag, if_none_match):
        raise PreconditionFailed(Condition="If-None-Match")


def has_write_preconditions(headers: Mapping[str, str]) -> bool:
    return _present(headers, "if-match") is not None or _present(headers, "if-none-match") is not None


# -- copy ranges (UploadPartCopy) ------------------------------------------------------------------------

_COPY_RANGE_RE = re.compile(r"bytes=([0-9]+)-([0-9]+)", re.ASCII)


def parse_copy_range(header: str) -> tuple[int, int]:
    """``x-amz-copy-source-range``: only ``bytes=first-last`` with first <= last (S3 documents no other
    form; suffix and open ranges are refused). Returns (first, last); raises InvalidRange (416), as the store
    (SeaweedFS) answers any other value. Not clamped: see :func:`copy_range_span`."""
    match = _COPY_RANGE_RE.fullmatch(header.strip())
    if match is None or len(match.group(1)) > 19 or len(match.group(2)) > 19:
        raise InvalidRange(RangeRequested=header)
    first, last = int(match.group(1)), int(match.group(2))
    if last < first:
        raise InvalidRange(RangeRequested=header)
    return first, last


def copy_range_span(header: str, size: int) -> tuple[int, int]:
    """(start, length) of a copy range within a source of ``size`` bytes. A range that reaches past the
    end is refused with InvalidRange (416), as the store does, rather than clamped as a GET Range is."""
    first, last = parse_copy_range(header)
    if last >= size:
        raise InvalidRange(RangeRequested=header, ActualObjectSize=str(size))
    return first, last - first + 1


# -- GetObjectAttributes ---------------------------------------------------------------------------------

_ATTRIBUTE_NAMES = frozenset({"ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"})


def object_attributes_xml(obj: StoredObject, headers: Mapping[str, str], storage_class: str) -> bytes:
    """GetObjectAttributes' answer for ``obj``, as the store (SeaweedFS) gives it: the ETag unquoted,
    ObjectParts only for a multipart object (paged by ``x-amz-max-parts``/``x-amz-part-number-marker``),
    StorageClass, ObjectSize; no Checksum (the store answers none). Raises InvalidArgument for an empty or
    unknown ``x-amz-object-attributes``. The shell adds Last-Modified."""
    wanted = {a.strip() for a in headers.get("x-amz-object-attributes", "").split(",") if a.strip()}
    if not wanted or wanted - _ATTRIBUTE_NAMES:
        raise InvalidArgument(
            "Invalid attribute name specified.",
            ArgumentName="x-amz-object-attributes",
            ArgumentValue=headers.get("x-amz-object-attributes", ""),
        )
    out = ['<?xml version="1.0" encoding="UTF-8"?>\n<GetObjectAttributesResponse>']
    if "ETag" in wanted:
        out.append(f"<ETag>{_opaque(obj.etag)}</ETag>")
    if "ObjectParts" in wanted and obj.part_sizes:
        max_parts = _int_header(headers, "x-amz-max-parts", 1000)
        marker = _int_header(headers, "x-amz-part-number-marker", 0)
        numbers = [n for n in range(1, len(obj.part_sizes) + 1) if n > marker]
        page = numbers[:max_parts]
        out.append(
            f"<ObjectParts><IsTruncated>{'true' if len(numbers) > max_parts else 'false'}</IsTruncated>"
            f"<MaxParts>{max_parts}</MaxParts><NextPartNumberMarker>{page[-1] if page else marker}"
            f"</NextPartNumberMarker><PartNumberMarker>{marker}</PartNumberMarker>"
            f"<PartsCount>{len(obj.part_sizes)}</PartsCount>"
        )
        out += [
            f"<Part><PartNumber>{n}</PartNumber><Size>{obj.part_sizes[n - 1]}</Size></Part>" for n in page
        ]
        out.append("</ObjectParts>")
    if "StorageClass" in wanted:
        out.append(f"<StorageClass>{storage_class}</StorageClass>")
    if "ObjectSize" in wanted:
        out.append(f"<ObjectSize>{obj.size}</ObjectSize>")
    out.append("</GetObjectAttributesResponse>")
    return "".join(out).encode()


def _int_header(headers: Mapping[str, str], name: str, default: int) -> int:
    raw = headers.get(name)
    if raw is None or not raw.strip():
        return default
    if not _PART_NUMBER_RE.fullmatch(raw.strip()) or len(raw.strip()) > 9:
        raise InvalidArgument(f"Invalid {name} value.", ArgumentName=name, ArgumentValue=raw)
    return int(raw.strip())
