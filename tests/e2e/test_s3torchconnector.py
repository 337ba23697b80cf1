"""s3torchconnector itself (AWS's PyTorch connector, on the CRT client) pointed at the gateway, as
docs/s3torchconnector.md shows it: S3MapDataset and S3IterableDataset read a data set through the gateway,
and a Distributed Checkpoint is saved and loaded with its S3StorageWriter/S3StorageReader whose file system
is swapped for one whose client takes the gateway's endpoint (their constructors take none)."""

from __future__ import annotations

import hashlib
import urllib.request
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from s3torchconnector import S3ClientConfig, S3IterableDataset, S3MapDataset
from s3torchconnector._s3client import S3Client
from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from tests.e2e.conftest import Gateway

pytestmark = pytest.mark.e2e

REGION = "us-east-1"
# The gateway is addressed by IP: path-style requests (virtual-hosted needs a DNS name per bucket).
CONFIG = S3ClientConfig(force_path_style=True, max_attempts=3)


@pytest.fixture
def gateway_credentials(spool_gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> Gateway:
    """The CRT client takes its credentials from the default chain: the environment here."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", spool_gateway.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", spool_gateway.secret_key)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return spool_gateway


def gateway_writer(uri: str, endpoint: str) -> S3StorageWriter:
    """S3StorageWriter with its file system swapped for one whose client talks to ``endpoint``."""
    writer = S3StorageWriter(REGION, uri, s3client_config=CONFIG)
    writer.fs = S3FileSystem(  # type: ignore[assignment]  # the DCP writer declares the base FileSystem
        REGION, s3_client=S3Client(REGION, endpoint=endpoint, s3client_config=CONFIG)
    )
    return writer


def gateway_reader(uri: str, endpoint: str) -> S3StorageReader:
    reader = S3StorageReader(REGION, uri, s3client_config=CONFIG)
    reader.fs = S3FileSystem(
        REGION,
        s3_client=S3Client(REGION, endpoint=endpoint, s3client_config=CONFIG),
        reader_constructor=reader._reader_constructor,
    )
    return reader


def sample(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (5 + i % 40)


@pytest.fixture
def dataset(backend: Any, bucket: str) -> dict[str, bytes]:
    """Written straight to the store: the data set exists independently of the gateway."""
    objects = {f"data/shard-{i:04d}.bin": sample(i) for i in range(120)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: backend.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()))
    return objects


def test_map_and_iterable_datasets_read_through_the_gateway(
    gateway_credentials: Gateway, bucket: str, dataset: dict[str, bytes]
) -> None:
    endpoint = gateway_credentials.http_url
    uri = f"s3://{bucket}/data/"
    mapped = S3MapDataset.from_prefix(uri, region=REGION, endpoint=endpoint, s3client_config=CONFIG)
    assert len(mapped) == len(dataset)
    got = {mapped[i].key: mapped[i].read() for i in range(len(mapped))}
    assert got == dataset
    iterable = S3IterableDataset.from_prefix(uri, region=REGION, endpoint=endpoint, s3client_config=CONFIG)
    assert {o.key: o.read() for o in iterable} == dataset


@pytest.fixture
def dcp_single_process() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def test_dcp_save_and_load_through_the_gateway_with_the_spool(
    gateway_credentials: Gateway, backend: Any, bucket: str, dcp_single_process: None
) -> None:
    gw = gateway_credentials
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    big = torch.randn(3 * 1024 * 1024)  # 12 MiB: more than one part of the CRT's 8 MiB uploads
    state = {"model": model.state_dict(), "extra": {"big": big}}
    uri = f"s3://{bucket}/checkpoints/step-100"
    dcp_save(state, storage_writer=gateway_writer(uri, gw.http_url))

    keys = sorted(o["Key"] for o in gw.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert "checkpoints/step-100/.metadata" in keys
    assert any(k.endswith(".distcp") for k in keys)

    fresh = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    target = {"model": fresh.state_dict(), "extra": {"big": torch.zeros_like(big)}}
    dcp_load(target, storage_reader=gateway_reader(uri, gw.http_url))  # in place, possibly from the spool
    for name, tensor in model.state_dict().items():
        assert torch.equal(target["model"][name], tensor), name
    assert torch.equal(target["extra"]["big"], big)

    # Spooled, then drained: once durable, the store itself holds the same checkpoint.
    req = urllib.request.Request(
        f"{gw.http_url}/_s3lanes/flush?bucket={bucket}&prefix=checkpoints/&timeout=120", method="POST"
    )
    with urllib.request.urlopen(req, timeout=150) as resp:
        assert resp.status == 200
    on_store = sorted(o["Key"] for o in backend.list_objects_v2(Bucket=bucket)["Contents"])
    assert [k for k in keys if k.startswith("checkpoints/")] == [
        k for k in on_store if k.startswith("checkpoints/")
    ]
