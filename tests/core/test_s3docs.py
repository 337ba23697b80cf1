"""DeleteObjects and CompleteMultipartUpload documents: what S3 accepts, what it refuses with MalformedXML."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from s3lanes.core.s3docs import (
    MAX_COMPLETE_PARTS,
    MAX_DELETE_OBJECTS,
    complete_multipart_parts,
    delete_objects_keys,
    delete_objects_targets,
)
from s3lanes.errors import MalformedXML

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def doc(inner: str, root: str = "Delete", ns: str = NS) -> bytes:
    return f"<{root} {ns}>{inner}</{root}>".encode()


def test_keys_in_order_with_and_without_namespace() -> None:
    inner = "<Quiet>true</Quiet><Object><Key>a/b</Key></Object><Object><Key>c</Key><ETag>x</ETag></Object>"
    assert delete_objects_keys(doc(inner)) == ["a/b", "c"]
    assert delete_objects_keys(doc(inner, ns="")) == ["a/b", "c"]


def test_a_version_delete_leaves_the_current_object() -> None:
    inner = "<Object><Key>a</Key><VersionId>v1</VersionId></Object><Object><Key>b</Key></Object>"
    assert delete_objects_keys(doc(inner)) == ["b"]


def test_targets_carry_the_version_id_of_each_object() -> None:
    inner = (
        "<Object><Key>a</Key><VersionId>v1</VersionId></Object><Object><Key>b</Key></Object>"
        "<Object><Key>c</Key><VersionId>null</VersionId></Object>"
    )
    assert delete_objects_targets(doc(inner)) == [("a", "v1"), ("b", None), ("c", "null")]


def test_escaped_and_unicode_keys() -> None:
    inner = (
        "<Object><Key>a&amp;b &lt;c&gt; \u00e9\u6f22</Key></Object>"
        "<Object><Key><![CDATA[x<y]]></Key></Object>"
    )
    assert delete_objects_keys(doc(inner)) == ["a&b <c> \u00e9\u6f22", "x<y"]


def test_exactly_the_limit_is_accepted() -> None:
    inner = "<Object><Key>k</Key></Object>" * MAX_DELETE_OBJECTS
    assert len(delete_objects_keys(doc(inner))) == MAX_DELETE_OBJECTS


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not xml",
        doc("<Object><Key>a</Key></Object>", root="Foo"),
        doc("<Object><Key>a</Key></Object><Key>b</Key>"),
        doc("<Object><VersionId>x</VersionId></Object>"),
        doc("<Object><Key>a</Key><Object><Key>b</Key></Object></Object>"),
        doc("<Object><Key>a</Key><Key>b</Key></Object>"),
        doc("<Object><Key>a<b>c</b></Key></Object>"),
        doc("<Object><Key>a</Key><Owner>x</Owner></Object>"),
        doc("<Quiet>maybe</Quiet><Object><Key>a</Key></Object>"),
        doc("<Quiet><x/>true</Quiet><Object><Key>a</Key></Object>"),
        doc("<Quiet>true</Quiet>"),
        doc("<Object><Key>k</Key></Object>" * (MAX_DELETE_OBJECTS + 1)),
        b"<Delete><Object><Key>a</Key></Object>",
        "<Delete><Object><Key>\u00e9</Key></Object></Delete>".encode("utf-16"),
        b"<Delete><Object><Key>\xff</Key></Object></Delete>",
        b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
        + b"".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">'.encode() for i in range(8))
        + b"]><Delete><Object><Key>&i;</Key></Object></Delete>",
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
        b"<Delete><Object><Key>&e;</Key></Object></Delete>",
    ],
    ids=lambda b: repr(b[:40]),
)
def test_malformed_documents_are_refused(body: bytes) -> None:
    with pytest.raises(MalformedXML):
        delete_objects_keys(body)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_keys_or_malformed_xml(body: bytes) -> None:
    try:
        keys = delete_objects_keys(body)
    except MalformedXML:
        return
    assert all(isinstance(k, str) for k in keys)


# -- CompleteMultipartUpload ---------------------------------------------------------------------------------


def part(number: str, etag: str = '"e"', extra: str = "") -> str:
    return f"<Part><PartNumber>{number}</PartNumber><ETag>{etag}</ETag>{extra}</Part>"


def test_parts_in_document_order_with_checksums_and_without_namespace() -> None:
    inner = part("1", '"a1"', "<ChecksumCRC32>AAAAAA==</ChecksumCRC32>") + part(" 3 ", ' "b2" ')
    assert complete_multipart_parts(doc(inner, root="CompleteMultipartUpload")) == [(1, '"a1"'), (3, '"b2"')]
    assert complete_multipart_parts(doc(part("2") + part("1"), root="CompleteMultipartUpload", ns="")) == [
        (2, '"e"'),
        (1, '"e"'),
    ]  # order and range are the upload's business (InvalidPartOrder), not the document's


def test_exactly_the_part_limit_is_accepted() -> None:
    inner = "".join(part(str(n)) for n in range(1, MAX_COMPLETE_PARTS + 1))
    assert len(complete_multipart_parts(doc(inner, root="CompleteMultipartUpload"))) == MAX_COMPLETE_PARTS


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not xml",
        doc(part("1"), root="Foo"),
        doc(part("1"), root="Delete"),
        doc("", root="CompleteMultipartUpload"),
        doc(part("1") + "<Extra/>", root="CompleteMultipartUpload"),
        doc("<Part><PartNumber>1</PartNumber></Part>", root="CompleteMultipartUpload"),
        doc('<Part><ETag>"e"</ETag></Part>', root="CompleteMultipartUpload"),
        doc(part("one"), root="CompleteMultipartUpload"),
        doc(part("-1"), root="CompleteMultipartUpload"),
        doc(part("\u0661"), root="CompleteMultipartUpload"),  # an Arabic-Indic digit is not a part number
        doc(part("1", extra="<ETag>x</ETag>"), root="CompleteMultipartUpload"),
        doc(part("1", extra="<Size>3</Size>"), root="CompleteMultipartUpload"),
        doc(part("1", etag="<b>e</b>"), root="CompleteMultipartUpload"),
        doc("".join(part(str(n)) for n in range(1, MAX_COMPLETE_PARTS + 2)), root="CompleteMultipartUpload"),
        b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber>",
        doc(part("1", etag="\xff"), root="CompleteMultipartUpload").decode().encode("latin-1"),
    ],
    ids=lambda b: repr(b[:60]),
)
def test_malformed_complete_documents_are_refused(body: bytes) -> None:
    with pytest.raises(MalformedXML):
        complete_multipart_parts(body)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_parts_or_malformed_xml(body: bytes) -> None:
    try:
        parts = complete_multipart_parts(body)
    except MalformedXML:
        return
    assert parts and all(n >= 0 and isinstance(e, str) for n, e in parts)
