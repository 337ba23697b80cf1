"""Fixtures shared by the whole suite.

Backend (a real SeaweedFS, started once per run):

    seaweed          session   one ``weed mini`` for the run, two identities -> :class:`Backend`
    unique_bucket    function  a fresh bucket on that SeaweedFS, emptied and deleted after the test

Helpers: :func:`s3_client` (a boto3 client straight to SeaweedFS, bypassing the gateway).

SeaweedFS is started lazily: a run that uses neither fixture (``pytest tests/core``) starts nothing. It is
stopped at the end of the session, also when a test fails or the run is interrupted with Ctrl-C (pytest
tears session fixtures down on KeyboardInterrupt; weed runs in its own session, so the Ctrl-C itself does
not reach it). Its data and logs stay in pytest's temporary directory (``.../seaweed0/logs/weed.out``).
Tests that need it are marked ``e2e``.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.handlers
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, settings

from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess
from tests.budget import FAST

# make test-fast (tests/budget.py): few examples, the same ones every run.
settings.register_profile(
    "fast", max_examples=10, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
if FAST:
    settings.load_profile("fast")

ADMIN_ACCESS_KEY = "s3lanes-test-admin"
USER2_ACCESS_KEY = "s3lanes-test-user2"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """The SeaweedFS of this test session. Both identities have every action (Admin included)."""

    endpoint_url: str
    region: str = "us-east-1"
    admin: SeaweedIdentity
    user2: SeaweedIdentity


def s3_client(backend: Backend, identity: SeaweedIdentity | None = None, **config: Any) -> Any:
    """A boto3 S3 client that talks to SeaweedFS directly as ``identity`` (default: admin). Close it.

    botocore's ``Expect: 100-continue`` is switched off: SeaweedFS answers an empty-body PUT that carries
    it without the interim 100 and keeps the connection, and botocore then stalls 60 s on the next PUT.
    """
    ident = identity or backend.admin
    cfg = Config(
        region_name=backend.region,
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 2, "mode": "standard"},
        connect_timeout=5,
        read_timeout=30,
    ).merge(Config(**config))
    client = boto3.client(
        "s3",
        endpoint_url=backend.endpoint_url,
        aws_access_key_id=ident.access_key,
        aws_secret_access_key=ident.secret_key,
        config=cfg,
    )
    client.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
    return client


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """One real SeaweedFS for the whole run, with an admin and a second user (fresh random secrets)."""
    admin = SeaweedIdentity("admin", ADMIN_ACCESS_KEY, secrets.token_urlsafe(30))
    user2 = SeaweedIdentity("user2", USER2_ACCESS_KEY, secrets.token_urlsafe(30))
    weed = SeaweedProcess(
        SeaweedOptions(state_dir=tmp_path_factory.mktemp("seaweed"), identities=(admin, user2))
    )
    weed.start()  # kills weed itself if the start fails or is interrupted
    try:
        yield Backend(endpoint_url=weed.endpoint_url, admin=admin, user2=user2)
    finally:
        weed.stop()


@pytest.fixture
def unique_bucket(seaweed: Backend, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, empty bucket created directly on SeaweedFS (as admin), named after the test. Afterwards its
    objects, versions and unfinished multipart uploads are deleted, then the bucket (if the test has not
    deleted it already). A teardown failure fails the test: leftovers would hide leaks."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{stem}-{uuid.uuid4().hex[:8]}"
    client = s3_client(seaweed)
    try:
        client.create_bucket(Bucket=name)
        yield name
        _delete_bucket_and_contents(client, name)
    finally:
        client.close()


def _delete_bucket_and_contents(client: Any, bucket: str) -> None:
    try:
        versioning = client.get_bucket_versioning(Bucket=bucket).get("Status")
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "NoSuchBucket":
            return
        raise
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for upload in page.get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
        if keys:
            _delete_objects(client, bucket, keys)
    if versioning in ("Enabled", "Suspended"):
        for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
            entries = [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
            keys = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in entries]
            if keys:
                _delete_objects(client, bucket, keys)
    client.delete_bucket(Bucket=bucket)


def _delete_objects(client: Any, bucket: str, keys: list[dict[str, str]]) -> None:
    result = client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    if result.get("Errors"):
        raise AssertionError(f"could not empty bucket {bucket}: {result['Errors'][:5]}")
