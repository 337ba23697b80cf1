"""ListObjectVersions merged with the spool (s3lanes.core.listing): a spooled key is one version, "null"."""

from __future__ import annotations

import pytest

from s3lanes.core.listing import (
    NULL_VERSION,
    ListEntry,
    PartsPage,
    SpooledObject,
    VersionEntry,
    VersionsPage,
    VersionsRequest,
    add_listed_uploads,
    backend_query,
    drop_listed_uploads,
    expand_prefixes,
    list_parts_page,
    merge_versions_page,
    merged_listing_xml,
    parse_backend_listing,
    parse_backend_page,
    parse_backend_versions,
    parse_list_request,
    parse_owner,
    parse_versions_request,
    prefixes_to_expand,
    render_versions_xml,
    shows_owner,
    versions_prefixes_to_expand,
)
from s3lanes.errors import InvalidArgument

T0 = 1_790_000_000.0


def v(key: str, vid: str = NULL_VERSION, latest: bool = True, etag: str = '"b"') -> VersionEntry:
    return VersionEntry(ListEntry(key, 1, etag, T0), version_id=vid, is_latest=latest)


def req(**query: str) -> VersionsRequest:
    return parse_versions_request({k.replace("_", "-"): val for k, val in query.items()})


def names(page_versions: list[VersionEntry]) -> list[tuple[str, str, bool, str]]:
    return [(x.entry.key, x.version_id, x.is_latest, x.entry.etag) for x in page_versions]


def test_a_spooled_key_replaces_the_backend_null_version_and_a_tombstone_removes_it() -> None:
    backend = [v("a"), v("b"), v("c")]
    page = merge_versions_page(req(), backend, [], [v("b", etag='"s"'), v("d", etag='"s"')], {"c"})
    assert names(page.versions) == [
        ("a", "null", True, '"b"'),
        ("b", "null", True, '"s"'),
        ("d", "null", True, '"s"'),
    ]
    assert not page.is_truncated


def test_older_versions_of_a_versioned_key_stay_but_are_no_longer_latest() -> None:
    backend = [v("a", "v2"), v("a", "v1", latest=False)]
    page = merge_versions_page(req(), backend, [], [v("a", etag='"s"')], set())
    assert names(page.versions) == [
        ("a", "null", True, '"s"'),
        ("a", "v2", False, '"b"'),
        ("a", "v1", False, '"b"'),
    ]


def test_pages_follow_key_and_version_markers_without_repeating_or_skipping() -> None:
    backend = [v("a", "v2"), v("a", "v1", latest=False), v("c")]
    spool = [v("b"), v("a", etag='"s"')]
    seen: list[tuple[str, str]] = []
    query: dict[str, str] = {"max-keys": "2"}
    for _ in range(5):
        page = merge_versions_page(parse_versions_request(query), backend, [], spool, set())
        seen += [(x.entry.key, x.version_id) for x in page.versions]
        if not page.is_truncated:
            break
        query = {"max-keys": "2", "key-marker": page.next_key_marker}
        if page.next_version_id_marker:
            query["version-id-marker"] = page.next_version_id_marker
    assert seen == [("a", "null"), ("a", "v2"), ("a", "v1"), ("b", "null"), ("c", "null")]


def test_key_marker_alone_skips_every_version_of_that_key() -> None:
    page = merge_versions_page(req(key_marker="a"), [v("a", "v2"), v("b")], [], [v("a")], set())
    assert names(page.versions) == [("b", "null", True, '"b"')]


def test_delimiter_rolls_spooled_keys_up_and_prefixes_count_towards_max_keys() -> None:
    r = req(delimiter="/", max_keys="2")
    page = merge_versions_page(r, [v("a")], ["d/"], [v("e/x"), v("b")], set())
    assert names(page.versions) == [("a", "null", True, '"b"'), ("b", "null", True, '"b"')]
    assert page.is_truncated and (page.next_key_marker, page.next_version_id_marker) == ("b", "null")
    page2 = merge_versions_page(req(delimiter="/", key_marker="b"), [v("a")], ["d/"], [v("e/x")], set())
    assert page2.common_prefixes == ["d/", "e/"] and not page2.versions


def test_a_backend_prefix_whose_keys_are_deleted_in_the_spool_is_expanded() -> None:
    assert versions_prefixes_to_expand(req(delimiter="/"), ["d/", "e/"], {"d/x"}) == ["d/"]
    page = merge_versions_page(req(delimiter="/"), [v("d/x")], ["e/"], [], {"d/x"})
    assert page.common_prefixes == ["e/"] and not page.versions


def test_max_keys_zero_is_an_empty_page() -> None:
    page = merge_versions_page(req(max_keys="0"), [v("a")], [], [v("b")], set())
    assert (page.versions, page.common_prefixes, page.is_truncated) == ([], [], False)


def test_bad_arguments_are_invalid_argument_and_a_lone_version_marker_is_ignored() -> None:
    with pytest.raises(InvalidArgument):
        req(max_keys="-1")
    with pytest.raises(InvalidArgument):
        req(encoding_type="xml")
    assert req(version_id_marker="null").version_id_marker == ""


def test_backend_answer_parses_and_rendering_round_trips() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Name>b</Name><NextKeyMarker>k</NextKeyMarker><NextVersionIdMarker>null</NextVersionIdMarker>"
        b"<IsTruncated>true</IsTruncated><Version><Key>k</Key><VersionId>null</VersionId><IsLatest>true</IsLatest>"
        b"<ETag>&#34;e&#34;</ETag><Size>5</Size><Owner><ID>admin</ID><DisplayName>admin</DisplayName></Owner>"
        b"<StorageClass>STANDARD</StorageClass><LastModified>2026-12-06T13:36:47Z</LastModified></Version>"
        b"<DeleteMarker><Key>m</Key><VersionId>v9</VersionId><IsLatest>true</IsLatest>"
        b"<LastModified>2026-12-06T13:36:47Z</LastModified></DeleteMarker>"
        b"<CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes></ListVersionsResult>"
    )
    parsed = parse_backend_versions(body)
    assert parsed.is_truncated and (parsed.next_key_marker, parsed.next_version_id_marker) == ("k", "null")
    assert [(x.entry.key, x.delete_marker, x.entry.owner_id, x.entry.etag) for x in parsed.versions] == [
        ("k", False, "admin", '"e"'),
        ("m", True, None, ""),
    ]
    r = req(encoding_type="url")
    page = merge_versions_page(r, parsed.versions, parsed.common_prefixes, [v("a b")], set())
    again = parse_backend_versions(render_versions_xml(r, "bk", page))
    assert [(x.entry.key, x.version_id, x.delete_marker) for x in again.versions] == [
        ("a b", "null", False),
        ("k", "null", False),
        ("m", "v9", True),
    ]
    assert again.common_prefixes == ["p/"]
    with pytest.raises(ValueError):
        parse_backend_versions(b"<ListBucketResult/>")


def test_owner_of_a_list_buckets_answer() -> None:
    body = (
        b"<ListAllMyBucketsResult><Owner><ID>id1</ID><DisplayName>n1</DisplayName></Owner>"
        b"</ListAllMyBucketsResult>"
    )
    assert parse_owner(body) == ("id1", "n1")
    assert parse_owner(b"<ListAllMyBucketsResult/>") is None
    assert parse_owner(b"not xml") is None


def test_drain_uploads_are_dropped_from_a_backend_uploads_listing_and_the_rest_kept_byte_for_byte() -> None:
    head = b'<?xml version="1.0"?>\n<ListMultipartUploadsResult><Bucket>b</Bucket>'
    up1 = b"<Upload><Key>k1</Key><UploadId>client-1</UploadId></Upload>"
    up2 = b"<Upload><Key>k2</Key><UploadId>drain-2</UploadId></Upload>"
    body = head + up1 + up2 + b"</ListMultipartUploadsResult>"
    assert drop_listed_uploads(body, {"drain-2"}) == head + up1 + b"</ListMultipartUploadsResult>"
    assert drop_listed_uploads(body, set()) == body
    assert drop_listed_uploads(body, {"other"}) == body
    # A key whose drain upload is being created (its id not known yet): its uploads are dropped too.
    assert drop_listed_uploads(body, set(), {"k1"}) == head + up2 + b"</ListMultipartUploadsResult>"
    assert drop_listed_uploads(body, set(), {"k3"}) == body
    url_body = (
        head
        + b"<EncodingType>url</EncodingType>"
        + b"<Upload><Key>a+b%2Fc</Key><UploadId>x</UploadId></Upload>"
    )
    url_body += b"</ListMultipartUploadsResult>"
    assert drop_listed_uploads(url_body, set(), {"a b/c"}) == (
        head + b"<EncodingType>url</EncodingType></ListMultipartUploadsResult>"
    )


def test_spooled_uploads_are_merged_into_a_backend_page_in_key_order() -> None:
    head = b'<?xml version="1.0"?>\n<ListMultipartUploadsResult><Bucket>b</Bucket>'
    b_up = b"<Upload><Key>b</Key><UploadId>1</UploadId></Upload>"
    d_up = b"<Upload><Key>d&amp;e</Key><UploadId>2</UploadId></Upload>"
    tail = b"<CommonPrefixes><Prefix>p/</Prefix></CommonPrefixes></ListMultipartUploadsResult>"
    a_up = b"<Upload><Key>a</Key><UploadId>s3lanes-a</UploadId></Upload>"
    c_up = b"<Upload><Key>c</Key><UploadId>s3lanes-c</UploadId></Upload>"
    e_up = b"<Upload><Key>d&amp;e</Key><UploadId>s3lanes-d</UploadId></Upload>"
    body = head + b_up + d_up + tail
    merged = add_listed_uploads(body, [("a", a_up), ("c", c_up), ("d&e", e_up)])
    assert merged == head + a_up + b_up + c_up + d_up + e_up + tail
    assert add_listed_uploads(head + tail, [("a", a_up)]) == head + a_up + tail
    assert add_listed_uploads(body, []) == body
    url = (
        head
        + b"<EncodingType>url</EncodingType><Upload><Key>x%2By</Key><UploadId>1</UploadId></Upload>"
        + tail
    )
    assert add_listed_uploads(url, [("x", a_up)]).index(a_up) < url.index(b"<Upload>") + len(a_up)
    with pytest.raises(ValueError):
        add_listed_uploads(b"<Error/>", [("a", a_up)])


def test_versions_answer_leaves_out_empty_markers_and_does_not_encode_as_the_store() -> None:
    # The store shows Prefix, KeyMarker and VersionIdMarker only when given, and ignores encoding-type here
    # (no EncodingType element, keys as they are): boto3, which asks for url encoding, decodes nothing.
    plain = req(encoding_type="url")
    body = render_versions_xml(plain, "bk", merge_versions_page(plain, [], [], [v("a b+c")], set()))
    for element in (b"<Prefix>", b"<KeyMarker>", b"<VersionIdMarker>", b"<EncodingType>", b"<Delimiter>"):
        assert element not in body
    assert b"<Key>a b+c</Key>" in body
    given = req(prefix="a", key_marker="a", version_id_marker="v1", delimiter="/")
    body = render_versions_xml(given, "bk", merge_versions_page(given, [], [], [], set()))
    assert b"<Prefix>a</Prefix>" in body and b"<KeyMarker>a</KeyMarker>" in body
    assert b"<VersionIdMarker>v1</VersionIdMarker>" in body
    assert b"<Delimiter>/</Delimiter>" in body


@pytest.mark.parametrize(
    ("marker", "max_parts", "expected"),
    [
        (0, None, PartsPage([1, 2, 3], 10000, False)),  # the store's default MaxParts
        (0, "2", PartsPage([1, 2], 2, True)),
        (1, "2", PartsPage([2, 3], 2, False)),
        (3, None, PartsPage([], 10000, False)),
        (0, "20000", PartsPage([1, 2, 3], 20000, False)),  # echoed, not capped
        (0, "0", PartsPage([1, 2, 3], 0, False)),  # 0 limits nothing (SeaweedFS)
        (0, "abc", PartsPage([1, 2, 3], 0, False)),  # not a number: 0
    ],
)
def test_list_parts_pages_as_the_store(marker: int, max_parts: str | None, expected: PartsPage) -> None:
    assert list_parts_page([3, 1, 2], marker, max_parts) == expected


def test_one_merge_path_serves_both_listings() -> None:
    # The same spooled object and tombstone, merged into a version listing and an object listing.
    spooled = [SpooledObject("k2", 3, '"s"', T0, owner=("id", "me"))]
    backend_versions = [v("k1"), v("gone")]
    body = merged_listing_xml(req(), "bk", backend_versions, [], spooled, {"gone"})
    assert [x.entry.key for x in parse_backend_versions(body).versions] == ["k1", "k2"]
    assert parse_backend_versions(body).versions[1].entry.owner_id == "id"
    listing = parse_list_request({"list-type": "2", "fetch-owner": "true"})
    entries = [ListEntry("k1", 1, '"b"', T0), ListEntry("gone", 1, '"b"', T0)]
    parsed = parse_backend_listing(merged_listing_xml(listing, "bk", entries, [], spooled, {"gone"}))
    assert [(e.key, e.owner_name) for e in parsed.entries] == [("k1", None), ("k2", "me")]
    assert shows_owner(req()) and shows_owner(listing)
    assert not shows_owner(parse_list_request({"list-type": "2"}))


def test_backend_pages_are_asked_and_followed_with_each_listings_own_cursor() -> None:
    versions = req(prefix="p/")
    assert backend_query(versions, "p/", "/", ("k", "v1")) == [
        ("versions", ""),
        ("max-keys", "1000"),
        ("prefix", "p/"),
        ("delimiter", "/"),
        ("key-marker", "k"),
        ("version-id-marker", "v1"),
    ]
    listing = parse_list_request({"list-type": "2"})
    assert ("continuation-token", "tok") in backend_query(listing, "", "", "tok")
    assert ("encoding-type", "url") in backend_query(listing, "", "", None)
    truncated = (
        b"<ListVersionsResult><IsTruncated>true</IsTruncated><NextKeyMarker>k</NextKeyMarker>"
        b"<NextVersionIdMarker>v2</NextVersionIdMarker></ListVersionsResult>"
    )
    assert parse_backend_page(versions, truncated, None)[2] == ("k", "v2")
    assert parse_backend_page(versions, truncated, ("k", "v2"))[2] is None  # no progress: stop
    page = (
        b"<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t</NextContinuationToken>"
        b"</ListBucketResult>"
    )
    assert parse_backend_page(listing, page, None)[2] == "t"
    done = b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
    assert parse_backend_page(listing, done, "t")[2] is None


def versions_xml(inner: str, truncated: str = "false") -> bytes:
    return (
        f'<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><IsTruncated>{truncated}'
        f"</IsTruncated>{inner}</ListVersionsResult>"
    ).encode()


def test_a_malformed_backend_version_listing_is_refused() -> None:
    version = (
        "<Version><Key>k</Key><VersionId>v1</VersionId><LastModified>2026-01-01T00:00:00Z</LastModified>"
    )
    with pytest.raises(ValueError, match="without <Prefix>"):
        parse_backend_versions(versions_xml("<CommonPrefixes></CommonPrefixes>"))
    with pytest.raises(ValueError, match="IsTruncated"):
        parse_backend_versions(versions_xml("", truncated="maybe"))
    with pytest.raises(ValueError, match="numeric <Size>"):
        parse_backend_versions(versions_xml(version + "<Size>big</Size></Version>"))
    with pytest.raises(ValueError, match="needs <Key>"):
        parse_backend_versions(versions_xml("<Version><Size>1</Size></Version>"))


def test_a_backend_version_with_an_unquoted_etag_and_a_zoneless_date_reads_as_the_store_meant() -> None:
    body = versions_xml(
        "<Version><Key>k</Key><VersionId>v1</VersionId><IsLatest>true</IsLatest>"
        "<LastModified>2026-01-01T00:00:00</LastModified><ETag>abc</ETag><Size>3</Size></Version>"
    )
    (got,) = parse_backend_versions(body).versions
    assert got.entry.etag == '"abc"'
    assert (
        got.entry.last_modified
        == parse_backend_versions(body.replace(b":00</Last", b":00Z</Last")).versions[0].entry.last_modified
    )  # UTC when the store names no zone


def test_the_merge_skips_backend_and_spooled_versions_outside_the_prefix() -> None:
    page = merge_versions_page(req(prefix="p/"), [v("p/a"), v("q/b")], [], [v("r/c"), v("p/d")], set())
    assert [x.entry.key for x in page.versions] == ["p/a", "p/d"]


def test_a_key_deleted_in_the_spool_keeps_its_versions_other_than_null() -> None:
    backend = [v("k", "v2"), v("k", NULL_VERSION, latest=False)]
    page = merge_versions_page(req(), backend, [], [], {"k"})
    assert names(page.versions) == [("k", "v2", True, '"b"')]


def test_a_version_id_marker_not_among_the_keys_versions_or_at_its_last_one_lists_nothing_more_of_it() -> (
    None
):
    backend = [v("k", "v2"), v("k", "v1", latest=False), v("m", "v9")]
    unknown = merge_versions_page(req(key_marker="k", version_id_marker="v0"), backend, [], [], set())
    assert [(x.entry.key, x.version_id) for x in unknown.versions] == [("m", "v9")]
    last = merge_versions_page(req(key_marker="k", version_id_marker="v1"), backend, [], [], set())
    assert [(x.entry.key, x.version_id) for x in last.versions] == [("m", "v9")]


def test_a_truncated_versions_page_names_where_the_next_one_starts_and_owners_show_what_is_known() -> None:
    only_id = VersionEntry(ListEntry("a", 1, '"e"', T0, owner_id="id1"), "v1", is_latest=True)
    only_name = VersionEntry(ListEntry("b", 1, '"e"', T0, owner_name="n2"), "v2", is_latest=True)
    page = merge_versions_page(req(max_keys="2"), [only_id, only_name, v("c", "v3")], [], [], set())
    assert page.is_truncated and (page.next_key_marker, page.next_version_id_marker) == ("b", "v2")
    xml = render_versions_xml(req(max_keys="2"), "bkt", page).decode()
    assert "<NextKeyMarker>b</NextKeyMarker><NextVersionIdMarker>v2</NextVersionIdMarker>" in xml
    assert "<Owner><ID>id1</ID></Owner>" in xml
    assert "<Owner><DisplayName>n2</DisplayName></Owner>" in xml
    prefix_last = VersionsPage([], ["p/"], True, "p/", "")
    assert "<NextVersionIdMarker>" not in render_versions_xml(req(), "bkt", prefix_last).decode()


def test_backend_queries_of_both_listings_carry_delimiter_and_cursor_only_when_there_is_one() -> None:
    versions = req()
    assert backend_query(versions, "p/", "", None) == [
        ("versions", ""),
        ("max-keys", "1000"),
        ("prefix", "p/"),
    ]
    assert backend_query(versions, "p/", "", ("k", ""))[-1] == ("key-marker", "k")
    listing = parse_list_request({"list-type": "2"})
    query = backend_query(listing, "p/", "/", None)
    assert ("delimiter", "/") in query and not any(name == "continuation-token" for name, _ in query)


def test_expand_prefixes_picks_the_listings_own_rule() -> None:
    assert expand_prefixes(req(delimiter="/"), ["p/"], {"p/x"}) == ["p/"]
    listing = parse_list_request({"list-type": "2", "delimiter": "/"})
    assert expand_prefixes(listing, ["p/"], {"p/x"}) == prefixes_to_expand(listing, ["p/"], {"p/x"})
    assert expand_prefixes(listing, ["p/"], {"p/x"}) == ["p/"]


def test_the_owner_of_a_list_buckets_answer_is_found_after_other_elements() -> None:
    body = (
        b"<ListAllMyBucketsResult><Buckets/><Owner><ID>id1</ID><DisplayName>n1</DisplayName></Owner>"
        b"</ListAllMyBucketsResult>"
    )
    assert parse_owner(body) == ("id1", "n1")


def test_an_uploads_listing_whose_upload_elements_do_not_parse_as_a_flat_run_is_refused() -> None:
    body = (
        b"<ListMultipartUploadsResult><Upload><Upload><Key>a</Key></Upload></Upload>"
        b"</ListMultipartUploadsResult>"
    )
    with pytest.raises(ValueError, match="not contiguous"):
        add_listed_uploads(body, [("b", b"<Upload><Key>b</Key></Upload>")])


def test_a_prefix_rolled_up_from_keys_before_the_key_marker_is_not_listed_again() -> None:
    page = merge_versions_page(req(delimiter="/", key_marker="q"), [v("p/a"), v("r/b")], [], [], set())
    assert page.common_prefixes == ["r/"] and page.versions == []
