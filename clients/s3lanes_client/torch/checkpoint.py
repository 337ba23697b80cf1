"""``save_checkpoint``/``load_checkpoint``: ``torch.save``/``torch.load`` straight to and from an object.

``save_checkpoint`` streams ``torch.save``'s output into a :class:`~s3lanes_client.multipart.MultipartWriter`
in the checkpoint lane: parts go out in parallel while later tensors are still being serialised, and memory
holds at most ``(max_inflight_parts + 1) * part_size_bytes`` of checkpoint bytes besides the tensors
themselves. A failure aborts the upload (no partial object) and raises. ``load_checkpoint`` reads in the
restore lane through a seekable ranged reader, so the serialised checkpoint is not held whole in memory
either. :class:`S3Checkpoint` offers the same two streams as ``writer(uri)``/``reader(uri)``, for code written
against s3torchconnector.
"""

from __future__ import annotations

from typing import IO, Any, cast

import torch

from s3lanes_client.config import ClientConfig, MiB, config_for
from s3lanes_client.multipart import MultipartWriter
from s3lanes_client.reader import ObjectReader
from s3lanes_client.sync import GatewayClient
from s3lanes_client.uri import parse_s3_uri


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


class S3Checkpoint:
    """s3torchconnector's ``S3Checkpoint``: ``writer(uri)``/``reader(uri)`` streams for ``torch.save`` and
    ``torch.load``::

        checkpoint = S3Checkpoint(region="us-east-1", endpoint="http://127.0.0.1:9000")
        with checkpoint.writer("s3://ckpt/run7/step_100/model.pt") as writer:
            torch.save(model.state_dict(), writer)
        with checkpoint.reader("s3://ckpt/run7/step_100/model.pt") as reader:
            model.load_state_dict(torch.load(reader))

    The writer is a :class:`~s3lanes_client.multipart.MultipartWriter` in the checkpoint lane: it streams
    (parts upload while ``torch.save`` still writes, nothing is spooled to a temporary file), the object
    appears when the ``with`` block ends normally, and an exception inside it aborts the upload so no partial
    object is left. The reader is the lazy ranged :class:`~s3lanes_client.reader.ObjectReader` in the restore
    lane. One client (``client``, else one made from ``config`` with ``region``/``endpoint`` applied, else
    from the environment) serves every stream; ``close()`` closes a client the object made itself.
    """

    def __init__(
        self,
        region: str | None = None,
        endpoint: str | None = None,
        *,
        config: ClientConfig | None = None,
        client: GatewayClient | None = None,
        part_size_bytes: int = 16 * MiB,
        max_inflight_parts: int = 4,
        block_bytes: int = 16 * MiB,
        write_through: bool = False,
    ) -> None:
        if client is not None and (config is not None or region is not None or endpoint is not None):
            raise ValueError("give a client, or config/region/endpoint, not both")
        self._own = client is None
        if client is None:
            client = GatewayClient(config_for(config, region, endpoint))
        self.client = client
        self.part_size_bytes = part_size_bytes
        self.max_inflight_parts = max_inflight_parts
        self.block_bytes = block_bytes
        self.write_through = write_through

    def writer(self, uri: str) -> MultipartWriter:
        """A write stream to ``s3://bucket/key``, committed when closed (or its ``with`` block ends)."""
        target = parse_s3_uri(uri)
        if not target.key:
            raise ValueError(f"no object key in {uri!r}")
        return self.client.open_writer(
            target.bucket,
            target.key,
            part_size_bytes=self.part_size_bytes,
            max_inflight_parts=self.max_inflight_parts,
            lane="checkpoint",
            write_through=self.write_through,
        )

    def reader(self, uri: str) -> ObjectReader:
        """A lazy, seekable read stream over ``s3://bucket/key`` (a missing object raises
        ``FileNotFoundError`` at the first read)."""
        target = parse_s3_uri(uri)
        if not target.key:
            raise ValueError(f"no object key in {uri!r}")
        return self.client.open_reader(
            target.bucket, target.key, lane="restore", block_bytes=self.block_bytes
        )

    def close(self) -> None:
        if self._own:
            self.client.close()

    def __enter__(self) -> S3Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
