"""``save_checkpoint``/``load_checkpoint``: ``torch.save``/``torch.load`` straight to and from an object.

``save_checkpoint`` streams ``torch.save``'s output into a :class:`~clients.multipart.MultipartWriter` in the
checkpoint lane: parts go out in parallel while later tensors are still being serialised, and memory holds at
most ``(max_inflight_parts + 1) * part_size_bytes`` of checkpoint bytes besides the tensors themselves. A
failure aborts the upload (no partial object) and raises. ``load_checkpoint`` reads in the restore lane
through a seekable ranged reader, so the serialised checkpoint is not held whole in memory either.
"""

from __future__ import annotations

from typing import IO, Any, cast

import torch

from clients.config import ClientConfig, MiB
from clients.sync import GatewayClient
from clients.uri import parse_s3_uri


def save_checkpoint(
    obj: Any,
    uri: str,
    *,
    client: GatewayClient | None = None,
    config: ClientConfig | None = None,
    part_size_bytes: int = 16 * MiB,
    max_inflight_parts: int = 4,
    lane: str | None = "checkpoint",
    write_through: bool = False,
    wait_durable_timeout_s: float | None = None,
) -> str:
    """``torch.save(obj)`` to ``s3://bucket/key``; returns the object's ETag.

    With ``wait_durable_timeout_s`` it also waits until the gateway has the object on the backend (see
    ``GatewayClient.wait_durable``; raises ``NotDurableError`` on timeout).
    """
    target = parse_s3_uri(uri)
    if not target.key:
        raise ValueError(f"no object key in {uri!r}")
    own = client is None
    c = client if client is not None else GatewayClient(config)
    try:
        with c.open_writer(
            target.bucket,
            target.key,
            part_size_bytes=part_size_bytes,
            max_inflight_parts=max_inflight_parts,
            lane=lane,
            write_through=write_through,
        ) as writer:
            torch.save(obj, cast(IO[bytes], writer))  # a write-only stream is all torch.save needs
        if wait_durable_timeout_s is not None:
            c.wait_durable(target.bucket, target.key, wait_durable_timeout_s)
        return writer.etag or ""
    finally:
        if own:
            c.close()


def load_checkpoint(
    uri: str,
    *,
    client: GatewayClient | None = None,
    config: ClientConfig | None = None,
    map_location: Any = None,
    weights_only: bool = True,
    lane: str | None = "restore",
    block_bytes: int = 16 * MiB,
) -> Any:
    """``torch.load`` from ``s3://bucket/key``. ``weights_only=True`` (torch's default) refuses arbitrary
    pickled code; pass False only for checkpoints you wrote yourself."""
    target = parse_s3_uri(uri)
    own = client is None
    c = client if client is not None else GatewayClient(config)
    try:
        with c.open_reader(target.bucket, target.key, lane=lane, block_bytes=block_bytes) as reader:
            return torch.load(cast(IO[bytes], reader), map_location=map_location, weights_only=weights_only)
    finally:
        if own:
            c.close()
