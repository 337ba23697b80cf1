"""Thin Python client for training jobs talking to s3lanes (or plain S3).

::

    from s3lanes_client import ClientConfig, GatewayClient, Lane

    client = GatewayClient(ClientConfig(endpoint_url="http://127.0.0.1:9000", lane=Lane.DATASET))
    data = client.get_bytes("train", "shard-000.tar", start=0, end=1 << 20)
    client.put_bytes("ckpt", "run7/step_100/model.pt", blob, lane=Lane.CHECKPOINT)
    client.wait_durable("ckpt", "run7/step_100/", timeout_s=600)

``AsyncGatewayClient`` (aioboto3) is imported on first use; the PyTorch datasets and checkpoint helpers live
in :mod:`s3lanes_client.torch` (needs the ``torch`` extra). Importing this package imports neither torch nor
aioboto3, and never the gateway server. docs/client.md is the guide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from s3lanes_client.config import ClientConfig
from s3lanes_client.errors import (
    BucketNotFound,
    FlushUnsupported,
    InvalidS3URI,
    NotDurableError,
    RetriesExhausted,
    S3LanesClientError,
    UploadFailed,
)
from s3lanes_client.hints import LANE_HEADER, WRITE_THROUGH_HEADER, Lane
from s3lanes_client.model import DurabilityStatus, ObjectInfo, RetryEvent
from s3lanes_client.multipart import MultipartWriter
from s3lanes_client.reader import ObjectReader
from s3lanes_client.retry import Failure, RetryPolicy
from s3lanes_client.sync import GatewayClient
from s3lanes_client.uri import S3URI, parse_s3_uri

if TYPE_CHECKING:
    from s3lanes_client.aio import AsyncGatewayClient

__all__ = [
    "LANE_HEADER",
    "S3URI",
    "WRITE_THROUGH_HEADER",
    "AsyncGatewayClient",
    "BucketNotFound",
    "ClientConfig",
    "DurabilityStatus",
    "Failure",
    "FlushUnsupported",
    "GatewayClient",
    "InvalidS3URI",
    "Lane",
    "MultipartWriter",
    "NotDurableError",
    "ObjectInfo",
    "ObjectReader",
    "RetriesExhausted",
    "RetryEvent",
    "RetryPolicy",
    "S3LanesClientError",
    "UploadFailed",
    "parse_s3_uri",
]


def __getattr__(name: str) -> Any:
    if name == "AsyncGatewayClient":  # aioboto3 and aiohttp load only for async users
        from s3lanes_client.aio import AsyncGatewayClient

        return AsyncGatewayClient
    raise AttributeError(f"module 's3lanes_client' has no attribute {name!r}")
