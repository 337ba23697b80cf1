"""``S3Checkpoint`` writer/reader with a real torch state_dict, and the Lightning ``CheckpointIO`` called
directly (Lightning need not be installed), through the real gateway."""

from __future__ import annotations

import importlib.util
from pathlib import PurePosixPath
from typing import IO, Any, cast

import pytest
import torch

from s3lanes_client import ClientConfig, GatewayClient
from s3lanes_client.torch import S3Checkpoint
from s3lanes_client.torch.lightning import LIGHTNING_AVAILABLE, S3LightningCheckpoint
from tests.e2e.conftest import Gateway
from tests.e2e.test_client_sync import gateway_config

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


def model_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 512)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3}


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_s3checkpoint_writer_and_reader_round_trip_a_state_dict(gateway: Gateway, bucket: str) -> None:
    state = model_state()
    uri = f"s3://{bucket}/ckpt/run1/model.pt"
    keys_only = ClientConfig(access_key=gateway.access_key, secret_key=gateway.secret_key)
    with S3Checkpoint(
        region="us-east-1", endpoint=gateway.http_url, config=keys_only, part_size_bytes=5 * MiB
    ) as ck:
        with ck.writer(uri) as writer:
            torch.save(state, cast(IO[bytes], writer))
        assert writer.etag is not None and writer.etag.endswith("-2")  # ~6 MiB: streamed as multipart
        with ck.reader(uri) as reader:
            loaded = torch.load(cast(IO[bytes], reader), weights_only=True)
        assert_same(state, loaded)
        # An exception inside the writer leaves no object at all.
        with pytest.raises(RuntimeError, match="boom"), ck.writer(f"s3://{bucket}/ckpt/run1/broken.pt") as w:
            w.write(b"x" * (6 * MiB))
            raise RuntimeError("boom")
        assert ck.client.head(bucket, "ckpt/run1/broken.pt") is None
        with pytest.raises(FileNotFoundError), ck.reader(f"s3://{bucket}/ckpt/none.pt") as missing:
            missing.read(1)


def test_lightning_checkpoint_io_saves_loads_and_removes(gateway: Gateway, bucket: str) -> None:
    importable = any(importlib.util.find_spec(m) is not None for m in ("lightning", "pytorch_lightning"))
    assert importable == LIGHTNING_AVAILABLE
    if importable:  # then it is one of Lightning's plugins
        from lightning.pytorch.plugins.io import CheckpointIO

        assert isinstance(S3LightningCheckpoint(config=gateway_config(gateway)), CheckpointIO)
    io_plugin = S3LightningCheckpoint(config=gateway_config(gateway))
    checkpoint = {"state_dict": model_state()["model"], "epoch": 2, "global_step": 40}
    uri = f"s3://{bucket}/lightning/epoch=2-step=40.ckpt"
    io_plugin.save_checkpoint(checkpoint, uri)
    assert_same(checkpoint, io_plugin.load_checkpoint(uri, map_location="cpu"))
    as_path = PurePosixPath(uri)  # what str() of a Path makes of a URI ("s3:/bucket/...") is accepted too
    assert_same(checkpoint, io_plugin.load_checkpoint(as_path))
    with pytest.raises(TypeError, match="storage_options"):
        io_plugin.save_checkpoint(checkpoint, uri, storage_options={"x": 1})
    io_plugin.remove_checkpoint(uri)
    with GatewayClient(gateway_config(gateway)) as client:
        assert client.head(bucket, "lightning/epoch=2-step=40.ckpt") is None
    io_plugin.teardown()
