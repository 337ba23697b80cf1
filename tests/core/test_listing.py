"""ListObjects over backend + spool: a model of S3 listing, real backend bodies, botocore reading our XML."""

from __future__ import annotations

import base64
import functools
import random
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import botocore.handlers
import botocore.parsers
import botocore.session
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s3lanes.core.listing import (
    MAX_KEYS_LIMIT,
    S3_XMLNS,
    BackendListing,
    ListEntry,
    ListPage,
    ListRequest,
    NotOurToken,
    continues_our_listing,
    decode_token,
    encode_key,
    encode_prefix,
    encode_token,
    merge_page,
    parse_backend_listing,
    parse_list_request,
    prefixes_to_expand,
    render_list_xml,
)
from s3lanes.errors import InvalidArgument
from tests.budget import examples

T0 = 1_790_000_000.0


def backend_entry(key: str) -> ListEntry:
    return ListEntry(key, size=len(key.encode()), etag=f'"b{len(key)}"', last_modified=T0, owner_id="weed")


def spool_entry(key: str) -> ListEntry:
    return ListEntry(key, size=1000 + len(key), etag=f'"s{len(key)}-2"', last_modified=T0 + 60.5)


def request(**query: str) -> ListRequest:
    return parse_list_request({k.replace("_", "-"): v for k, v in query.items()})


# -- botocore as the client -----------------------------------------------------------------------------


@functools.cache
def s3_model() -> Any:
    return botocore.session.get_session().get_service_model("s3")


def botocore_parse(version: int, body: bytes) -> dict[str, Any]:
    """What boto3 hands its caller: the rest-xml parse, then the encoding-type=url decoding it applies when
    it set encoding-type itself (its default for list_objects and list_objects_v2)."""
    operation = s3_model().operation_model("ListObjectsV2" if version == 2 else "ListObjects")
    response = {"body": body, "headers": {}, "status_code": 200}
    parsed: dict[str, Any] = botocore.parsers.create_parser("rest-xml").parse(
        response, operation.output_shape
    )
    decode = botocore.handlers.decode_list_object_v2 if version == 2 else botocore.handlers.decode_list_object
    decode(parsed=parsed, context={"encoding_type_auto_set": True})
    return parsed


def parsed_keys(parsed: Mapping[str, Any]) -> list[str]:
    return [c["Key"] for c in parsed.get("Contents", [])]


def parsed_prefixes(parsed: Mapping[str, Any]) -> list[str]:
    return [p["Prefix"] for p in parsed.get("CommonPrefixes", [])]


# -- the model ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    backend: dict[str, ListEntry]
    spool: dict[str, ListEntry]
    hidden: frozenset[str]
    prefix: str
    delimiter: str
    max_keys: int
    start: str
    version: int
    url: bool

    def base_query(self) -> dict[str, str]:
        query = {"prefix": self.prefix, "max-keys": str(self.max_keys)}
        if self.delimiter:
            query["delimiter"] = self.delimiter
        if self.url:
            query["encoding-type"] = "url"
        if self.version == 2:
            query["list-type"] = "2"
            if self.start:
                query["start-after"] = self.start
        elif self.start:
            query["marker"] = self.start
        return query


# Keys are paths: segments joined by the delimiters under test, so prefixes share directories and roll up.
# Multi-byte characters on purpose: S3 orders by UTF-8 bytes ('é' is 2 bytes, the emoji 4).
SEGMENTS = ["a", "b", "ab", "é", "😀", "a b", "+", "%"]
random_keys = st.text(alphabet=["a", "b", "/", "-", "é", "😀", " ", "+"], min_size=1, max_size=5)


@st.composite
def path_keys(draw: st.DrawFn) -> str:
    segments = draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3))
    key = segments[0]
    for segment in segments[1:]:
        key += draw(st.sampled_from(["/", "-"])) + segment
    return key + draw(st.sampled_from(["", "", "", "/"]))


keys_st = st.one_of(path_keys(), path_keys(), random_keys)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    backend_keys = draw(st.sets(keys_st, max_size=16))
    spool_keys = draw(st.sets(keys_st, max_size=6))
    if backend_keys:  # overlap: spooled new versions of backend keys
        spool_keys |= draw(st.sets(st.sampled_from(sorted(backend_keys)), max_size=4))
    deletable = sorted(backend_keys - spool_keys)
    hidden: set[str] = set()
    if deletable:
        hidden |= draw(st.sets(st.sampled_from(deletable), max_size=6))
        # Whole subtrees deleted in the spool: what leaves a backend common prefix with nothing visible.
        for root, cut in draw(st.lists(st.tuples(st.sampled_from(deletable), st.integers(1, 3)), max_size=2)):
            hidden |= {k for k in deletable if k.startswith(root[:cut])}
    hidden |= draw(st.sets(keys_st, max_size=2)) - spool_keys  # tombstones the backend does not have
    # Starts that matter: none, an existing key, or a key cut short (often a common prefix, or inside one).
    known = sorted(backend_keys | spool_keys)
    start = draw(
        st.one_of(
            st.just(""),
            random_keys,
            *(
                [
                    st.sampled_from(known),
                    st.tuples(st.sampled_from(known), st.integers(1, 4)).map(lambda kn: kn[0][: kn[1]]),
                ]
                if known
                else []
            ),
        )
    )
    return Scenario(
        backend={k: backend_entry(k) for k in backend_keys},
        spool={k: spool_entry(k) for k in spool_keys},
        hidden=frozenset(hidden),
        prefix=draw(st.sampled_from(["", "", "", "a", "a/", "a-", "b", "é/"])),
        delimiter=draw(st.sampled_from(["", "/", "/", "-"])),
        max_keys=draw(st.integers(1, 7)),
        start=start,
        version=draw(st.sampled_from([1, 2])),
        url=draw(st.booleans()),
    )


def path_order(item: str) -> tuple[str, ...]:
    """The order of a depth-first walk of a directory tree whose entries are sorted by name: by segments."""
    return tuple(item.split("/"))


def reference_listing(s: Scenario) -> list[tuple[str, ListEntry | None]]:
    """The store's answer for the union of backend and spool, computed naively: visible keys = (backend -
    hidden) | spool, filtered by the prefix, rolled up by the delimiter, in the order of SeaweedFS's
    depth-first walk of its directory tree, after the start. (key, entry) or (prefix, None).

    After a start M: what the walk meets after M, except M's own directory M/ (the walk continues after
    the entry M, subtree and all) unless M names the directory itself (ends in "/")."""
    visible = {k: e for k, e in s.backend.items() if k not in s.hidden} | s.spool
    items: dict[str, ListEntry | None] = {}
    for key, entry in visible.items():
        if not key.startswith(s.prefix):
            continue
        rest = key[len(s.prefix) :]
        if s.delimiter and s.delimiter in rest:
            items[s.prefix + rest[: rest.index(s.delimiter) + len(s.delimiter)]] = None
        else:
            items[key] = entry
    walk = sorted(items, key=path_order)
    if s.start:
        walk = [i for i in walk if path_order(i) > path_order(s.start)]
        if not s.start.endswith("/"):
            walk = [i for i in walk if not i.startswith(s.start + "/")]
    return [(i, items[i]) for i in walk]


def backend_answer(s: Scenario, rng: random.Random) -> tuple[list[ListEntry], list[str]]:
    """What the backend lists for the prefix with the delimiter (all of it), in an arbitrary order."""
    entries: list[ListEntry] = []
    prefixes: set[str] = set()
    for key, entry in s.backend.items():
        if not key.startswith(s.prefix):
            continue
        rest = key[len(s.prefix) :]
        if s.delimiter and s.delimiter in rest:
            prefixes.add(s.prefix + rest[: rest.index(s.delimiter) + len(s.delimiter)])
        else:
            entries.append(entry)
    ordered = sorted(prefixes)
    rng.shuffle(entries)
    rng.shuffle(ordered)
    return entries, ordered


def shell_page(s: Scenario, req: ListRequest, rng: random.Random) -> ListPage:
    """What the shell does per client page: read the backend, expand prefixes holding tombstones, merge."""
    entries, prefixes = backend_answer(s, rng)
    for prefix in prefixes_to_expand(req, prefixes, s.hidden):
        prefixes.remove(prefix)
        entries += [e for k, e in s.backend.items() if k.startswith(prefix)]
    rng.shuffle(entries)
    spool = list(s.spool.values())
    rng.shuffle(spool)
    return merge_page(req, entries, prefixes, spool, s.hidden)


def page_items(page: ListPage) -> list[tuple[str, ListEntry | None]]:
    items: list[tuple[str, ListEntry | None]] = [(e.key, e) for e in page.entries]
    items += [(p, None) for p in page.common_prefixes]
    return sorted(items, key=lambda item: path_order(item[0]))


@settings(max_examples=examples(1000), deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_paging_to_the_end_lists_exactly_the_merged_view_once(s: Scenario, rng: random.Random) -> None:
    """A client paging as botocore's paginator does (the token, or NextMarker / last key, parsed by
    botocore out of our XML) sees what the store lists for the union of backend and spool: every item
    once, in the store's order, pages within max-keys (one over where a key K and its prefix K/ are one
    entry of the store), spooled versions winning, tombstoned keys and prefixes gone."""
    expected = reference_listing(s)
    query = s.base_query()
    seen: list[tuple[str, ListEntry | None]] = []
    for _ in range(len(expected) + 2):
        req = parse_list_request(query)
        page = shell_page(s, req, rng)
        items = page_items(page)
        assert len(items) == page.key_count <= s.max_keys + 1
        assert page.entries == [e for _, e in items if e is not None]  # each list already in order
        # Common prefixes as the store sorts them: by bytes, the delimiter first.
        prefixes = [k for k, e in items if e is None]
        if s.delimiter:
            prefixes.sort(key=lambda p: p.replace(s.delimiter, "\0").encode())
        assert page.common_prefixes == prefixes
        seen += items

        parsed = botocore_parse(s.version, render_list_xml(req, "bkt", page))
        assert parsed_keys(parsed) == [e.key for e in page.entries]
        assert parsed_prefixes(parsed) == page.common_prefixes
        assert parsed["IsTruncated"] is page.is_truncated
        if not page.is_truncated:
            break
        if s.version == 2:
            assert parsed["KeyCount"] == page.key_count
            query = {**s.base_query(), "continuation-token": parsed["NextContinuationToken"]}
        else:
            # NextMarker as sent: the store sends it unencoded also under encoding-type=url, and so does
            # the merge; botocore url-decodes it then, which mangles a "+" or "%" in it (as against the
            # store).
            marker = ET.fromstring(render_list_xml(req, "bkt", page)).findtext(f"{{{S3_XMLNS}}}NextMarker")
            assert marker
            query = {**s.base_query(), "marker": marker}
    else:
        pytest.fail("the listing did not end")
    assert seen == expected


@settings(max_examples=examples(100), deadline=None)
@given(scenarios(), st.randoms(use_true_random=False), st.randoms(use_true_random=False))
def test_backend_order_does_not_change_the_page(
    s: Scenario, rng1: random.Random, rng2: random.Random
) -> None:
    req = parse_list_request(s.base_query())
    assert shell_page(s, req, rng1) == shell_page(s, req, rng2)


def test_reference_order_is_utf8_byte_order_not_utf16() -> None:
    # U+FF5E (3 UTF-8 bytes) sorts before U+1F600 (4 bytes) by bytes and by code point, but after it in
    # UTF-16 (Java/JS string order), which is the mistake this pins.
    keys = ["\U0001f600", "\uff5e", "a", "é"]
    req = request(list_type="2")
    page = merge_page(req, [backend_entry(k) for k in keys], [], [], set())
    assert [e.key for e in page.entries] == sorted(keys, key=str.encode) == ["a", "é", "\uff5e", "\U0001f600"]


# -- merge_page, case by case ---------------------------------------------------------------------------


def keys_of(page: ListPage) -> list[str]:
    return [e.key for e in page.entries]


def test_spooled_version_wins_over_the_backend_entry() -> None:
    page = merge_page(request(), [backend_entry("k"), backend_entry("j")], [], [spool_entry("k")], set())
    assert page.entries == [backend_entry("j"), spool_entry("k")]


def test_tombstoned_backend_keys_are_hidden() -> None:
    page = merge_page(request(), [backend_entry("gone"), backend_entry("kept")], [], [], {"gone"})
    assert keys_of(page) == ["kept"]


def test_spooled_keys_outside_the_prefix_are_ignored() -> None:
    page = merge_page(request(prefix="p/"), [], [], [spool_entry("p/in"), spool_entry("q/out")], set())
    assert keys_of(page) == ["p/in"]


def test_spooled_keys_roll_up_into_common_prefixes_deduplicated_with_the_backend() -> None:
    page = merge_page(
        request(prefix="p/", delimiter="/"),
        [backend_entry("p/top")],
        ["p/dir/"],
        [spool_entry("p/dir/new"), spool_entry("p/other/x/y"), spool_entry("p/z")],
        set(),
    )
    assert keys_of(page) == ["p/top", "p/z"]
    assert page.common_prefixes == ["p/dir/", "p/other/"]
    assert page.key_count == 4


def test_multi_character_delimiter() -> None:
    page = merge_page(request(delimiter="--"), [], [], [spool_entry("a-b"), spool_entry("a--b--c")], set())
    assert keys_of(page) == ["a-b"]
    assert page.common_prefixes == ["a--"]


def test_a_start_inside_a_common_prefix_does_not_repeat_it() -> None:
    backend = [backend_entry(k) for k in ["a/1", "a/2", "b"]]
    after_prefix = merge_page(request(delimiter="/", marker="a/"), backend, [], [], set())
    inside_prefix = merge_page(request(delimiter="/", marker="a/1"), backend, [], [], set())
    before_prefix = merge_page(request(delimiter="/", marker="0"), backend, [], [], set())
    assert (after_prefix.common_prefixes, keys_of(after_prefix)) == ([], ["b"])
    assert (inside_prefix.common_prefixes, keys_of(inside_prefix)) == ([], ["b"])
    assert (before_prefix.common_prefixes, keys_of(before_prefix)) == (["a/"], ["b"])


def test_a_start_naming_a_directory_skips_it_as_the_store_does() -> None:
    # SeaweedFS keeps a/b and a/b/c as a directory entry b (with content) holding c: a listing continued
    # after a/b continues after that entry, subtree and all; after a/b/ it continues inside it.
    backend = [backend_entry(k) for k in ["a", "a/b", "a/b/c", "a/c", "b"]]
    assert keys_of(merge_page(request(marker="a/b"), backend, [], [], set())) == ["a/c", "b"]
    assert keys_of(merge_page(request(marker="a/b/"), backend, [], [], set())) == ["a/b/c", "a/c", "b"]
    after_a = merge_page(request(marker="a", delimiter="/"), backend, [], [], set())
    assert (keys_of(after_a), after_a.common_prefixes) == (["b"], [])
    v2 = merge_page(request(list_type="2", start_after="a/b", prefix="a/"), backend, [], [], set())
    assert keys_of(v2) == ["a/c"]


def test_the_store_orders_by_path_segments_not_by_bytes() -> None:
    # A depth-first walk of the store's directories: "a/b" (directory a) before "a-c" and "a b/c", which
    # S3's byte order puts first ("-" and " " sort below "/").
    keys = ["a-c", "a b/c", "a/b", "a/b/c", "a"]
    page = merge_page(request(list_type="2"), [backend_entry(k) for k in keys], [], [], set())
    assert keys_of(page) == ["a", "a/b", "a/b/c", "a b/c", "a-c"]


def test_a_page_ending_on_a_directory_key_continues_inside_it() -> None:
    backend = [backend_entry(k) for k in ["a", "a/b", "c"]]
    flat = merge_page(request(max_keys="1"), backend, [], [], set())
    assert (keys_of(flat), flat.next_item) == (["a"], "a/")  # the store's NextMarker
    # With the delimiter "/", the key a and the prefix a/ are one entry of the store: one page.
    rolled = merge_page(request(max_keys="1", delimiter="/"), backend, [], [], set())
    assert (keys_of(rolled), rolled.common_prefixes, rolled.next_item) == (["a"], ["a/"], "a/")
    assert rolled.key_count == 2 and rolled.is_truncated


def test_keys_equal_to_the_start_are_excluded() -> None:
    page = merge_page(request(marker="b"), [backend_entry(k) for k in "abc"], [], [], set())
    assert keys_of(page) == ["c"]


def test_truncated_page_names_its_last_item_which_may_be_a_prefix() -> None:
    backend = [backend_entry(k) for k in ["a", "b/1", "c"]]
    page = merge_page(request(delimiter="/", max_keys="2"), backend, [], [], set())
    assert (keys_of(page), page.common_prefixes) == (["a"], ["b/"])
    assert page.is_truncated and page.next_item == "b/"
    last = merge_page(request(delimiter="/", max_keys="2", marker="b/"), backend, [], [], set())
    assert (keys_of(last), last.common_prefixes, last.is_truncated, last.next_item) == (
        ["c"],
        [],
        False,
        None,
    )


def test_a_page_that_ends_exactly_at_the_last_item_is_not_truncated() -> None:
    page = merge_page(request(max_keys="2"), [backend_entry("a"), backend_entry("b")], [], [], set())
    assert not page.is_truncated and page.next_item is None


def test_max_keys_zero_gives_an_empty_untruncated_page() -> None:
    # ceph s3-tests (written against AWS): test_bucket_list_maxkeys_zero expects IsTruncated false.
    req = request(list_type="2", max_keys="0")
    page = merge_page(req, [backend_entry("a")], ["p/"], [spool_entry("b")], set())
    assert page == ListPage([], [], is_truncated=False, next_item=None, key_count=0)
    parsed = botocore_parse(2, render_list_xml(req, "bkt", page))
    assert parsed["IsTruncated"] is False
    assert parsed["MaxKeys"] == 0
    assert "NextContinuationToken" not in parsed


def test_list_page_refuses_a_truncated_page_without_a_last_item() -> None:
    with pytest.raises(ValueError, match="last item"):
        ListPage([], [], is_truncated=True, next_item=None, key_count=0)


def test_list_page_refuses_a_key_count_that_is_not_its_keys_and_prefixes() -> None:
    with pytest.raises(ValueError, match="key_count"):
        ListPage([], ["p/"], is_truncated=False, next_item=None, key_count=0)


def test_prefixes_to_expand_names_visible_backend_prefixes_holding_tombstones() -> None:
    req = request(delimiter="/", marker="b")
    backend_prefixes = ["a/", "c/", "d/", "e/"]
    hidden = {"a/x", "c/x", "c/y/z", "e", "zz/q"}
    # a/ is not visible after marker "b"; d/ has no tombstone; e is a key, not under a prefix.
    assert prefixes_to_expand(req, backend_prefixes, hidden) == ["c/"]


def test_a_prefix_whose_backend_keys_are_all_tombstoned_disappears_once_expanded() -> None:
    req = request(delimiter="/")
    backend = {k: backend_entry(k) for k in ["d/x", "d/y", "f/x", "f/y"]}
    hidden = {"d/x", "d/y", "f/x"}
    prefixes = ["d/", "f/"]
    expand = prefixes_to_expand(req, prefixes, hidden)
    assert expand == ["d/", "f/"]
    entries = [e for k, e in backend.items() if any(k.startswith(p) for p in expand)]
    page = merge_page(req, entries, [p for p in prefixes if p not in expand], [], hidden)
    assert page.common_prefixes == ["f/"]


# -- tokens and requests --------------------------------------------------------------------------------


@given(st.text())
def test_token_round_trip(item: str) -> None:
    token = encode_token(item)
    assert decode_token(token) == item
    assert "=" not in token
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@pytest.mark.parametrize(
    "token",
    [
        "",
        "data/last-key.txt",  # SeaweedFS's NextContinuationToken is the raw key
        "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=",  # an AWS token
        base64.urlsafe_b64encode(b"other:thing").decode(),
        base64.urlsafe_b64encode(b"s3lanes1:\xff\xfe").decode(),  # ours in form, not UTF-8
        base64.urlsafe_b64encode(b"s3lanes2:key").decode(),
        encode_token("key")[:-1] + "!",
        encode_token("key") + "A",  # a length no base64 has
        "é",
    ],
)
def test_foreign_tokens_are_not_ours(token: str) -> None:
    with pytest.raises(NotOurToken):
        decode_token(token)


def test_request_defaults() -> None:
    assert request() == ListRequest(
        version=1,
        prefix="",
        delimiter="",
        max_keys=1000,
        start="",
        encoding_type="",
        fetch_owner=False,
        marker="",
        start_after="",
        continuation_token="",
    )


@pytest.mark.parametrize(
    ("raw", "expected"), [("0", 0), ("7", 7), ("1000", 1000), ("1001", 1000), ("5000", 1000)]
)
def test_max_keys_is_capped_at_1000(raw: str, expected: int) -> None:
    assert request(max_keys=raw).max_keys == expected == min(int(raw), MAX_KEYS_LIMIT)


@pytest.mark.parametrize("raw", ["-1", "abc", "", "1.5", " 5", "+5", "5_0", "2147483648", "9" * 5000])
def test_bad_max_keys_is_invalid_argument(raw: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        request(max_keys=raw)
    assert info.value.code == "InvalidArgument"
    assert info.value.extra["ArgumentName"] == "max-keys"


@pytest.mark.parametrize("value", ["URL", "xml", "gzip"])
def test_encoding_type_other_than_url_is_invalid_argument(value: str) -> None:
    with pytest.raises(InvalidArgument):
        request(encoding_type=value)


def test_v2_start_is_the_later_of_token_and_start_after() -> None:
    token = encode_token("m")
    assert request(list_type="2", start_after="c", continuation_token=token).start == "m"
    assert request(list_type="2", start_after="x", continuation_token=token).start == "x"
    req = request(list_type="2", start_after="c", continuation_token=token, fetch_owner="TRUE")
    assert (req.start_after, req.continuation_token, req.fetch_owner) == ("c", token, True)


def test_v2_foreign_token_is_not_ours() -> None:
    with pytest.raises(NotOurToken):
        request(list_type="2", continuation_token="data/k")


def test_v2_empty_token_starts_at_the_beginning_and_is_echoed_as_the_store_does() -> None:
    req = request(list_type="2", continuation_token="", start_after="b")
    assert (req.start, req.continuation_token, req.token_given) == ("b", "", True)
    page = merge_page(req, [ListEntry("c", 1, '"e"', 0.0)], [], [], set())
    assert "<ContinuationToken></ContinuationToken>" in render_list_xml(req, "bk", page).decode()
    assert "<ContinuationToken>" not in render_list_xml(request(list_type="2"), "bk", page).decode()


def test_each_version_ignores_the_others_parameters() -> None:
    v1 = request(marker="m", start_after="s", continuation_token="foreign", fetch_owner="true")
    assert (v1.version, v1.start, v1.marker, v1.start_after, v1.continuation_token, v1.fetch_owner) == (
        1,
        "m",
        "m",
        "",
        "",
        False,
    )
    v2 = request(list_type="2", marker="m")
    assert (v2.version, v2.start, v2.marker) == (2, "", "")


# -- backend bodies -------------------------------------------------------------------------------------

# Shaped like SeaweedFS's ListObjectsV2 answer with encoding-type=url: the directory part of a key is
# path-escaped (space as %20), the last segment query-escaped (space as '+'), a literal '+' is %2B; Go's
# encoding/xml writes quotes as &#34;.
SEAWEED_V2 = b"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bkt</Name><Prefix>data/</Prefix>\
<MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>\
<Contents><Key>data/a+b.txt</Key><LastModified>2026-12-03T06:13:52.000Z</LastModified>\
<ETag>&#34;d41d8cd98f00b204e9800998ecf8427e&#34;</ETag><Size>0</Size>\
<Owner><ID>0</ID><DisplayName>admin</DisplayName></Owner><StorageClass>STANDARD</StorageClass></Contents>\
<Contents><Key>data/caf%C3%A9%2B1</Key><LastModified>2026-12-03T06:13:53Z</LastModified>\
<ETag>"0123456789abcdef0123456789abcdef-3"</ETag><Size>15728640</Size></Contents>\
<Contents><Key>data/100%25%20sure</Key><LastModified>2026-12-03T06:13:54.250Z</LastModified>\
<ETag>abc</ETag><Size>7</Size><StorageClass>STANDARD_IA</StorageClass></Contents>\
<CommonPrefixes><Prefix>data/sub%20dir/</Prefix></CommonPrefixes>\
<CommonPrefixes><Prefix>data/%F0%9F%98%80/</Prefix></CommonPrefixes>\
<NextContinuationToken>data/100% sure</NextContinuationToken><EncodingType>url</EncodingType>\
<KeyCount>5</KeyCount></ListBucketResult>"""


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def test_parses_a_seaweedfs_v2_page_with_url_encoded_keys() -> None:
    listing = parse_backend_listing(SEAWEED_V2)
    assert listing == BackendListing(
        entries=[
            ListEntry(
                "data/a b.txt",
                0,
                '"d41d8cd98f00b204e9800998ecf8427e"',
                epoch("2026-12-03T06:13:52"),
                owner_id="0",
                owner_name="admin",
            ),
            ListEntry(
                "data/café+1", 15728640, '"0123456789abcdef0123456789abcdef-3"', epoch("2026-12-03T06:13:53")
            ),
            ListEntry(
                "data/100% sure", 7, '"abc"', epoch("2026-12-03T06:13:54.25"), storage_class="STANDARD_IA"
            ),
        ],
        common_prefixes=["data/sub dir/", "data/😀/"],
        is_truncated=True,
        next_continuation_token="data/100% sure",
    )


def test_parses_a_page_without_namespace_or_encoding_verbatim() -> None:
    body = (
        b"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a+b%20c</Key>"
        b"<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;e&quot;</ETag><Size>3</Size>"
        b"</Contents><CommonPrefixes><Prefix>p+q/</Prefix></CommonPrefixes></ListBucketResult>"
    )
    listing = parse_backend_listing(body)
    assert [e.key for e in listing.entries] == ["a+b%20c"]
    assert listing.common_prefixes == ["p+q/"]
    assert (listing.is_truncated, listing.next_continuation_token) == (False, None)


@pytest.mark.parametrize(
    "body",
    [
        b"not xml",
        b"<Error><Code>NoSuchBucket</Code></Error>",
        b"<ListBucketResult><Contents><Key>k</Key><Size>x</Size>"
        b"<LastModified>2026-01-01T00:00:00Z</LastModified></Contents></ListBucketResult>",
        b"<ListBucketResult><Contents><Key>k</Key><Size>1</Size>"
        b"<LastModified>yesterday</LastModified></Contents></ListBucketResult>",
        b"<ListBucketResult><Contents><Size>1</Size>"
        b"<LastModified>2026-01-01T00:00:00Z</LastModified></Contents></ListBucketResult>",
        b"<ListBucketResult><EncodingType>url</EncodingType><Contents><Key>%FF</Key><Size>1</Size>"
        b"<LastModified>2026-01-01T00:00:00Z</LastModified></Contents></ListBucketResult>",
        b"<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
        b"<ListBucketResult><CommonPrefixes></CommonPrefixes></ListBucketResult>",
    ],
)
def test_malformed_backend_bodies_raise_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_backend_listing(body)


# -- rendering, read back by botocore -------------------------------------------------------------------

ODD_KEYS = ["sp ace", "ünï/cødé", "100%", "a+b", "a&b", "a<b>", "q?x=1#f", "dir with space/k", "tab\tkey"]


def odd_page(req: ListRequest) -> ListPage:
    entries = [
        ListEntry(k, size=i, etag=f'"{i:032x}"', last_modified=T0 + i + 0.9, owner_id="id1", owner_name="me")
        for i, k in enumerate(ODD_KEYS)
    ]
    return merge_page(req, entries, [], [], set())


@pytest.mark.parametrize("url", [False, True])
@pytest.mark.parametrize("version", [1, 2])
def test_botocore_reads_back_odd_keys_with_a_delimiter(version: int, url: bool) -> None:
    query = {"delimiter": "/", "max-keys": "1000"} | ({"encoding-type": "url"} if url else {})
    req = parse_list_request(query | ({"list-type": "2"} if version == 2 else {}))
    page = odd_page(req)
    parsed = botocore_parse(version, render_list_xml(req, "bkt", page))

    expected_keys = sorted((k for k in ODD_KEYS if "/" not in k), key=str.encode)
    assert parsed_keys(parsed) == expected_keys
    assert parsed_prefixes(parsed) == ["dir with space/", "ünï/"]
    assert parsed["Delimiter"] == "/"
    assert parsed["IsTruncated"] is False
    assert parsed["Name"] == "bkt"
    for content, entry in zip(parsed["Contents"], page.entries, strict=True):
        assert content["Size"] == entry.size
        assert content["ETag"] == entry.etag
        assert content["StorageClass"] == "STANDARD"
        assert content["LastModified"] == datetime.fromtimestamp(int(entry.last_modified), UTC)
        # V1 always shows the owner; V2 only with fetch-owner.
        assert ("Owner" in content) is (version == 1)
    if version == 2:
        assert parsed["KeyCount"] == len(expected_keys) + 2
    if url:
        assert parsed["EncodingType"] == "url"


def test_url_encoding_is_the_stores() -> None:
    # SeaweedFS: directory segments with %20 for a space, the last segment as a query component (+), every
    # byte but A-Za-z0-9-_.~ encoded; common prefixes with %20; the echoed values as they were sent.
    req = request(list_type="2", delimiter="/", encoding_type="url", prefix="", start_after="a b")
    keys = ["b+c", "b c/d", "b%/e", "é&<", "x y"]
    page = merge_page(req, [backend_entry(k) for k in keys], [], [], set())
    root = ET.fromstring(render_list_xml(req, "bkt", page))
    ns = {"s3": S3_XMLNS}
    assert [e.text for e in root.findall("s3:Contents/s3:Key", ns)] == ["b%2Bc", "x+y", "%C3%A9%26%3C"]
    assert [e.text for e in root.findall("s3:CommonPrefixes/s3:Prefix", ns)] == ["b%20c/", "b%25/"]
    assert root.findtext("s3:StartAfter", namespaces=ns) == "a b"
    assert root.findtext("s3:Delimiter", namespaces=ns) == "/"
    assert encode_key("a b/c d") == "a%20b/c+d"
    assert encode_key("p+q/r=s&t:u@v$w,x;y~") == "p%2Bq/r%3Ds%26t%3Au%40v%24w%2Cx%3By~"
    assert encode_key("x/") == "x/"
    assert encode_prefix("m/n ") == "m/n%20"


def test_v2_truncated_page_carries_our_token_and_echoes_the_request() -> None:
    token = encode_token("a")
    req = request(list_type="2", max_keys="2", start_after="0", continuation_token=token, fetch_owner="true")
    entries = [ListEntry(k, 1, '"e"', T0, owner_id="id1", owner_name="me") for k in "abcd"]
    page = merge_page(req, entries, [], [], set())
    body = render_list_xml(req, "bkt", page)
    parsed = botocore_parse(2, body)
    assert parsed_keys(parsed) == ["b", "c"]
    assert parsed["IsTruncated"] is True
    assert decode_token(parsed["NextContinuationToken"]) == "c"
    assert parsed["ContinuationToken"] == token
    assert parsed["StartAfter"] == "0"
    assert parsed["KeyCount"] == 2
    assert parsed["MaxKeys"] == 2
    assert parsed["Contents"][0]["Owner"] == {"ID": "id1", "DisplayName": "me"}
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="')
    assert b"&quot;e&quot;" in body  # the ETag's quotes, as S3 writes them


def test_v1_next_marker_on_every_truncated_page_as_the_store_sends_it() -> None:
    entries = [backend_entry(k) for k in ["a", "b/1", "c"]]
    with_delimiter = request(delimiter="/", max_keys="2", marker="0")
    parsed = botocore_parse(
        1, render_list_xml(with_delimiter, "bkt", merge_page(with_delimiter, entries, [], [], set()))
    )
    assert (parsed["IsTruncated"], parsed["NextMarker"], parsed["Marker"]) == (True, "b/", "0")

    without = request(max_keys="2")
    parsed = botocore_parse(1, render_list_xml(without, "bkt", merge_page(without, entries, [], [], set())))
    assert parsed["IsTruncated"] is True
    assert parsed["NextMarker"] == "b/1"
    assert parsed_keys(parsed) == ["a", "b/1"]


def test_v2_without_fetch_owner_hides_the_owner_and_unknown_owners_are_omitted() -> None:
    req = request(list_type="2")
    page = merge_page(req, [backend_entry("a")], [], [], set())
    assert "Owner" not in botocore_parse(2, render_list_xml(req, "bkt", page))["Contents"][0]
    v1 = request()
    anonymous = merge_page(v1, [spool_entry("a")], [], [], set())
    assert "Owner" not in botocore_parse(1, render_list_xml(v1, "bkt", anonymous))["Contents"][0]


def test_keys_xml_cannot_carry_need_encoding_type_url() -> None:
    entries = [backend_entry("bell\x07"), backend_entry("nul\x00"), backend_entry("nonchar\ufffe")]
    plain = request(list_type="2")
    with pytest.raises(InvalidArgument, match="encoding-type=url"):
        render_list_xml(plain, "bkt", merge_page(plain, entries, [], [], set()))
    url = request(list_type="2", encoding_type="url")
    parsed = botocore_parse(2, render_list_xml(url, "bkt", merge_page(url, entries, [], [], set())))
    assert parsed_keys(parsed) == ["bell\x07", "nonchar\ufffe", "nul\x00"]


def test_carriage_return_and_tab_survive_without_encoding() -> None:
    req = request(list_type="2", prefix="p\r")
    page = merge_page(req, [backend_entry(k) for k in ["p\r\n", "p\rx\ty"]], [], [], set())
    parsed = botocore_parse(2, render_list_xml(req, "bkt", page))
    assert parsed_keys(parsed) == ["p\r\n", "p\rx\ty"]
    assert parsed["Prefix"] == "p\r"


def test_last_modified_is_whole_seconds_in_s3_form() -> None:
    req = request(list_type="2")
    page = merge_page(req, [ListEntry("k", 1, '"e"', 1_764_742_432.999)], [], [], set())
    assert b"<LastModified>2025-12-03T06:13:52.000Z</LastModified>" in render_list_xml(req, "bkt", page)


def test_continues_our_listing_only_for_a_v2_page_after_one_of_our_tokens() -> None:
    ours = encode_token("k1")
    assert continues_our_listing({"list-type": "2", "continuation-token": ours})
    assert not continues_our_listing({"continuation-token": ours})  # ListObjects (v1) has no tokens
    assert not continues_our_listing({"list-type": "2", "continuation-token": ""})
    assert not continues_our_listing({"list-type": "2"})
    assert not continues_our_listing({"list-type": "2", "continuation-token": "c3RvcmUncw"})  # the store's
