"""The PyTorch side of the client through the real gateway: datasets under a multi-worker DataLoader,
``save_checkpoint``/``load_checkpoint`` streamed through multipart, Distributed Checkpoint save/load of a
model and its optimizer, and a checkpoint written while dataset reads run."""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
import tracemalloc
import warnings
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.utils.data import DataLoader

from s3lanes_client import ClientConfig, GatewayClient, Lane
from s3lanes_client.torch import (
    S3Item,
    S3IterableDataset,
    S3MapDataset,
    S3StorageReader,
    S3StorageWriter,
    Sample,
    load_checkpoint,
    save_checkpoint,
)
from tests.e2e.conftest import Gateway
from tests.e2e.test_client_sync import gateway_config, plain_s3_config

pytestmark = pytest.mark.e2e

KiB = 1024
MiB = 1024 * KiB
SAMPLES = 1000


def upload(backend: Any, bucket: str, objects: dict[str, bytes]) -> None:
    """Straight to SeaweedFS, in parallel: the data set exists before and independently of the gateway."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: backend.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()))


def sample_bytes(i: int) -> bytes:
    """Distinct, checkable content of varying size (200 B to ~2.2 KiB)."""
    return hashlib.sha256(str(i).encode()).digest() * (7 + i % 64)


def key_and_digest(sample: Sample) -> tuple[str, str]:
    """A transform (module level, so the dataset pickles into spawn workers too)."""
    return sample.key, hashlib.sha256(sample.data).hexdigest()


def offset_and_bytes(sample: Sample) -> tuple[str, int, bytes]:
    return sample.key, sample.offset, sample.data


@pytest.fixture
def thousand_samples(backend: Any, bucket: str) -> dict[str, bytes]:
    objects = {f"train/{i:05d}.bin": sample_bytes(i) for i in range(SAMPLES)}
    upload(backend, bucket, objects)
    return objects


def test_dataloader_with_two_workers_reads_1000_samples_byte_exact_once_each(
    gateway: Gateway, bucket: str, thousand_samples: dict[str, bytes]
) -> None:
    dataset: S3IterableDataset[tuple[str, str]] = S3IterableDataset(
        bucket, prefix="train/", transform=key_and_digest, config=gateway_config(gateway), readahead=16
    )
    loader = DataLoader(dataset, batch_size=50, num_workers=2)
    seen: Counter[str] = Counter()
    for keys, digests in loader:
        for key, digest in zip(keys, digests, strict=True):
            assert digest == hashlib.sha256(thousand_samples[key]).hexdigest(), key
            seen[key] += 1
    assert set(seen) == set(thousand_samples)
    assert set(seen.values()) == {1}


def test_iterable_dataset_shards_by_rank_and_shuffles_per_epoch(
    gateway: Gateway, backend: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = {f"s/{i:03d}": sample_bytes(i) for i in range(30)}
    upload(backend, bucket, objects)
    config = gateway_config(gateway)

    def keys_of(**kwargs: Any) -> list[str]:
        ds: S3IterableDataset[Any] = S3IterableDataset(bucket, prefix="s/", config=config, **kwargs)
        return [key for key, _ in ds]

    rank0, rank1 = keys_of(rank=0, world_size=2), keys_of(rank=1, world_size=2)
    assert sorted(rank0 + rank1) == sorted(objects) and not set(rank0) & set(rank1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert keys_of() == rank1  # torch.distributed is not initialised: the environment decides
    shuffled: S3IterableDataset[Any] = S3IterableDataset(
        bucket, prefix="s/", config=config, shuffle=True, seed=5, rank=0, world_size=1, readahead=0
    )
    epoch0 = [k for k, _ in shuffled]
    shuffled.set_epoch(1)
    epoch1 = [k for k, _ in shuffled]
    assert sorted(epoch0) == sorted(epoch1) == sorted(objects)
    assert epoch0 != epoch1


def test_map_dataset_reads_fixed_size_records_with_range_gets(
    gateway: Gateway, backend: Any, bucket: str
) -> None:
    record = 1000
    shards = {f"packed/{n}.bin": os.urandom(record * 50 + (0 if n else 123)) for n in range(4)}
    upload(backend, bucket, shards)
    dataset: S3MapDataset[tuple[str, int, bytes]] = S3MapDataset(
        bucket,
        prefix="packed/",
        record_bytes=record,
        transform=offset_and_bytes,
        config=gateway_config(gateway),
    )
    assert len(dataset) == 4 * 50 + 1  # the first shard has a short 123-byte tail record
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, collate_fn=list)
    got = sorted(sample for batch in loader for sample in batch)
    assert len(got) == len(dataset)
    for key, offset, data in got:
        assert data == shards[key][offset : offset + record]
    explicit: S3MapDataset[tuple[str, int, bytes]] = S3MapDataset(
        bucket,
        items=[S3Item("packed/1.bin", 10, 20), S3Item("packed/2.bin")],
        transform=offset_and_bytes,
        config=gateway_config(gateway),
    )
    assert explicit[0] == ("packed/1.bin", 10, shards["packed/1.bin"][10:20])
    assert explicit[1][2] == shards["packed/2.bin"]


def test_datasets_pickle_without_their_client_after_use(gateway: Gateway, backend: Any, bucket: str) -> None:
    upload(backend, bucket, {"p/a": b"a", "p/b": b"bb"})
    config = gateway_config(gateway)
    mapped: S3MapDataset[Any] = S3MapDataset(bucket, prefix="p/", config=config)
    streamed: S3IterableDataset[Any] = S3IterableDataset(bucket, prefix="p/", config=config)
    assert mapped[1] == ("p/b", b"bb")
    assert list(streamed) == [("p/a", b"a"), ("p/b", b"bb")]
    for dataset in (mapped, streamed):  # both now hold a live client (sockets, locks) internally
        copy = pickle.loads(pickle.dumps(dataset))
        assert list(copy) == [("p/a", b"a"), ("p/b", b"bb")]
    # Forked workers inherit the parent's client object; each must open its own.
    loader = DataLoader(streamed, batch_size=None, num_workers=2)
    assert sorted(tuple(sample) for sample in loader) == [("p/a", b"a"), ("p/b", b"bb")]


def test_save_checkpoint_streams_multipart_without_holding_it_twice(gateway: Gateway, bucket: str) -> None:
    weights = torch.randn(24 * MiB // 4)  # 24 MiB of tensor data
    state = {"weights": weights, "step": 7, "name": "run7"}
    uri = f"s3://{bucket}/ckpt/run7/step_7/model.pt"
    with GatewayClient(gateway_config(gateway)) as client:
        tracemalloc.start()
        try:
            etag = save_checkpoint(state, uri, client=client, part_size_bytes=5 * MiB, max_inflight_parts=1)
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # (1 in flight + 1 filling) x 5 MiB plus request overheads: well under a second copy of 24 MiB.
        assert peak_bytes < 16 * MiB, peak_bytes
        assert etag.endswith("-5")  # 24 MiB and a little, in 5 MiB parts
        loaded = load_checkpoint(uri, client=client)
        assert torch.equal(loaded["weights"], weights)
        assert (loaded["step"], loaded["name"]) == (7, "run7")
        response = client.call(
            "head_object", Bucket=bucket, Key="ckpt/run7/step_7/model.pt", lane=Lane.RESTORE
        )
        assert response["ResponseMetadata"]["HTTPHeaders"]["x-s3lanes-lane"] == "restore"


def test_checkpoint_save_while_dataset_reads_run(
    gateway: Gateway, bucket: str, thousand_samples: dict[str, bytes]
) -> None:
    """A streamed checkpoint save and a 2-worker DataLoader share the gateway: both finish, both exact."""
    config = gateway_config(gateway)
    dataset: S3IterableDataset[tuple[str, str]] = S3IterableDataset(
        bucket, prefix="train/", transform=key_and_digest, config=config
    )
    reads: Counter[str] = Counter()
    errors: list[BaseException] = []
    reading, saved = threading.Event(), threading.Event()

    def read_epochs() -> None:
        try:
            while not saved.is_set():  # whole epochs until the save is done
                for keys, digests in DataLoader(dataset, batch_size=20, num_workers=2):
                    for key, digest in zip(keys, digests, strict=True):
                        assert digest == hashlib.sha256(thousand_samples[key]).hexdigest()
                        reads[key] += 1
                    reading.set()
        except BaseException as exc:
            errors.append(exc)
            reading.set()

    reader = threading.Thread(target=read_epochs)
    reader.start()
    try:
        assert reading.wait(60)
        state = {"w": torch.randn(6 * MiB // 4), "b": torch.arange(1000)}
        reads_before = sum(reads.values())
        save_checkpoint(
            state, f"s3://{bucket}/ckpt/concurrent/model.pt", config=config, part_size_bytes=5 * MiB
        )
        reads_during = sum(reads.values()) - reads_before
    finally:
        saved.set()
        reader.join(120)
    assert not errors, errors
    assert not reader.is_alive()
    assert reads_during > 0  # the save did not stop the readers
    assert set(reads) == set(thousand_samples)
    assert len(set(reads.values())) == 1  # whole epochs: every sample read equally often
    loaded = load_checkpoint(f"s3://{bucket}/ckpt/concurrent/model.pt", config=config)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])


def small_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):  # populate the optimizer's moments
        optimizer.zero_grad()
        model(torch.randn(4, 32)).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


@pytest.fixture
def dcp_single_process() -> Iterator[None]:
    """DCP warns that no process group is initialised (the single-process case tested here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def record_writes(client: GatewayClient) -> list[tuple[str, str]]:
    """(operation, key) of every completed object write through ``client``, in completion order."""
    done: list[tuple[str, str]] = []

    def remember_key(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["test_key"] = params.get("Key")

    def note(model: Any, context: dict[str, Any], **_: Any) -> None:
        if model.name in ("PutObject", "CompleteMultipartUpload"):
            done.append((model.name, str(context.get("test_key"))))

    client.s3.meta.events.register("before-parameter-build.s3", remember_key)
    client.s3.meta.events.register("after-call.s3", note)
    return done


@pytest.mark.parametrize("target", ["gateway", "plain-s3"])
def test_dcp_save_and_load_model_and_optimizer(
    gateway: Gateway, seaweed: Any, bucket: str, target: str, dcp_single_process: None
) -> None:
    config: ClientConfig = gateway_config(gateway) if target == "gateway" else plain_s3_config(seaweed)
    model, optimizer = small_model()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    uri = f"s3://{bucket}/ckpt/dcp/step_3"
    with GatewayClient(config) as client:
        writes = record_writes(client)
        dcp_save(
            {"model": model_sd, "optim": optim_sd},
            storage_writer=S3StorageWriter(uri, client=client, thread_count=2),
        )
        keys = [o.key for o in client.list_objects(bucket, "ckpt/dcp/step_3/")]
        assert keys == [
            "ckpt/dcp/step_3/.metadata",
            "ckpt/dcp/step_3/__0_0.distcp",
            "ckpt/dcp/step_3/__0_1.distcp",
        ]
        assert writes[-1] == ("PutObject", "ckpt/dcp/step_3/.metadata")  # the manifest is written last
        assert sorted(k for _, k in writes[:-1]) == keys[1:]

        fresh_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=1e-3)
        fresh_model_sd, fresh_optim_sd = get_state_dict(fresh_model, fresh_optimizer)
        dcp_load(
            {"model": fresh_model_sd, "optim": fresh_optim_sd},  # loaded in place
            storage_reader=S3StorageReader(uri, client=client, coalesce_bytes=8 * KiB),
        )
        set_state_dict(
            fresh_model, fresh_optimizer, model_state_dict=fresh_model_sd, optim_state_dict=fresh_optim_sd
        )

    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh_model.state_dict()[name], tensor), name
    restored = fresh_optimizer.state_dict()
    original = optimizer.state_dict()
    assert restored["param_groups"] == original["param_groups"]
    for param_id, moments in original["state"].items():
        for field, value in moments.items():
            assert torch.equal(restored["state"][param_id][field], value), (param_id, field)
