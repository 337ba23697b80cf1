"""A Lightning ``CheckpointIO`` that saves, loads and removes checkpoints at ``s3://`` URIs.

::

    from s3lanes_client.torch.lightning import S3LightningCheckpoint

    trainer = Trainer(plugins=[S3LightningCheckpoint(config=config)], default_root_dir="s3://ckpt/run7/")

Lightning is optional: when ``lightning`` (or the older ``pytorch_lightning``) is importable the class
subclasses its ``CheckpointIO``; otherwise it is a plain class with the same methods, so importing this module
never needs Lightning. Saving streams ``torch.save`` through a multipart upload in the checkpoint lane (no
partial object on failure); loading reads lazily with ranged GETs in the restore lane.
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, Any, cast

import torch

from s3lanes_client.config import ClientConfig, MiB
from s3lanes_client.sync import GatewayClient
from s3lanes_client.torch.checkpoint import S3Checkpoint
from s3lanes_client.uri import parse_s3_uri

if TYPE_CHECKING:
    _CheckpointIOBase = object
else:
    try:
        from lightning.pytorch.plugins.io import CheckpointIO as _CheckpointIOBase
    except ImportError:
        try:
            from pytorch_lightning.plugins.io import CheckpointIO as _CheckpointIOBase
        except ImportError:
            _CheckpointIOBase = object

LIGHTNING_AVAILABLE: bool = _CheckpointIOBase is not object


def _uri(path: str | os.PathLike[str]) -> str:
    uri = os.fspath(path)
    if uri.startswith("s3:/") and not uri.startswith("s3://"):  # str(pathlib.Path("s3://b/k")) == "s3:/b/k"
        uri = "s3://" + uri[len("s3:/") :]
    return uri


class S3LightningCheckpoint(_CheckpointIOBase):
    """``CheckpointIO`` over s3lanes (or any S3 store). ``region``/``endpoint`` are applied over ``config``
    (else the environment); or give a ``client``."""

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
    ) -> None:
        super().__init__()
        self._checkpoint = S3Checkpoint(
            region,
            endpoint,
            config=config,
            client=client,
            part_size_bytes=part_size_bytes,
            max_inflight_parts=max_inflight_parts,
            block_bytes=block_bytes,
        )

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any | None = None
    ) -> None:
        """``torch.save(checkpoint)`` to ``path`` (``s3://bucket/key``). Lightning's ``storage_options`` are
        not supported (a non-None value raises ``TypeError``, as Lightning's own ``TorchCheckpointIO``)."""
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options, got {storage_options!r}"
            )
        with self._checkpoint.writer(_uri(path)) as writer:
            torch.save(checkpoint, cast(IO[bytes], writer))  # a write-only binary stream

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any | None = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """``torch.load`` from ``path``. ``weights_only`` None means True (torch's default: no arbitrary
        pickled code); Lightning checkpoints that hold other objects need ``weights_only=False``."""
        with self._checkpoint.reader(_uri(path)) as reader:
            loaded: dict[str, Any] = torch.load(
                cast(IO[bytes], reader),  # a seekable binary stream
                map_location=map_location,
                weights_only=True if weights_only is None else weights_only,
            )
        return loaded

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete the object at ``path`` (deleting a missing one is not an error, as in S3)."""
        target = parse_s3_uri(_uri(path))
        if not target.key:
            raise ValueError(f"no object key in {os.fspath(path)!r}")
        self._checkpoint.client.delete(target.bucket, target.key, lane="checkpoint")

    def teardown(self) -> None:
        """Close the client this object made itself (Lightning calls this at the end of fitting)."""
        self._checkpoint.close()
