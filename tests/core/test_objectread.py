"""plan_read: S3's GetObject/HeadObject answer for a spooled object (conditions, ranges, parts, headers)."""

from __future__ import annotations

import re
from email.utils import formatdate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core.objectread import (
    DEFAULT_CONTENT_TYPE,
    InvalidPartNumber,
    ReadPlan,
    StoredObject,
    check_write_preconditions,
    copy_range_span,
    has_write_preconditions,
    object_attributes_xml,
    plan_read,
)
from s3lanes.errors import InvalidArgument, InvalidRange, InvalidRequest, PreconditionFailed, S3Error
from tests.budget import examples

LAST_MODIFIED = 1_700_000_000.75  # a fraction of a second: HTTP dates (and comparisons) use whole seconds
LM_SECOND = 1_700_000_000
NOW = LAST_MODIFIED + 10 * 86400.0  # ten days later
ETAG = '"9bb58f26192e4ba00f01e2e7b136bbd8"'
OTHER_ETAG = '"0123456789abcdef0123456789abcdef"'
SIZE = 10


def http_date(epoch_s: float) -> str:
    return formatdate(epoch_s, usegmt=True)


LM_HTTP = http_date(LM_SECOND)
BEFORE = http_date(LM_SECOND - 60)  # the object was modified after this
AT = LM_HTTP  # Last-Modified echoed back, as a client cache does
AFTER = http_date(LM_SECOND + 60)  # after the modification, still in the past relative to NOW
FUTURE = http_date(NOW + 3600)


def obj(
    size: int = SIZE,
    *,
    headers: tuple[tuple[str, str], ...] = (),
    tag_count: int = 0,
    part_sizes: tuple[int, ...] = (),
    content_type: str = DEFAULT_CONTENT_TYPE,
) -> StoredObject:
    return StoredObject(
        size=size,
        etag=ETAG,
        last_modified=LAST_MODIFIED,
        content_type=content_type,
        headers=headers,
        tag_count=tag_count,
        part_sizes=part_sizes,
    )


def get(
    stored: StoredObject | None = None,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    method: str = "GET",
) -> ReadPlan:
    return plan_read(stored or obj(), method, headers or {}, query or {}, NOW)


def header(plan: ReadPlan, name: str) -> str | None:
    values = [v for n, v in plan.headers if n.lower() == name.lower()]
    assert len(values) <= 1, f"{name} sent {len(values)} times"
    return values[0] if values else None


def names(plan: ReadPlan) -> list[str]:
    return [n.lower() for n, _ in plan.headers]


# -- preconditions ---------------------------------------------------------------------------------------

CONDITIONALS: list[tuple[str, dict[str, str], int]] = [
    # If-Match: 412 unless a listed ETag matches; "*" matches; quotes optional; W/ ignored; lists.
    ("if-match equal", {"if-match": ETAG}, 200),
    ("if-match different", {"if-match": OTHER_ETAG}, 412),
    ("if-match star", {"if-match": "*"}, 200),
    ("if-match unquoted", {"if-match": ETAG.strip('"')}, 200),
    ("if-match weak", {"if-match": "W/" + ETAG}, 200),
    ("if-match list containing", {"if-match": f"{OTHER_ETAG}, {ETAG}"}, 200),
    ("if-match list without", {"if-match": f'{OTHER_ETAG},"abc"'}, 412),
    ("if-match blank is ignored", {"if-match": "  "}, 200),
    # If-Unmodified-Since: 412 when modified after the date; unparsable dates are ignored.
    ("ius before modification", {"if-unmodified-since": BEFORE}, 412),
    ("ius at last-modified (whole second)", {"if-unmodified-since": AT}, 200),
    ("ius after modification", {"if-unmodified-since": AFTER}, 200),
    ("ius in the future", {"if-unmodified-since": FUTURE}, 200),
    ("ius unparsable", {"if-unmodified-since": "yesterday"}, 200),
    # If-Match decides alone when present (AWS: If-Match true + If-Unmodified-Since false -> 200).
    ("if-match true, ius false", {"if-match": ETAG, "if-unmodified-since": BEFORE}, 200),
    ("if-match true, ius true", {"if-match": ETAG, "if-unmodified-since": AFTER}, 200),
    ("if-match false, ius true", {"if-match": OTHER_ETAG, "if-unmodified-since": AFTER}, 412),
    ("if-match false, ius false", {"if-match": OTHER_ETAG, "if-unmodified-since": BEFORE}, 412),
    # If-None-Match: 304 when a listed ETag matches; "*" matches.
    ("inm equal", {"if-none-match": ETAG}, 304),
    ("inm different", {"if-none-match": OTHER_ETAG}, 200),
    ("inm star", {"if-none-match": "*"}, 304),
    ("inm unquoted", {"if-none-match": ETAG.strip('"')}, 304),
    ("inm weak", {"if-none-match": "W/" + ETAG}, 304),
    ("inm list containing", {"if-none-match": f"{OTHER_ETAG} , {ETAG}"}, 304),
    ("inm list without", {"if-none-match": f'{OTHER_ETAG}, W/"abc"'}, 200),
    # If-Modified-Since: 304 unless modified after the date (future dates too); unparsable ones are ignored.
    ("ims before modification", {"if-modified-since": BEFORE}, 200),
    ("ims at last-modified (whole second)", {"if-modified-since": AT}, 304),
    ("ims after modification", {"if-modified-since": AFTER}, 304),
    ("ims in the future is compared plainly, as S3 stores do", {"if-modified-since": FUTURE}, 304),
    ("ims unparsable", {"if-modified-since": "not a date"}, 200),
    ("ims rfc 850 form", {"if-modified-since": "Wednesday, 15-Nov-23 00:00:00 GMT"}, 304),
    ("ims asctime form", {"if-modified-since": "Wed Nov 15 00:00:00 2023"}, 304),
    ("ims asctime form before", {"if-modified-since": "Mon Nov 13 00:00:00 2023"}, 200),
    # If-None-Match decides alone when present (AWS: If-None-Match false + If-Modified-Since true -> 304;
    # RFC 7232 section 6 for the converse, which AWS does not document).
    ("inm false, ims true", {"if-none-match": ETAG, "if-modified-since": BEFORE}, 304),
    ("inm true, ims false", {"if-none-match": OTHER_ETAG, "if-modified-since": AFTER}, 200),
    ("inm false, ims false", {"if-none-match": ETAG, "if-modified-since": AFTER}, 304),
    ("inm true, ims true", {"if-none-match": OTHER_ETAG, "if-modified-since": BEFORE}, 200),
    # The 412 pair is evaluated before the 304 pair.
    ("if-match false beats inm match", {"if-match": OTHER_ETAG, "if-none-match": ETAG}, 412),
    ("ius false beats inm match", {"if-unmodified-since": BEFORE, "if-none-match": ETAG}, 412),
    ("ius false beats ims false", {"if-unmodified-since": BEFORE, "if-modified-since": AFTER}, 412),
    ("if-match true then inm match", {"if-match": ETAG, "if-none-match": ETAG}, 304),
    ("if-match true then ims false", {"if-match": ETAG, "if-modified-since": AFTER}, 304),
    ("ius true then inm different", {"if-unmodified-since": AFTER, "if-none-match": OTHER_ETAG}, 200),
    (
        "all four pass",
        {
            "if-match": ETAG,
            "if-unmodified-since": AFTER,
            "if-none-match": OTHER_ETAG,
            "if-modified-since": BEFORE,
        },
        200,
    ),
]


@pytest.mark.parametrize(
    ("request_headers", "expected"), [c[1:] for c in CONDITIONALS], ids=[c[0] for c in CONDITIONALS]
)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_conditional_headers_follow_rfc7232_order(
    request_headers: dict[str, str], expected: int, method: str
) -> None:
    if expected == 412:
        with pytest.raises(PreconditionFailed) as info:
            get(headers=request_headers, method=method)
        assert info.value.status == 412
        assert info.value.code == "PreconditionFailed"
        assert info.value.extra["Condition"] in ("If-Match", "If-Unmodified-Since")
    else:
        assert get(headers=request_headers, method=method).status == expected


@pytest.mark.parametrize(
    ("request_headers", "condition"),
    [({"if-match": OTHER_ETAG}, "If-Match"), ({"if-unmodified-since": BEFORE}, "If-Unmodified-Since")],
)
def test_precondition_failed_names_the_failing_condition(
    request_headers: dict[str, str], condition: str
) -> None:
    with pytest.raises(PreconditionFailed) as info:
        get(headers=request_headers)
    assert info.value.extra == {"Condition": condition}


def test_304_carries_only_the_validators_and_no_body() -> None:
    stored = obj(headers=(("x-amz-meta-a", "1"), ("cache-control", "no-cache")), tag_count=2)
    plan = get(
        stored,
        headers={"if-none-match": ETAG, "range": "bytes=0-1"},
        query={"response-content-type": "text/plain"},
    )
    assert plan == ReadPlan(
        status=304, start=0, length=0, headers=(("Last-Modified", LM_HTTP), ("ETag", ETAG))
    )


@pytest.mark.parametrize(
    "request_headers",
    [{"if-none-match": ETAG, "range": "bytes=50-"}, {"if-modified-since": AT, "range": "bytes=50-"}],
)
def test_304_wins_over_an_unsatisfiable_range(request_headers: dict[str, str]) -> None:
    assert get(headers=request_headers).status == 304


def test_412_wins_over_an_unsatisfiable_range() -> None:
    with pytest.raises(PreconditionFailed):
        get(headers={"if-match": OTHER_ETAG, "range": "bytes=50-"})


def test_if_range_is_ignored_and_the_range_applies() -> None:
    plan = get(headers={"range": "bytes=0-1", "if-range": OTHER_ETAG})
    assert (plan.status, plan.start, plan.length) == (206, 0, 2)


# -- ranges ----------------------------------------------------------------------------------------------

RANGES: list[tuple[str, int, int, str]] = [
    # header, start, length, Content-Range (object of SIZE=10 bytes)
    ("bytes=0-4", 0, 5, "bytes 0-4/10"),
    ("bytes=0-0", 0, 1, "bytes 0-0/10"),
    ("bytes=9-9", 9, 1, "bytes 9-9/10"),
    ("bytes=0-9", 0, 10, "bytes 0-9/10"),
    ("bytes=3-", 3, 7, "bytes 3-9/10"),
    ("bytes=0-", 0, 10, "bytes 0-9/10"),
    ("bytes=9-", 9, 1, "bytes 9-9/10"),
    ("bytes=-3", 7, 3, "bytes 7-9/10"),
    ("bytes=-10", 0, 10, "bytes 0-9/10"),
    ("bytes=-100", 0, 10, "bytes 0-9/10"),  # suffix longer than the object: all of it
    ("bytes=5-100", 5, 5, "bytes 5-9/10"),  # end beyond the object: clamped
    ("bytes=5-99999999999999999999999", 5, 5, "bytes 5-9/10"),
    ("bytes=007-008", 7, 2, "bytes 7-8/10"),
    ("Bytes=1-2", 1, 2, "bytes 1-2/10"),  # choice: the unit is case-insensitive (RFC 7233 section 2)
    (" bytes = 1-2 ", 1, 2, "bytes 1-2/10"),  # choice: surrounding whitespace is tolerated
]


@pytest.mark.parametrize(("range_header", "start", "length", "content_range"), RANGES)
def test_single_range_is_a_206_with_content_range(
    range_header: str, start: int, length: int, content_range: str
) -> None:
    plan = get(headers={"range": range_header})
    assert (plan.status, plan.start, plan.length) == (206, start, length)
    assert header(plan, "Content-Range") == content_range
    assert header(plan, "Content-Length") == str(length)
    assert header(plan, "x-amz-mp-parts-count") is None


UNSATISFIABLE: list[tuple[int, str]] = [
    (10, "bytes=10-"),
    (10, "bytes=10-20"),
    (10, "bytes=100-200"),
    (10, "bytes=-0"),
    (0, "bytes=0-"),
    (0, "bytes=0-0"),
    (0, "bytes=-1"),
    (0, "bytes=-0"),
    (10, "bytes=5-2"),  # last < first: RFC 7233 would ignore it; the store answers 416, so the spool does
]


@pytest.mark.parametrize(("size", "range_header"), UNSATISFIABLE)
def test_unsatisfiable_range_is_invalid_range_with_size_and_range(size: int, range_header: str) -> None:
    with pytest.raises(InvalidRange) as info:
        get(obj(size), headers={"range": range_header})
    assert info.value.status == 416
    assert info.value.code == "InvalidRange"
    assert info.value.extra == {"RangeRequested": range_header, "ActualObjectSize": str(size)}


@pytest.mark.parametrize(("size", "range_header"), [(SIZE, r) for r, _, _, _ in RANGES] + UNSATISFIABLE)
def test_head_ignores_range_as_the_store_does(size: int, range_header: str) -> None:
    """The store (SeaweedFS) answers a HEAD with Range 200 and the whole length, never 206 or 416; a
    spooled object answers the same (AWS would answer 206/416: docs/compatibility.md)."""
    plan = get(obj(size), headers={"range": range_header}, method="HEAD")
    assert (plan.status, plan.start, plan.length) == (200, 0, size)
    assert header(plan, "Content-Range") is None
    assert header(plan, "Content-Length") == str(size)


IGNORED_RANGES = [
    "bytes=0-1,3-4",  # several ranges: S3 sends the whole object with 200
    "bytes=50-60,70-80",  # several unsatisfiable ranges: still ignored, not 416
    "bytes=0-1,",  # choice: any comma makes it multi-range
    "bytes=abc",
    "bytes=",
    "bytes=-",
    "bytes=--1",
    "bytes=-1-2",
    "bytes=1_0-20",
    "bytes=+1-2",
    "bytes=1 -2",
    "bytes=\u0661-\u0662",  # non-ASCII digits
    "items=0-1",
    "0-1",
    "bytes 0-1",
    "",
]


@pytest.mark.parametrize("range_header", IGNORED_RANGES)
@pytest.mark.parametrize("size", [0, SIZE])
def test_malformed_or_multiple_ranges_are_ignored(range_header: str, size: int) -> None:
    plan = get(obj(size), headers={"range": range_header})
    assert (plan.status, plan.start, plan.length) == (200, 0, size)
    assert header(plan, "Content-Range") is None
    assert header(plan, "Content-Length") == str(size)


# -- partNumber ------------------------------------------------------------------------------------------

MULTIPART = (4, 4, 2)


@pytest.mark.parametrize(
    ("part_number", "start", "length", "content_range"),
    [
        ("1", 0, 4, "bytes 0-3/10"),
        ("2", 4, 4, "bytes 4-7/10"),
        ("3", 8, 2, "bytes 8-9/10"),
        ("03", 8, 2, "bytes 8-9/10"),
    ],
)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_part_of_a_multipart_object_is_its_byte_range(
    part_number: str, start: int, length: int, content_range: str, method: str
) -> None:
    plan = get(obj(part_sizes=MULTIPART), query={"partNumber": part_number}, method=method)
    assert (plan.status, plan.start, plan.length) == (206, start, length)
    assert header(plan, "Content-Range") == content_range
    assert header(plan, "Content-Length") == str(length)
    assert header(plan, "x-amz-mp-parts-count") == "3"


def test_multipart_object_without_part_number_has_no_parts_count() -> None:
    plan = get(obj(part_sizes=MULTIPART))
    assert (plan.status, plan.length) == (200, SIZE)
    assert header(plan, "x-amz-mp-parts-count") is None


def test_part_1_of_a_single_put_is_the_whole_object_as_206() -> None:
    plan = get(query={"partNumber": "1"})
    assert (plan.status, plan.start, plan.length) == (206, 0, SIZE)
    assert header(plan, "Content-Range") == "bytes 0-9/10"
    assert header(plan, "x-amz-mp-parts-count") == "1"  # one part, as the store answers


def test_part_1_of_an_empty_single_put_is_a_200() -> None:
    # Choice: no Content-Range can name zero bytes of a zero-byte object.
    plan = get(obj(0), query={"partNumber": "1"})
    assert (plan.status, plan.start, plan.length) == (200, 0, 0)
    assert header(plan, "Content-Range") is None
    assert header(plan, "Content-Length") == "0"


def test_empty_part_of_a_multipart_object_is_a_200_with_parts_count() -> None:
    # Choice: as above, an empty part has no Content-Range.
    plan = get(obj(4, part_sizes=(4, 0)), query={"partNumber": "2"})
    assert (plan.status, plan.start, plan.length) == (200, 4, 0)
    assert header(plan, "Content-Range") is None
    assert header(plan, "x-amz-mp-parts-count") == "2"


@pytest.mark.parametrize(
    ("part_sizes", "part_number", "count"),
    [(MULTIPART, "4", "3"), (MULTIPART, "10000", "3"), ((), "2", "1"), ((), "10000", "1")],
)
def test_part_beyond_the_last_is_invalid_part_number(
    part_sizes: tuple[int, ...], part_number: str, count: str
) -> None:
    with pytest.raises(InvalidPartNumber) as info:
        get(obj(part_sizes=part_sizes), query={"partNumber": part_number})
    assert (info.value.status, info.value.code) == (416, "InvalidPartNumber")
    assert info.value.message == "The requested partnumber is not satisfiable"
    assert info.value.extra == {"PartNumberRequested": part_number, "ActualPartCount": count}


@pytest.mark.parametrize("part_number", ["0", "10001", "-1", "abc", "", "1.5", " 1", "+1", "\u0661"])
def test_part_number_outside_1_to_10000_is_invalid_argument(part_number: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        get(obj(part_sizes=MULTIPART), query={"partNumber": part_number})
    assert info.value.status == 400
    assert info.value.extra == {"ArgumentName": "partNumber", "ArgumentValue": part_number}


@pytest.mark.parametrize("range_header", ["bytes=0-1", "bytes=100-", "garbage"])
def test_part_number_with_range_is_invalid_request(range_header: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        get(obj(part_sizes=MULTIPART), headers={"range": range_header}, query={"partNumber": "1"})
    assert info.value.status == 400
    assert info.value.message == "Cannot specify both Range header and partNumber query parameter"


def test_argument_errors_come_before_preconditions() -> None:
    with pytest.raises(InvalidRequest):
        get(headers={"range": "bytes=0-1", "if-match": OTHER_ETAG}, query={"partNumber": "1"})
    with pytest.raises(InvalidArgument):
        get(headers={"if-none-match": ETAG}, query={"partNumber": "0"})


def test_preconditions_come_before_part_number_range() -> None:
    assert (
        get(obj(part_sizes=MULTIPART), headers={"if-none-match": ETAG}, query={"partNumber": "9"}).status
        == 304
    )


# -- response headers ------------------------------------------------------------------------------------

STORED_HEADERS = (
    ("x-amz-meta-owner", "team-a"),
    ("content-encoding", "gzip"),
    ("content-disposition", 'attachment; filename="a.bin"'),
    ("cache-control", "max-age=60"),
    ("x-amz-storage-class", "STANDARD"),
)


def test_plain_get_sends_every_header_in_order() -> None:
    plan = get(obj(headers=STORED_HEADERS, tag_count=3, content_type="application/x-tar"))
    assert plan == ReadPlan(
        status=200,
        start=0,
        length=SIZE,
        headers=(
            ("Last-Modified", LM_HTTP),
            ("ETag", ETAG),
            ("x-amz-tagging-count", "3"),
            *STORED_HEADERS,
            ("Accept-Ranges", "bytes"),
            ("Content-Type", "application/x-tar"),
            ("Content-Length", str(SIZE)),
        ),
    )


def test_last_modified_is_the_whole_second_as_an_http_date() -> None:
    assert header(get(), "Last-Modified") == "Tue, 14 Nov 2023 22:13:20 GMT"


def test_tagging_count_only_when_tagged() -> None:
    assert "x-amz-tagging-count" not in names(get(obj(tag_count=0)))
    assert header(get(obj(tag_count=1)), "x-amz-tagging-count") == "1"


def test_default_content_type_is_s3s() -> None:
    assert header(get(), "Content-Type") == "binary/octet-stream"


OVERRIDES = [
    ("response-content-type", "Content-Type", "text/csv"),
    ("response-content-language", "content-language", "de"),
    ("response-expires", "expires", "Thu, 01 Dec 1994 16:00:00 GMT"),
    ("response-cache-control", "cache-control", "no-store"),
    ("response-content-disposition", "content-disposition", "inline"),
    ("response-content-encoding", "content-encoding", "identity"),
]


@pytest.mark.parametrize(("param", "name", "value"), OVERRIDES)
def test_response_override_replaces_or_adds_the_header(param: str, name: str, value: str) -> None:
    plan = get(obj(headers=STORED_HEADERS), query={param: value})
    assert header(plan, name) == value  # header() also asserts it is sent once
    others = [(n, v) for n, v in plan.headers if n.lower() != name.lower()]
    expected_others = [
        (n, v) for n, v in get(obj(headers=STORED_HEADERS)).headers if n.lower() != name.lower()
    ]
    assert others == expected_others


def test_all_overrides_together_on_a_range() -> None:
    plan = get(
        obj(headers=STORED_HEADERS), headers={"range": "bytes=1-2"}, query={p: v for p, _, v in OVERRIDES}
    )
    assert plan.status == 206
    for _, name, value in OVERRIDES:
        assert header(plan, name) == value


def test_unrelated_query_parameters_are_ignored() -> None:
    assert get(query={"versionId": "null", "x-id": "GetObject"}) == get()


@pytest.mark.parametrize("value", ["text/plain\r\nx-evil: 1", "a\nb", "a\x00b"])
def test_override_with_control_characters_is_invalid_argument(value: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        get(query={"response-content-type": value})
    assert info.value.extra["ArgumentName"] == "response-content-type"


CHECKSUMS = (("x-amz-checksum-crc32", "AAAAAA=="), ("x-amz-checksum-type", "FULL_OBJECT"))


@pytest.mark.parametrize(
    ("request_headers", "query", "part_sizes", "sent"),
    [
        ({"x-amz-checksum-mode": "ENABLED"}, {}, (), True),
        ({"x-amz-checksum-mode": "enabled"}, {}, (), True),
        ({}, {}, (), False),
        ({"x-amz-checksum-mode": "ENABLED", "range": "bytes=0-1"}, {}, (), False),
        ({"x-amz-checksum-mode": "ENABLED", "range": "bytes=0-"}, {}, (), False),
        ({"x-amz-checksum-mode": "ENABLED", "range": "bytes=0-1,3-4"}, {}, (), True),
        ({"x-amz-checksum-mode": "ENABLED"}, {"partNumber": "1"}, (), True),
        ({"x-amz-checksum-mode": "ENABLED"}, {"partNumber": "1"}, MULTIPART, False),
        ({"x-amz-checksum-mode": "ENABLED"}, {}, MULTIPART, True),
    ],
)
def test_checksums_only_when_enabled_and_whole_object(
    request_headers: dict[str, str], query: dict[str, str], part_sizes: tuple[int, ...], sent: bool
) -> None:
    plan = get(
        obj(headers=(("x-amz-meta-a", "1"), *CHECKSUMS), part_sizes=part_sizes),
        headers=request_headers,
        query=query,
    )
    assert header(plan, "x-amz-meta-a") == "1"
    for name, value in CHECKSUMS:
        assert header(plan, name) == (value if sent else None)


@pytest.mark.parametrize(
    ("request_headers", "query"),
    [
        ({}, {}),
        ({"range": "bytes=0-1,2-3"}, {}),
        ({}, {"partNumber": "2"}),
        ({"if-none-match": ETAG}, {}),
        ({}, {"response-content-type": "a/b"}),
    ],
)
def test_head_is_planned_exactly_as_get(request_headers: dict[str, str], query: dict[str, str]) -> None:
    stored = obj(headers=STORED_HEADERS, tag_count=1, part_sizes=MULTIPART)
    assert get(stored, request_headers, query, "HEAD") == get(stored, request_headers, query, "GET")


def test_other_methods_are_a_bug() -> None:
    with pytest.raises(ValueError, match="PUT"):
        get(method="PUT")


@pytest.mark.parametrize(
    ("stored_headers", "part_sizes", "tag_count"),
    [
        ((("Content-Type", "a/b"),), (), 0),
        ((("content-type", "a/b"),), (), 0),
        ((("etag", ETAG),), (), 0),
        ((("x-amz-tagging-count", "1"),), (), 0),
        ((), (4, 4), 0),
        ((), (11, -1), 0),
        ((), (), -1),
    ],
)
def test_stored_object_rejects_inconsistent_records(
    stored_headers: tuple[tuple[str, str], ...], part_sizes: tuple[int, ...], tag_count: int
) -> None:
    with pytest.raises(ValueError):
        obj(headers=stored_headers, part_sizes=part_sizes, tag_count=tag_count)


# -- properties ------------------------------------------------------------------------------------------

_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
sizes = st.integers(min_value=0, max_value=2**50)
positions = st.integers(min_value=0, max_value=2**51)


def check_consistent(plan: ReadPlan, size: int) -> None:
    assert plan.start >= 0 and plan.start + plan.length <= size
    assert header(plan, "Content-Length") == str(plan.length)
    content_range = header(plan, "Content-Range")
    if plan.status == 206:
        assert content_range is not None
        match = _CONTENT_RANGE_RE.fullmatch(content_range)
        assert match is not None
        first, last, total = map(int, match.groups())
        assert (first, last - first + 1, total) == (plan.start, plan.length, size)
    else:
        assert plan.status == 200
        assert content_range is None


@settings(max_examples=examples(500))
@given(size=sizes, first=positions, last=st.none() | positions)
def test_any_first_last_range_is_within_the_object(size: int, first: int, last: int | None) -> None:
    if last is not None and last < first:
        last, first = first, last
    range_header = f"bytes={first}-{'' if last is None else last}"
    if first >= size:
        with pytest.raises(InvalidRange):
            get(obj(size), headers={"range": range_header})
        return
    plan = get(obj(size), headers={"range": range_header})
    assert plan.status == 206
    check_consistent(plan, size)
    assert plan.start == first
    assert plan.length == (size - first if last is None else min(last, size - 1) - first + 1)


@settings(max_examples=examples(500))
@given(size=sizes, suffix=positions)
def test_any_suffix_range_is_within_the_object(size: int, suffix: int) -> None:
    if size == 0 or suffix == 0:
        with pytest.raises(InvalidRange):
            get(obj(size), headers={"range": f"bytes=-{suffix}"})
        return
    plan = get(obj(size), headers={"range": f"bytes=-{suffix}"})
    assert plan.status == 206
    check_consistent(plan, size)
    assert plan.start + plan.length == size
    assert plan.length == min(suffix, size)


@settings(max_examples=examples(300))
@given(part_sizes=st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=30))
def test_parts_tile_the_object_in_order(part_sizes: list[int]) -> None:
    stored = obj(sum(part_sizes), part_sizes=tuple(part_sizes))
    offset = 0
    for number, part_size in enumerate(part_sizes, start=1):
        plan = get(stored, query={"partNumber": str(number)})
        check_consistent(plan, stored.size)
        assert (plan.start, plan.length) == (offset, part_size)
        offset += part_size
    assert offset == stored.size


@settings(max_examples=examples(500))
@given(
    range_header=st.text(max_size=30) | st.from_regex(r"\A[ Bbytes]{0,6}=?[-0-9, ]{0,12}\Z"),
    date=st.text(max_size=40),
    size=st.integers(min_value=0, max_value=100),
)
def test_arbitrary_headers_give_a_plan_or_an_s3_error(range_header: str, date: str, size: int) -> None:
    for name in ("if-modified-since", "if-unmodified-since", "if-match", "if-none-match"):
        try:
            plan = get(obj(size), headers={"range": range_header, name: date})
        except S3Error as error:
            assert error.status in (412, 416)
            continue
        if plan.status != 304:
            check_consistent(plan, size)


# -- conditional writes (PutObject / CompleteMultipartUpload) ----------------------------------------------


@pytest.mark.parametrize(
    ("current", "headers", "fails"),
    [
        ('"e1"', {"if-none-match": "*"}, True),
        (None, {"if-none-match": "*"}, False),
        ('"e1"', {"if-none-match": '"e1"'}, True),
        ('"e1"', {"if-none-match": '"e2"'}, False),
        ('"e1"', {"if-match": '"e1"'}, False),
        ('"e1"', {"if-match": "e1"}, False),
        ('"e1"', {"if-match": '"e2"'}, True),
        (None, {"if-match": '"e1"'}, True),  # the store answers 412 (AWS: 404 NoSuchKey)
        (None, {"if-match": "*"}, True),
        ('"e1"', {"if-match": " "}, False),  # blank: ignored
        ('"e1"', {}, False),
    ],
)
def test_write_preconditions_are_evaluated_against_the_current_object(
    current: str | None, headers: dict[str, str], fails: bool
) -> None:
    assert has_write_preconditions(headers) == any(v.strip() for v in headers.values())
    if fails:
        with pytest.raises(PreconditionFailed):
            check_write_preconditions(current, headers)
    else:
        check_write_preconditions(current, headers)


@pytest.mark.parametrize(
    ("header", "size", "span"),
    [("bytes=0-4", 10, (0, 5)), ("bytes=9-9", 10, (9, 1)), (" bytes=2-3 ", 10, (2, 2))],
)
def test_copy_range_within_the_source_is_its_span(header: str, size: int, span: tuple[int, int]) -> None:
    assert copy_range_span(header, size) == span


@pytest.mark.parametrize(
    "header",
    ["bytes=5-20", "bytes=10-12", "bytes=3-2", "bytes=-3", "bytes=0-", "items=0-1", "bytes=0-1,2-3", ""],
)
def test_copy_range_out_of_the_source_or_not_first_last_is_invalid_range_not_clamped(header: str) -> None:
    with pytest.raises(InvalidRange):
        copy_range_span(header, 10)


def test_object_attributes_of_a_multipart_object_page_its_parts_and_unquote_the_etag() -> None:
    obj = StoredObject(
        size=7, etag='"abc-2"', last_modified=0.0, content_type="x", headers=(), part_sizes=(5, 2)
    )
    xml = object_attributes_xml(
        obj, {"x-amz-object-attributes": "ETag,ObjectParts", "x-amz-max-parts": "1"}, "STANDARD"
    )
    assert b"<ETag>abc-2</ETag>" in xml
    assert b"<IsTruncated>true</IsTruncated>" in xml and b"<PartsCount>2</PartsCount>" in xml
    assert b"<Part><PartNumber>1</PartNumber><Size>5</Size></Part>" in xml and b"<PartNumber>2<" not in xml
    single = StoredObject(size=3, etag='"e"', last_modified=0.0, content_type="x", headers=())
    xml = object_attributes_xml(single, {"x-amz-object-attributes": "ObjectParts, ObjectSize"}, "STANDARD")
    assert b"ObjectParts" not in xml and b"<ObjectSize>3</ObjectSize>" in xml
    for bad in ("", "Size", "ETag,Bogus"):
        with pytest.raises(InvalidArgument):
            object_attributes_xml(single, {"x-amz-object-attributes": bad}, "STANDARD")
