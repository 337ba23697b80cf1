"""Create the dataset objects the Locust ``DatasetReader`` users read.

::

    python -m loadtests.dataprep --host http://127.0.0.1:9000 --bucket train --prefix locust-dataset/ \\
        --objects 64 --size 16MiB

Objects are ``<prefix>train-000000.tar`` ... (:func:`dataset_key`, the names the readers compute), each
filled with pseudo-random bytes seeded by its index, so every run writes the same content. Idempotent: the
prefix is listed once and objects already there with the right size are skipped; only missing or
different-sized ones are written. The bucket is created if it does not exist (``--no-create-bucket`` to
refuse instead). Uploads run ``--concurrency`` at a time through the project's client
(:class:`clients.GatewayClient`, so they are retried on 503 SlowDown), with ``x-s3lanes-write-through`` so
that through a spooling gateway the dataset is on the store when the command returns (a plain store
ignores the header). Credentials: ``--access-key``/``--secret-key``, else ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, else botocore's usual chain.

This module imports no Locust (which would monkey-patch the process with gevent).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from botocore.exceptions import ClientError

from s3lanes.config import parse_size
from s3lanes_client import ClientConfig, GatewayClient

MIB = 1024 * 1024
DEFAULT_PREFIX = "locust-dataset/"
DEFAULT_OBJECTS = 64
DEFAULT_OBJECT_SIZE = "16MiB"
# Objects up to this size are one PutObject; larger ones stream through a multipart writer in parts of it.
SINGLE_PUT_MAX_BYTES = 64 * MIB
STREAM_PIECE_BYTES = 8 * MIB


def normalise_prefix(prefix: str) -> str:
    """``"a/b"`` -> ``"a/b/"``; ``""`` stays ``""`` (objects at the bucket root)."""
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def dataset_key(prefix: str, index: int) -> str:
    """The key of dataset object ``index``: a WebDataset-style shard name, which the gateway classifies
    into the ``dataset`` lane by default (docs/lanes.md)."""
    return f"{normalise_prefix(prefix)}train-{index:06d}.tar"


def object_bytes(seed: int, index: int, start: int, length: int) -> bytes:
    """Bytes ``[start, start + length)`` of object ``index``: pseudo-random (incompressible), seeded, so a
    re-run writes identical objects. Generated piece by piece for large objects."""
    rng = random.Random(f"{seed}:{index}:{start}")
    return rng.randbytes(length)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run has to write: object indices missing (or with the wrong size) under the prefix."""

    to_write: tuple[int, ...]
    present: int


def plan(existing: Mapping[str, int], prefix: str, objects: int, size_bytes: int) -> Plan:
    """Pure: compare the listing (key -> size) with what the dataset should be."""
    missing = tuple(i for i in range(objects) if existing.get(dataset_key(prefix, i)) != size_bytes)
    return Plan(to_write=missing, present=objects - len(missing))


def _upload(client: GatewayClient, bucket: str, prefix: str, index: int, size_bytes: int, seed: int) -> int:
    key = dataset_key(prefix, index)
    if size_bytes <= SINGLE_PUT_MAX_BYTES:
        client.put_bytes(bucket, key, object_bytes(seed, index, 0, size_bytes), lane=None, write_through=True)
        return size_bytes
    with client.open_writer(
        bucket, key, part_size_bytes=STREAM_PIECE_BYTES, max_inflight_parts=2, lane=None, write_through=True
    ) as w:
        for start in range(0, size_bytes, STREAM_PIECE_BYTES):
            w.write(object_bytes(seed, index, start, min(STREAM_PIECE_BYTES, size_bytes - start)))
    return size_bytes


def _ensure_bucket(client: GatewayClient, bucket: str, create: bool) -> None:
    try:
        client.call("head_bucket", Bucket=bucket, lane=None)
        return
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status != 404:
            raise
    if not create:
        raise SystemExit(f"bucket {bucket!r} does not exist (and --no-create-bucket was given)")
    client.call("create_bucket", Bucket=bucket, lane=None)


def prepare(
    client: GatewayClient,
    *,
    bucket: str,
    prefix: str,
    objects: int,
    size_bytes: int,
    concurrency: int,
    seed: int = 0,
    create_bucket: bool = True,
    progress: bool = True,
) -> Plan:
    """Make the dataset complete; returns what had to be written."""
    _ensure_bucket(client, bucket, create_bucket)
    existing = {o.key: o.size for o in client.list_objects(bucket, normalise_prefix(prefix), lane=None)}
    todo = plan(existing, prefix, objects, size_bytes)
    if not todo.to_write:
        return todo
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = [pool.submit(_upload, client, bucket, prefix, i, size_bytes, seed) for i in todo.to_write]
        for fut in as_completed(futures):
            fut.result()  # the first failure propagates (the pool finishes the rest first)
            done += 1
            if progress and (done % max(1, len(futures) // 10) == 0 or done == len(futures)):
                print(f"  {done}/{len(futures)} objects written", file=sys.stderr)
    return todo


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.dataprep",
        description="Create the dataset objects the Locust DatasetReader users read (idempotent).",
    )
    p.add_argument("--host", default=os.environ.get("S3LANES_ENDPOINT_URL"), help="S3 endpoint URL")
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", default=DEFAULT_PREFIX)
    p.add_argument("--objects", type=int, default=DEFAULT_OBJECTS)
    p.add_argument("--size", default=DEFAULT_OBJECT_SIZE, help="size of each object, e.g. 16MiB")
    p.add_argument("--concurrency", type=int, default=8, help="uploads in flight")
    p.add_argument("--seed", type=int, default=0, help="content seed (same seed, same bytes)")
    p.add_argument("--access-key", default=os.environ.get("AWS_ACCESS_KEY_ID"))
    p.add_argument("--secret-key", default=os.environ.get("AWS_SECRET_ACCESS_KEY"))
    p.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    p.add_argument("--no-create-bucket", action="store_true", help="fail if the bucket does not exist")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.host:
        raise SystemExit("give --host (or set S3LANES_ENDPOINT_URL)")
    if args.objects < 0:
        raise SystemExit("--objects cannot be negative")
    size_bytes = int(parse_size(args.size))
    if (args.access_key is None) != (args.secret_key is None):
        raise SystemExit("give both an access key and a secret key, or neither")
    config = ClientConfig(
        endpoint_url=args.host,
        region=args.region,
        access_key=args.access_key,
        secret_key=args.secret_key,
        max_pool_connections=max(1, args.concurrency),
        # SeaweedFS mishandles Expect: 100-continue on empty bodies; a dataset may have empty objects
        expect_100_continue=size_bytes > 0,
    )
    t0 = time.monotonic()
    with GatewayClient(config) as client:
        todo = prepare(
            client,
            bucket=args.bucket,
            prefix=args.prefix,
            objects=args.objects,
            size_bytes=size_bytes,
            concurrency=args.concurrency,
            seed=args.seed,
            create_bucket=not args.no_create_bucket,
            progress=not args.quiet,
        )
    elapsed_s = time.monotonic() - t0
    written = len(todo.to_write)
    print(
        f"dataset s3://{args.bucket}/{normalise_prefix(args.prefix)}: {args.objects} objects of "
        f"{size_bytes} bytes; wrote {written} ({written * size_bytes / 1e6:.1f} MB), "
        f"{todo.present} already present, in {elapsed_s:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
