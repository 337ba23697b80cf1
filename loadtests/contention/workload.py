"""The clients of the contention benchmark: a latency probe, a trainer simulation, and the dataset loader.

Each runs as its own process on the client side of the testbed (``python -m loadtests.contention.workload
{setup,probe,trainer} --spec FILE``), so that the trainer's checkpoint writes never stall the probe's event
loop; the orchestrator (:mod:`.run`) writes the spec, the process writes its results as JSON. All times are
``time.monotonic()``, which every process on the machine shares (network namespaces do not change it), so
the orchestrator can lay the probe's samples over the trainer's checkpoint windows.

Theory of operation
-------------------
- **Requests** are SigV4-signed with the project's :func:`s3lanes.core.sigv4.sign_headers`
  (``UNSIGNED-PAYLOAD`` over plain HTTP, as the benchmark harness does) and sent with aiohttp
  (:mod:`loadtests.harness.s3client`). Object data are
  views into one random 8 MiB block at seed-dependent offsets: nothing compressible, nothing on disk.
- **The probe** is open loop: range GETs of ``range_bytes`` at ``rate_per_s``, each fired at its scheduled
  time whatever the others do, and its latency is completion minus *scheduled* start, so a stalled client
  does not hide a slow store (no coordinated omission). It runs until SIGTERM.
- **The trainer** is a loop at ``steps_per_s`` that takes ``samples_per_step`` samples per step from a
  DataLoader-like reader (``workers`` concurrent range GETs filling a queue of ``prefetch`` samples, which
  keeps fetching while the trainer saves), and every ``interval_s`` saves a checkpoint *synchronously*, as
  ``torch.save`` or a blocking DCP save does (:mod:`loadtests.harness.checkpoint`): ``shards`` objects written
  as multipart uploads by ``writers`` concurrent writers, then a small ``.metadata`` commit marker, the
  training loop blocked until all are acknowledged. Checkpoints go to ``ckpt_endpoint`` (default:
  ``endpoint``): in the separate-pools direct scenario that is a second store. Time lost to storage = time
  waiting for samples + time blocked in saves, over the trainer's wall time, counted after its first
  ``warmup_s`` (:class:`LostTime`): the loader's first samples wait for connections to open and the prefetch
  queue to fill, a one-off cost of the first seconds of a job that a 33 s segment would otherwise weigh as if
  it came with every checkpoint (the probe skips the same first second). That warm-up is reported on its own,
  and the fraction with it as well. Through a gateway with a spool, a background task then calls
  ``POST /_s3lanes/flush`` for the checkpoint's prefix, which answers once it is durable on the store;
  without one, acknowledged means durable.
- **Checkpoint clients** (``ckpt_client``): ``aiohttp`` (the signed client above, with retries on 5xx and
  transport errors, as training clients do) or ``botocore``: a botocore S3 client per writer process, its
  timeouts botocore's defaults (60 s connect, 60 s read) unless the spec sets them, and *no retries*, so a
  connection the gateway holds without progress for longer than a timeout is a client error, counted and
  reported, instead of a retry. Each part's body notes when http.client reads its next block (it does so
  once the previous one is in the socket): the longest pause between two, per part, is the longest time
  that connection moved no bytes; the wait from the last block to the answer is noted beside it.
- While it runs, the trainer also samples the gateway's ``/_s3lanes/status`` (lane byte counters, the write
  cap, the guard) every ``status_interval_s``: the gateway answers admin requests from loopback peers only,
  and the trainer is on the gateway's side of the testbed. With storage pools (the status has a ``pools``
  section) each sample holds every pool's lanes, and ``lanes`` sums them across pools.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import random
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import uvloop
from yarl import URL

from loadtests.contention.testbed import ACCESS_KEY, REGION, SECRET_KEY, write_json_atomic
from loadtests.harness.checkpoint import (
    METADATA_BYTES,
    CheckpointRecord,
    CheckpointShape,
    CheckpointWriter,
    marker_key,
    shard_key,
)
from loadtests.harness.s3client import S3, WorkloadError, new_session, pieces

FLUSH_TIMEOUT_S = 600.0
PROBE_DRAIN_S = 30.0  # after SIGTERM, how long in-flight probe requests may still finish
DURABLE_WAIT_S = 600.0
STALL_EVENT_S = 0.005  # waits for data shorter than this are not listed one by one (they are summed)
WARMUP_S = 1.0  # the trainer's first second (as the probe's, loadtests.contention.report.WARMUP_S)

GATEWAY_DURATION = re.compile(
    r'^s3lanes_request_duration_seconds_(?P<what>sum|count)\{lane="checkpoint",operation="(?P<operation>[^"]+)",'
    r'served_by="(?P<served_by>[^"]+)"\} (?P<value>\S+)$',
    re.M,
)


def signed_s3(endpoint_url: str, session: aiohttp.ClientSession) -> S3:
    """The S3 client of the workload processes: signed as the testbed's identity."""
    return S3(endpoint_url, session, access_key=ACCESS_KEY, secret_key=SECRET_KEY)


# --------------------------------------------------------------------------------------------------------
# botocore checkpoint writers


class TimedBody(io.BytesIO):
    """A part's bytes for botocore that notes when each block is read. http.client reads the next block
    only once the previous one is in the socket, so the longest pause between two reads of the last pass
    (an earlier pass hashes the payload for the signature; a seek to 0 starts the pass that is sent) is the
    longest time the connection moved no bytes."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[float] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads.append(time.monotonic())
        return super().read(size)

    def seek(self, pos: int, whence: int = 0, /) -> int:
        if pos == 0 and whence == 0:
            self.reads = []
        return super().seek(pos, whence)

    def max_gap_s(self) -> float:
        r = self.reads
        return max((b - a for a, b in itertools.pairwise(r)), default=0.0)


_BOTO_CLIENT: Any = None  # one per writer process (module state of the worker processes only)


def _boto_client(cfg: dict[str, Any]) -> Any:
    global _BOTO_CLIENT
    if _BOTO_CLIENT is None:
        import botocore.session
        from botocore.config import Config

        _BOTO_CLIENT = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=cfg["endpoint_url"],
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(
                connect_timeout=cfg["connect_timeout_s"],
                read_timeout=cfg["read_timeout_s"],
                retries={"max_attempts": 1, "mode": "standard"},
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
    return _BOTO_CLIENT


def boto_warm(cfg: dict[str, Any]) -> None:
    """Import botocore and build the client in a writer process before the run starts."""
    _boto_client(cfg)
    time.sleep(0.5)  # hold this worker, so that the next warm-up call starts another process


def boto_request(cfg: dict[str, Any], op: str, args: dict[str, Any]) -> dict[str, Any]:
    """One botocore request in a writer process: ``op`` is create, part, complete or put. Returns what the
    caller needs (``upload_id``, ``etag``; for a part its longest body pause and its wait for the answer)
    or ``error`` with the exception's text (botocore's exceptions do not all cross a process boundary)."""
    c = _boto_client(cfg)
    try:
        if op == "create":
            return {"upload_id": c.create_multipart_upload(**args)["UploadId"]}
        if op == "complete":
            c.complete_multipart_upload(**args)
            return {}
        if op == "put":
            seed = int(args.pop("seed", 0))
            c.put_object(**args, Body=b"".join(pieces(METADATA_BYTES, seed)))
            return {}
        size, seed = int(args.pop("size")), int(args.pop("seed"))
        body = TimedBody(b"".join(pieces(size, seed)))
        answer = c.upload_part(**args, Body=body)
        done = time.monotonic()
        last = body.reads[-1] if body.reads else done
        return {"etag": answer["ETag"], "part": [done, body.max_gap_s(), done - last, float(size)]}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


class BotoWriters:
    """botocore S3 clients for the checkpoint writers, each in a process of its own, as trainer ranks are
    (threads beside the data loader's event loop would compete with it for the GIL). No retries: every
    failed request is a client error, counted with its text."""

    def __init__(self, spec: dict[str, Any], endpoint_url: str) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.cfg = {
            "endpoint_url": endpoint_url,
            "connect_timeout_s": float(spec.get("boto_connect_timeout_s") or 60.0),
            "read_timeout_s": float(spec.get("boto_read_timeout_s") or 60.0),
        }
        self.writers = writers = int(spec["ckpt_writers"])
        self.pool = ProcessPoolExecutor(max_workers=writers, mp_context=multiprocessing.get_context("spawn"))
        self.errors: list[list[Any]] = []  # [at, what, error text]
        self.parts: list[list[float]] = []  # [at, longest pause in the body s, wait for the answer s, bytes]

    async def warm(self) -> None:
        """Start every writer process and its client now (importing botocore takes a while on a busy
        machine: it must not count into the first save)."""
        loop = asyncio.get_running_loop()
        n = self.writers
        await asyncio.gather(*(loop.run_in_executor(self.pool, boto_warm, self.cfg) for _ in range(n)))

    async def call(self, what: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        out: dict[str, Any] = await loop.run_in_executor(self.pool, boto_request, self.cfg, op, args)
        if "error" in out:
            self.errors.append([time.monotonic(), what, out["error"]])
            raise WorkloadError(f"{what}: {out['error']}")
        if "part" in out:
            self.parts.append(out["part"])
        return out

    async def write_shard(self, bucket: str, key: str, size: int, part_bytes: int, seed: int) -> None:
        ident = {"Bucket": bucket, "Key": key}
        upload_id = (await self.call(f"create {key}", "create", ident))["upload_id"]
        parts: list[dict[str, Any]] = []
        offset, number = 0, 1
        while offset < size:
            n = min(part_bytes, size - offset)
            args = {
                **ident,
                "UploadId": upload_id,
                "PartNumber": number,
                "size": n,
                "seed": seed * 7919 + number,
            }
            answer = await self.call(f"part {number} of {key}", "part", args)
            parts.append({"PartNumber": number, "ETag": answer["etag"]})
            offset += n
            number += 1
        done = {**ident, "UploadId": upload_id, "MultipartUpload": {"Parts": parts}}
        await self.call(f"complete {key}", "complete", done)

    async def put_marker(self, bucket: str, key: str, seed: int) -> None:
        await self.call(f"put {key}", "put", {"Bucket": bucket, "Key": key, "seed": seed})

    def summary(self) -> dict[str, Any]:
        gaps = [p[1] for p in self.parts]
        waits = [p[2] for p in self.parts]
        return {
            "client": "botocore",
            "errors": self.errors,
            "parts": self.parts,
            "parts_sent": len(self.parts),
            "max_body_pause_s": max(gaps, default=None),
            "max_answer_wait_s": max(waits, default=None),
        }

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class BotoCheckpointWriter(CheckpointWriter):
    """Checkpoint saves whose shards and marker go through the botocore writers (no retries)."""

    def __init__(self, s3: S3, shape: CheckpointShape, counters: dict[str, int], boto: BotoWriters) -> None:
        super().__init__(s3, shape, counters)
        self.boto = boto

    async def write_shard(self, prefix: str, shard: int, seed: int) -> None:
        shape = self.shape
        await self.boto.write_shard(
            shape.bucket, shard_key(prefix, shard), shape.shard_bytes, shape.part_bytes, seed
        )

    async def put_marker(self, prefix: str, index: int) -> None:
        await self.boto.put_marker(self.shape.bucket, marker_key(prefix), index)


# --------------------------------------------------------------------------------------------------------
# Dataset


@dataclass(frozen=True, slots=True)
class DatasetObject:
    key: str
    size_bytes: int


def dataset_objects(spec: dict[str, Any]) -> list[DatasetObject]:
    return [DatasetObject(k, int(s)) for k, s in spec["objects"]]


class SampleChooser:
    """Random aligned ranges over the dataset objects, from a seeded RNG (the same sequence every run)."""

    def __init__(self, objects: list[DatasetObject], range_bytes: int, seed: int) -> None:
        self._objects = objects
        self._range = range_bytes
        self._rng = random.Random(seed)

    def next(self) -> tuple[str, int]:
        obj = self._rng.choice(self._objects)
        slots = max(1, obj.size_bytes // self._range)
        return obj.key, self._rng.randrange(slots) * self._range


async def setup_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Upload the dataset objects (``count`` x ``size_bytes``) straight to the store, 4 at a time."""
    t0 = time.monotonic()
    keys = [f"train/shard-{i:05d}.tar" for i in range(int(spec["count"]))]
    size = int(spec["size_bytes"])
    sem = asyncio.Semaphore(4)
    async with new_session() as session:
        s3 = signed_s3(spec["endpoint"], session)

        async def one(i: int, key: str) -> None:
            async with sem:
                await s3.put(spec["bucket"], key, pieces(size, 1000 + i))

        await asyncio.gather(*(one(i, k) for i, k in enumerate(keys)))
    return {"objects": [[k, size] for k in keys], "seconds": time.monotonic() - t0}


# --------------------------------------------------------------------------------------------------------
# The probe


async def probe_main(spec: dict[str, Any], stop: asyncio.Event) -> dict[str, Any]:
    rate = float(spec["rate_per_s"])
    range_bytes = int(spec["range_bytes"])
    chooser = SampleChooser(dataset_objects(spec), range_bytes, int(spec["seed"]))
    bucket = spec["bucket"]
    samples: list[list[Any]] = []  # [scheduled_at, latency_ms or None, error text or None]
    tasks: set[asyncio.Task[None]] = set()
    async with new_session() as session:
        s3 = signed_s3(spec["endpoint"], session)

        async def one(at: float, key: str, offset: int) -> None:
            err: str | None = None
            try:
                await s3.get_range(bucket, key, offset, range_bytes)
            except (WorkloadError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                err = f"{type(exc).__name__}: {exc}"[:200]
            done = time.monotonic()
            samples.append([at, None if err else (done - at) * 1000.0, err])

        start_at = float(spec["start_at"])
        late_s = max(0.0, time.monotonic() - start_at)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start_at - time.monotonic()))
        period = 1.0 / rate
        t = max(start_at, time.monotonic())
        while not stop.is_set():
            delay = t - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            key, offset = chooser.next()
            task = asyncio.create_task(one(t, key, offset))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            t += period
        if tasks:
            await asyncio.wait(set(tasks), timeout=PROBE_DRAIN_S)
        for task in set(tasks):
            task.cancel()
    samples.sort(key=lambda s: s[0])
    return {"samples": samples, "late_start_s": late_s, "rate_per_s": rate, "range_bytes": range_bytes}


# --------------------------------------------------------------------------------------------------------
# The trainer


class LostTime:
    """The trainer's account of time lost to storage (pure: the caller passes the clock's readings).

    Waits for data that begin in the first ``warmup_s`` after ``t0`` are the warm-up (connections opening,
    the prefetch queue filling) and are kept apart; the steady-state fraction is (later waits + saves) over
    the wall time after the warm-up. The fraction with the warm-up counted in is reported beside it.
    """

    def __init__(self, t0: float, warmup_s: float) -> None:
        self.t0 = t0
        self.warmup_s = max(0.0, warmup_s)
        self.stall_s = 0.0
        self.warmup_stall_s = 0.0
        self.save_s = 0.0
        self.stall_events: list[list[float]] = []  # [at, seconds] of waits for data >= STALL_EVENT_S

    def stalled(self, at: float, seconds: float) -> None:
        if at < self.t0 + self.warmup_s:
            self.warmup_stall_s += seconds
        else:
            self.stall_s += seconds
        if seconds >= STALL_EVENT_S:
            self.stall_events.append([at, seconds])

    def saved(self, seconds: float) -> None:
        self.save_s += seconds

    def summary(self, end: float) -> dict[str, Any]:
        wall_s = end - self.t0
        measured_s = wall_s - self.warmup_s
        lost_s = self.stall_s + self.save_s
        with_warmup_s = lost_s + self.warmup_stall_s
        return {
            "wall_s": wall_s,
            "warmup_s": self.warmup_s,
            "warmup_stall_s": self.warmup_stall_s,
            "stall_s": self.stall_s,
            "save_s": self.save_s,
            "lost_s": lost_s,
            "lost_fraction": lost_s / measured_s if measured_s > 0 else None,
            "lost_fraction_with_warmup": with_warmup_s / wall_s if wall_s > 0 else None,
        }


class Trainer:
    def __init__(self, spec: dict[str, Any], session: aiohttp.ClientSession) -> None:
        self.spec = spec
        self.s3 = signed_s3(spec["endpoint"], session)
        self.ckpt_s3 = signed_s3(spec.get("ckpt_endpoint") or spec["endpoint"], session)
        self.ckpt_s3.timings = {}
        self.session = session
        self.loader_latencies: list[list[float]] = []  # [requested_at, latency_ms]
        self.loader_errors = 0
        self.counters: dict[str, int] = {}
        self.checkpoints: list[CheckpointRecord] = []
        self.status_samples: list[dict[str, Any]] = []
        self.steps = 0
        self.boto = (
            BotoWriters(spec, spec.get("ckpt_endpoint") or spec["endpoint"])
            if spec.get("ckpt_client") == "botocore"
            else None
        )
        shape = CheckpointShape(
            bucket=spec["ckpt_bucket"],
            prefix=spec["ckpt_prefix"],
            shards=int(spec["ckpt_shards"]),
            shard_bytes=int(spec["ckpt_shard_bytes"]),
            part_bytes=int(spec["ckpt_part_bytes"]),
            writers=int(spec["ckpt_writers"]),
        )
        self.writer = (
            CheckpointWriter(self.ckpt_s3, shape, self.counters)
            if self.boto is None
            else BotoCheckpointWriter(self.ckpt_s3, shape, self.counters, self.boto)
        )

    # -- the data loader -------------------------------------------------------------------------------

    async def loader(self, queue: asyncio.Queue[int], worker: int) -> None:
        sp = self.spec
        size = int(sp["sample_bytes"])
        chooser = SampleChooser(dataset_objects(sp), size, int(sp["seed"]) * 1000 + worker)
        while True:
            key, offset = chooser.next()
            t = time.monotonic()
            try:
                await self.s3.get_range(sp["bucket"], key, offset, size)
            except (WorkloadError, aiohttp.ClientError, OSError, TimeoutError):
                self.loader_errors += 1
                await asyncio.sleep(0.1)
                continue
            self.loader_latencies.append([t, (time.monotonic() - t) * 1000.0])
            await queue.put(size)

    # -- checkpoints -----------------------------------------------------------------------------------

    async def save(self, index: int) -> CheckpointRecord:
        return await self.writer.save(index)

    async def wait_durable(self, rec: CheckpointRecord) -> None:
        """Through a spooling gateway: the flush API answers once the checkpoint is on the store."""
        sp = self.spec
        q = f"bucket={sp['ckpt_bucket']}&prefix={quote(rec.prefix, safe='')}&timeout={FLUSH_TIMEOUT_S:g}"
        url = URL(f"{sp['gateway_url']}/_s3lanes/flush?{q}", encoded=True)
        try:
            async with self.session.post(url) as resp:
                doc = await resp.json(content_type=None)
                if resp.status == 200 and doc.get("durable"):
                    rec.durable_at = time.monotonic()
                rec.flush = {"status": resp.status, **{k: doc.get(k) for k in ("durable", "waited_s")}}
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            rec.flush = {"error": f"{type(exc).__name__}: {exc}"[:300]}

    async def gateway_durations(self) -> dict[str, dict[str, float]]:
        """The gateway's own account of the checkpoint lane's requests so far (cumulative over the run):
        ``s3lanes_request_duration_seconds`` sum and count by operation and what served it."""
        url = f"{self.spec['gateway_url']}/_s3lanes/metrics"
        try:
            async with self.session.get(url) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return {}
        out: dict[str, dict[str, float]] = {}
        for m in GATEWAY_DURATION.finditer(text):
            op = f"{m['operation']} ({m['served_by']})"
            out.setdefault(op, {})[m["what"]] = float(m["value"])
        return out

    # -- gateway status --------------------------------------------------------------------------------

    async def sample_status(self, stop: asyncio.Event) -> None:
        sp = self.spec
        url = f"{sp['gateway_url']}/_s3lanes/status"
        interval = float(sp["status_interval_s"])
        while not stop.is_set():
            try:
                async with self.session.get(url) as resp:
                    doc = await resp.json(content_type=None)
                at = time.monotonic()
                spool = doc.get("spool") or {}
                # One scheduler per bottleneck; "scheduler" is the default pool's, as without pools.
                schedulers = (doc.get("pools") or {}).get("schedulers") or {"default": doc["scheduler"]}
                pools = {name: _scheduler_sample(sch) for name, sch in schedulers.items()}
                self.status_samples.append(
                    {
                        "at": at,
                        **{k: pools["default"][k] for k in _DEFAULT_POOL_FIELDS},
                        # the lowest multiplier of any pool's guard
                        "guard_multiplier": min(
                            (m for p in pools.values() if (m := p["guard_multiplier"]) is not None),
                            default=None,
                        ),
                        "lanes": _sum_lanes(p["lanes"] for p in pools.values()),
                        "pools": pools,
                        "spool_pending_bytes": spool.get("pending_bytes"),
                        "spool_deadline": {
                            k: ((spool.get("drain") or {}).get("deadline") or {}).get(k)
                            for k in ("deadline_s", "floor_fraction", "at_risk", "projected_durable_s")
                        },
                    }
                )
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError):
                self.counters["status_errors"] = self.counters.get("status_errors", 0) + 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    # -- the loop ----------------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        sp = self.spec
        step_s = 1.0 / float(sp["steps_per_s"])
        per_step = int(sp["samples_per_step"])
        first_at, interval = float(sp["ckpt_first_at_s"]), float(sp["ckpt_interval_s"])
        count = int(sp["ckpt_count"])
        duration = first_at + count * interval
        status_stop = asyncio.Event()
        background: list[asyncio.Task[None]] = []
        if sp.get("gateway_url"):
            background.append(asyncio.create_task(self.sample_status(status_stop)))
        if self.boto is not None:
            await self.boto.warm()
        start_at = float(sp["start_at"])
        late_s = max(0.0, time.monotonic() - start_at)
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        queue: asyncio.Queue[int] = asyncio.Queue(int(sp["prefetch"]))
        loaders = [asyncio.create_task(self.loader(queue, w)) for w in range(int(sp["workers"]))]
        durable: list[asyncio.Task[None]] = []
        t0 = time.monotonic()
        account = LostTime(t0, float(sp.get("warmup_s", WARMUP_S)))
        next_ckpt = t0 + first_at
        done_ckpts = 0
        t_end = t0
        try:
            while True:
                now = time.monotonic()
                if done_ckpts < count and now >= next_ckpt:
                    rec = await self.save(done_ckpts)
                    self.checkpoints.append(rec)
                    account.saved(rec.save_end - rec.save_start)
                    if rec.error is None:
                        if sp.get("flush"):
                            durable.append(asyncio.create_task(self.wait_durable(rec)))
                        else:
                            rec.durable_at = rec.save_end
                    done_ckpts += 1
                    next_ckpt = t0 + first_at + done_ckpts * interval
                    continue
                if now - t0 >= duration and done_ckpts >= count:
                    break
                t_wait = time.monotonic()
                for _ in range(per_step):
                    await queue.get()
                account.stalled(t_wait, time.monotonic() - t_wait)
                await asyncio.sleep(step_s)  # the GPU computes
                self.steps += 1
            t_end = time.monotonic()
        finally:
            for task in loaders:
                task.cancel()
            await asyncio.gather(*loaders, return_exceptions=True)
        if durable:
            await asyncio.wait(durable, timeout=DURABLE_WAIT_S)
        end = time.monotonic()
        status_stop.set()
        await asyncio.gather(*background, return_exceptions=True)
        lost = account.summary(t_end)
        served = await self.gateway_durations() if sp.get("gateway_url") else {}
        return {
            "t0": t0,
            "end": end,
            "late_start_s": late_s,
            **lost,
            "steps": self.steps,
            "step_s": step_s,
            "overhead_s": lost["wall_s"] - lost["lost_s"] - lost["warmup_stall_s"] - self.steps * step_s,
            "checkpoints": [c.as_json() for c in self.checkpoints],
            "save_request_ms": self.ckpt_s3.timings,
            "gateway_request_durations": served,
            "stall_events": account.stall_events,
            "loader_latencies": self.loader_latencies,
            "loader_errors": self.loader_errors,
            "counters": self.counters,
            "status_samples": self.status_samples,
            "ckpt_client": self.boto.summary() if self.boto is not None else {"client": "aiohttp"},
        }


_DEFAULT_POOL_FIELDS = ("capacity_bps", "reads_active", "inflight_bytes")


def _scheduler_sample(sch: dict[str, Any]) -> dict[str, Any]:
    """What the report needs of one scheduler's snapshot (``/_s3lanes/status``)."""
    return {
        "capacity_bps": sch.get("capacity_bps"),
        "reads_active": sch.get("reads_active"),
        "guard_multiplier": sch.get("guard_multiplier"),
        "inflight_bytes": sch.get("inflight_bytes"),
        "lanes": {
            ln["name"]: {
                "delivered": ln.get("delivered_bytes_total", 0),
                "queued": ln.get("queued_tickets", 0),
                "limit_bps": ln.get("limit_bps"),
                "share": ln.get("achieved_share"),
            }
            for ln in sch.get("lanes", [])
        },
    }


def _sum_lanes(per_pool: Any) -> dict[str, dict[str, Any]]:
    """Lanes across pools: delivered bytes and queued tickets added; limit and share are per pool (None)."""
    out: dict[str, dict[str, Any]] = {}
    pools = list(per_pool)
    if len(pools) == 1:
        return dict(pools[0])
    for lanes in pools:
        for name, ln in lanes.items():
            acc = out.setdefault(name, {"delivered": 0, "queued": 0, "limit_bps": None, "share": None})
            acc["delivered"] += ln["delivered"] or 0
            acc["queued"] += ln["queued"] or 0
    return out


async def trainer_main(spec: dict[str, Any]) -> dict[str, Any]:
    async with new_session() as session:
        trainer = Trainer(spec, session)
        try:
            return await trainer.run()
        finally:
            if trainer.boto is not None:
                trainer.boto.close()


# --------------------------------------------------------------------------------------------------------
# Entry point


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.contention.workload")
    p.add_argument("role", choices=("setup", "probe", "trainer"))
    p.add_argument("--spec", type=Path, required=True, help="JSON written by the orchestrator")
    p.add_argument("--out", type=Path, required=True, help="where to write the results (JSON)")
    a = p.parse_args(argv)
    spec: dict[str, Any] = json.loads(a.spec.read_text())

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        if a.role == "setup":
            return await setup_main(spec)
        if a.role == "probe":
            return await probe_main(spec, stop)
        trainer = asyncio.create_task(trainer_main(spec))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({trainer, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not trainer.done():  # told to stop: the orchestrator gave up on this segment
            trainer.cancel()
            raise SystemExit(3)
        stopper.cancel()
        return trainer.result()

    doc = uvloop.run(run())
    write_json_atomic(a.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
