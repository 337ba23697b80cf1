"""The storage pools' routing table: which backend holds a bucket, its name there, the names clients see."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
from hypothesis import given
from hypothesis import strategies as st

from s3lanes.config import load_config
from s3lanes.core.routing import (
    DEFAULT_BACKEND,
    Route,
    RouteTable,
    rename_copy_source,
    rename_in_xml,
    rename_location,
    split_copy_source,
)
from s3lanes.errors import ConfigError

TABLE = RouteTable(
    [
        ("datasets", "fast", "ds-prod"),
        ("checkpoints", "ckpt", "checkpoints"),
        ("logs", DEFAULT_BACKEND, "logs-2026"),
    ]
)


def test_resolve_routed_and_default_buckets() -> None:
    assert TABLE.resolve("datasets") == Route("fast", "datasets", "ds-prod")
    assert TABLE.resolve("datasets").renamed
    assert not TABLE.resolve("checkpoints").renamed
    assert TABLE.resolve("other") == Route(DEFAULT_BACKEND, "other", "other")
    assert TABLE.backends_to_list() == [DEFAULT_BACKEND, "ckpt", "fast"]


def test_client_names_hide_what_clients_cannot_address() -> None:
    assert TABLE.client_name("fast", "ds-prod") == "datasets"
    assert TABLE.client_name("fast", "scratch") is None  # a named backend shows only its routed buckets
    assert TABLE.client_name(DEFAULT_BACKEND, "logs-2026") == "logs"
    assert TABLE.client_name(DEFAULT_BACKEND, "datasets") is None  # the name belongs to the route
    assert TABLE.client_name(DEFAULT_BACKEND, "home") == "home"


def test_bucket_lists_merge_into_one_namespace() -> None:
    merged = TABLE.merge_bucket_lists(
        {
            DEFAULT_BACKEND: [("home", "t1"), ("datasets", "t2"), ("logs-2026", "t3")],
            "fast": [("ds-prod", "t4"), ("scratch", "t5")],
            "ckpt": [("checkpoints", "t6")],
        }
    )
    assert merged == [("checkpoints", "t6"), ("datasets", "t4"), ("home", "t1"), ("logs", "t3")]


def test_copy_source_keeps_the_key_bytes_and_renames_the_bucket() -> None:
    assert split_copy_source("/datasets/a%20b/c?versionId=3") == ("datasets", "/a%20b/c?versionId=3")
    assert split_copy_source("datasets/k") == ("datasets", "/k")
    assert rename_copy_source("/datasets/a%20b/c?versionId=3", "ds-prod") == "/ds-prod/a%20b/c?versionId=3"


def test_rename_in_xml_touches_bucket_names_only() -> None:
    body = (
        b'<?xml version="1.0"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Name>ds-prod</Name><Prefix>ds-prod</Prefix><Contents><Key>ds-prod</Key></Contents>"
        b"</ListBucketResult>"
    )
    out = rename_in_xml(body, "ds-prod", "datasets")
    root = ET.fromstring(out)
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    assert root.findtext(f"{ns}Name") == "datasets"
    assert root.findtext(f"{ns}Prefix") == "ds-prod"
    assert root.findtext(f"{ns}Contents/{ns}Key") == "ds-prod"
    complete = (
        b"<CompleteMultipartUploadResult><Location>http://s3:8333/ds-prod/k</Location>"
        b"<Bucket>ds-prod</Bucket><Key>k</Key></CompleteMultipartUploadResult>"
    )
    result = ET.fromstring(rename_in_xml(complete, "ds-prod", "datasets"))
    assert result.findtext("Location") == "http://s3:8333/datasets/k"
    assert result.findtext("Bucket") == "datasets"
    error = (
        b"<Error><Code>NoSuchBucket</Code><BucketName>ds-prod</BucketName>"
        b"<Resource>/ds-prod</Resource></Error>"
    )
    err = ET.fromstring(rename_in_xml(error, "ds-prod", "datasets"))
    assert (err.findtext("BucketName"), err.findtext("Resource")) == ("datasets", "/datasets")


def test_rename_location_header() -> None:
    assert rename_location("/ds-prod", "ds-prod", "datasets") == "/datasets"
    assert rename_location("http://ds-prod.s3.local/", "ds-prod", "datasets") == "http://datasets.s3.local/"
    assert rename_location("/ds-production", "ds-prod", "datasets") == "/ds-production"


@given(
    st.text(alphabet="abcdefghij-.", min_size=3, max_size=20).filter(lambda s: s[0].isalpha()),
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=0, max_size=40),
)
def test_rename_in_xml_never_changes_keys(bucket: str, key: str) -> None:
    body = f"<R><Name>{escape(bucket)}</Name><Key>{escape(key)}</Key></R>".encode()
    out = ET.fromstring(rename_in_xml(body, bucket, "client-name"))
    assert out.findtext("Name") == "client-name"
    assert (out.findtext("Key") or "") == key


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s3lanes.toml"
    p.write_text(text)
    return p


POOLS = """
[backend]
endpoint = "http://127.0.0.1:1"

[backends.ckpt]
endpoint = "http://127.0.0.1:2"
bandwidth = "100MB/s"
source_address = "127.0.0.2"
lane_source_address = { checkpoint = "127.0.0.3" }
access_key = "CK"
secret_key = "CKSECRET"

[backends.twin]
endpoint = "http://127.0.0.1:3"
shares_bottleneck_with = "ckpt"

[[routes]]
bucket = "checkpoints"
backend = "ckpt"
backend_bucket = "ckpt-prod"

[[routes]]
bucket = "mirror"
backend = "twin"

[[credentials]]
access_key = "AK"
secret_key = "SK"
"""


def test_pools_config_parses(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, POOLS), env={})
    ck = cfg.backends["ckpt"]
    assert ck.bandwidth_bps == 100e6
    assert ck.source_address == "127.0.0.2"
    assert dict(ck.lane_source_addresses) == {"checkpoint": "127.0.0.3"}
    assert (ck.access_key, ck.secret_key) == ("CK", "CKSECRET")
    assert "CKSECRET" not in repr(cfg)
    assert cfg.backends["twin"].shares_bottleneck_with == "ckpt"
    assert [(r.bucket, r.backend, r.backend_bucket) for r in cfg.routes] == [
        ("checkpoints", "ckpt", "ckpt-prod"),
        ("mirror", "twin", "mirror"),
    ]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (('backend = "ckpt"\nbackend_bucket', 'backend = "nope"\nbackend_bucket'), "unknown backend 'nope'"),
        (('source_address = "127.0.0.2"', 'source_address = "eth0"'), "not an IP address"),
        (("{ checkpoint =", "{ bogus ="), "unknown lane 'bogus'"),
        (('secret_key = "CKSECRET"\n', ""), "access_key and secret_key go together"),
        (('shares_bottleneck_with = "ckpt"', 'shares_bottleneck_with = "twin"'), "no other backend named"),
        (('bucket = "mirror"', 'bucket = "checkpoints"'), "routed twice"),
        (('backend_bucket = "ckpt-prod"', 'backend_bucket = "Bad_Name"'), "not a valid S3 bucket name"),
        (('endpoint = "http://127.0.0.1:3"\n', ""), "needs an endpoint"),
        (("[backends.twin]", "[backends.default]"), "not 'default'"),
    ],
)
def test_pools_config_mistakes_are_reported(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in POOLS
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, POOLS.replace(old, new, 1)), env={})
