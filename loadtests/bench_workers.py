"""Scaling with ``[server] workers``: req/s and CPU of small GETs through one gateway run with 1, 2, ... N
worker processes, and the MD5 rate the spool's acknowledgement path can reach on 1..N cores.

GETs: one SeaweedFS (pinned to ``--store-cpus``), objects uploaded to it directly, then for each worker count
a gateway (``[spool] enabled = false``, pinned to ``--gateway-cpus``, every worker with it) read by the
benchmark's lean client (its own SigV4 per request, keep-alive; this process pinned to ``--client-cpus``)
with ``--concurrency`` connections for ``--seconds`` per round. The rounds of the worker counts are
interleaved (1, 2, 4, 4, 2, 1, ...), so a shared machine's changing load hits every count alike. Each round
records the user+sys CPU of the gateway (the supervisor and all its workers), SeaweedFS and the client.

MD5: the spool hashes every acknowledged byte with MD5 (the ETag) on its I/O threads; MD5 is serial within
one object, so one object's ack rate is one core's MD5 rate, and a node acknowledges ``min(objects in
flight, cores it may use)`` times that. ``--md5`` measures hashlib's MD5 over 8 MiB pieces in 1..N threads
at once (hashlib releases the GIL on large buffers), each thread hashing its own stream.

    PYTHONPATH=. .venv/bin/python -m loadtests.bench_workers --workers 1,2 --seconds 10 --rounds 2
    PYTHONPATH=. .venv/bin/python -m loadtests.bench_workers --md5 --threads 1,2

On a big machine (docs/deploy.md): e.g. ``--workers 1,2,4,8,16 --store-cpus 0-15 --gateway-cpus 16-47
--client-cpus 48-63 --concurrency 512``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from loadtests.harness.endpoint import Endpoint
from loadtests.harness.machine import CpuMeter, cpu_seconds, pin_process
from loadtests.harness.rawclient import RawHttp
from loadtests.harness.stack import Stack, start_proxy_gateway, stop_proxy_gateway
from loadtests.harness.store import BUCKET, new_weed

KIB = 1024
MIB = 1024 * KIB


def parse_cpus(text: str | None) -> frozenset[int] | None:
    """ "0-3,8" -> {0, 1, 2, 3, 8}; None/"" -> None (no pinning)."""
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


class GatewayCpu:
    """CPU seconds of a gateway's supervisor and its workers (a worker's exit keeps what it spent)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def now(self) -> float:
        total: float = cpu_seconds(self.pid)
        for child in psutil.Process(self.pid).children():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += cpu_seconds(child.pid)
        return total


async def _gets(
    client: RawHttp, ep: Endpoint, keys: list[str], size: int, concurrency: int, seconds: float
) -> int:
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        nonlocal done
        j = i
        while time.perf_counter() < stop_at:
            reply = await client.get(ep, keys[j % len(keys)])
            if reply.status != 200 or reply.body_bytes != size:
                raise RuntimeError(f"GET {keys[j % len(keys)]}: {reply.status} {reply.body[:300]!r}")
            done += 1
            j += concurrency

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done


def interleaved(counts: list[int], rounds: int) -> list[tuple[int, int]]:
    order: list[tuple[int, int]] = []
    for r in range(rounds):
        order += [(r, n) for n in (counts if r % 2 == 0 else counts[::-1])]
    return order


async def run_gets(args: argparse.Namespace) -> list[dict[str, Any]]:
    counts = [int(x) for x in args.workers.split(",")]
    store_cpus, gw_cpus, client_cpus = (
        parse_cpus(x) for x in (args.store_cpus, args.gateway_cpus, args.client_cpus)
    )
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    tmp = Path(tempfile.mkdtemp(prefix="bench-workers-", dir=args.tmp_dir))
    weed = new_weed(tmp)
    weed.start()
    results: list[dict[str, Any]] = []
    client = RawHttp()
    try:
        if store_cpus and weed.pid:
            pin_process(weed.pid, store_cpus)
        direct = Endpoint.from_url(weed.endpoint_url)
        size = args.object_kib * KIB
        keys = [f"obj-{i}" for i in range(args.objects)]
        sem = asyncio.Semaphore(8)

        async def up(key: str, seed: int) -> None:
            async with sem:
                reply = await client.put(direct, key, size, seed, signed_payload=False)
                assert reply.status == 200, reply

        await asyncio.gather(*(up(k, i) for i, k in enumerate(keys)))
        stacks: dict[int, Stack] = {}
        for n in counts:
            os.environ["S3LANES_SERVER_WORKERS"] = str(n)
            stack = Stack(tmp=tmp / f"w{n}", weed=weed)
            stack.tmp.mkdir()
            start_proxy_gateway(stack)
            if gw_cpus:
                pin_process(stack.gateway_pid, gw_cpus)
                for child in psutil.Process(stack.gateway_pid).children():
                    pin_process(child.pid, gw_cpus)
            stacks[n] = stack
            await _gets(client, stack.via_gateway, keys, size, args.concurrency, 1.0)  # warm-up
        os.environ.pop("S3LANES_SERVER_WORKERS", None)
        for r, n in interleaved(counts, args.rounds):
            stack = stacks[n]
            gw = GatewayCpu(stack.gateway_pid)
            meter = CpuMeter({"seaweedfs": weed.pid or 0})
            g0 = gw.now()
            meter.start()
            t = time.perf_counter()
            done = await _gets(client, stack.via_gateway, keys, size, args.concurrency, args.seconds)
            seconds = time.perf_counter() - t
            cpu = meter.stop()
            cpu["gateway"] = round(gw.now() - g0, 3)
            cpu["other"] = round(max(0.0, cpu["other"] - cpu["gateway"]), 3)
            row = {
                "round": r,
                "workers": n,
                "requests": done,
                "seconds": round(seconds, 3),
                "rps": round(done / seconds, 1),
                "gateway_cores": round(cpu["gateway"] / seconds, 3),
                "gateway_us_per_req": round(cpu["gateway"] / done * 1e6, 1),
                "store_cores": round(cpu["seaweedfs"] / seconds, 3),
                "client_cores": round(cpu["client"] / seconds, 3),
                "other_cores": round(cpu["other"] / seconds, 3),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
        for stack in stacks.values():
            stop_proxy_gateway(stack)
    finally:
        await client.close()
        weed.stop()
    return results


def md5_rate(threads: int, seconds: float) -> float:
    """Bytes/s of MD5 over 8 MiB pieces in ``threads`` threads at once (each its own hash)."""
    piece = os.urandom(8 * MIB)
    hashed = [0] * threads
    stop_at = time.perf_counter() + seconds

    def run(i: int) -> None:
        h = hashlib.md5(usedforsecurity=False)
        while time.perf_counter() < stop_at:
            h.update(piece)
            hashed[i] += len(piece)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return sum(hashed) / (time.perf_counter() - t)


def summarize(rows: list[dict[str, Any]]) -> None:
    for n in sorted({r["workers"] for r in rows}):
        mine = [r for r in rows if r["workers"] == n]
        print(
            f"workers {n}: {statistics.median(r['rps'] for r in mine):.0f} req/s (rounds: "
            + ", ".join(f"{r['rps']:.0f}" for r in mine)
            + f"), gateway {statistics.median(r['gateway_cores'] for r in mine):.2f} cores,"
            f" {statistics.median(r['gateway_us_per_req'] for r in mine):.0f} us/req,"
            f" store {statistics.median(r['store_cores'] for r in mine):.2f} cores,"
            f" others {statistics.median(r['other_cores'] for r in mine):.2f} cores"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of a round (default 10)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per worker count (default 2)")
    p.add_argument("--concurrency", type=int, default=64, help="concurrent GETs (default 64)")
    p.add_argument("--object-kib", type=int, default=16, help="object size (default 16 KiB)")
    p.add_argument("--objects", type=int, default=256, help="objects read in turn (default 256)")
    p.add_argument("--store-cpus", help="pin SeaweedFS to these CPUs, e.g. 0-7")
    p.add_argument("--gateway-cpus", help="pin the gateway (all its workers) to these CPUs")
    p.add_argument("--client-cpus", help="pin this client to these CPUs")
    p.add_argument("--tmp-dir", help="parent of the temporary directory")
    p.add_argument("--json", type=Path, dest="json_path", help="write every round here")
    p.add_argument("--md5", action="store_true", help="measure MD5 throughput against threads instead")
    p.add_argument("--threads", default="1,2", help="thread counts of --md5 (default 1,2)")
    args = p.parse_args(argv)
    if args.md5:
        rows = []
        for t in (int(x) for x in args.threads.split(",")):
            rate = md5_rate(t, args.seconds)
            rows.append(
                {"threads": t, "md5_gb_s": round(rate / 1e9, 3), "per_thread_gb_s": round(rate / t / 1e9, 3)}
            )
            print(json.dumps(rows[-1]), flush=True)
    else:
        import uvloop

        rows = uvloop.run(run_gets(args))
        summarize(rows)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(rows, indent=1))
    print(f"bucket {BUCKET}; machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
