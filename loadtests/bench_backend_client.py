"""CPU per GET of the gateway's two backend paths, in one process: the aiohttp session and the lean client.

Starts a SeaweedFS, uploads one object, then alternates rounds of ``--count`` GETs from ``--concurrency``
tasks through :meth:`s3lanes.runtime.backend.Backend.read` with ``[backend] raw_reads`` on and off (the
same signing, the same body streaming with ``iter_chunks``, on uvloop as the gateway runs), and prints the
process CPU (user+sys) per GET of each round and the best and median per path. In-process and interleaved,
so the machine's load touches both paths alike; the store's CPU is not counted (another process).

    PYTHONPATH=. .venv/bin/python -m loadtests.bench_backend_client --size-kib 16 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import boto3
import uvloop

from s3lanes.clock import SystemClock
from s3lanes.config import BackendConfig, Credential
from s3lanes.runtime.backend import Backend
from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def one_round(backend: Backend, cred: Credential, count: int, concurrency: int) -> float:
    target = backend.target("bench", "obj", "")
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            resp = await backend.read("GET", target, {}, cred)
            try:
                async for _ in resp.content.iter_chunks():
                    pass
            finally:
                resp.release()

    start = cpu_s()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (cpu_s() - start) / count * 1e6


async def run(endpoint: str, cred: Credential, opts: argparse.Namespace) -> None:
    base = BackendConfig(endpoint=endpoint)
    sides = {}
    for name, raw in (("session", False), ("raw", True)):
        backend = Backend(replace(base, raw_reads=raw), endpoint, SystemClock())
        await backend.start()
        sides[name] = backend
    try:
        for backend in sides.values():
            await one_round(backend, cred, 200, opts.concurrency)  # warm up: connections, caches
        per: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(opts.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for name in order:
                us = await one_round(sides[name], cred, opts.count, opts.concurrency)
                per[name].append(us)
                print(f"round {i} {name:8s} {us:7.1f} us CPU per GET", flush=True)
        for name, values in per.items():
            print(f"{name:8s} best {min(values):7.1f} us, median {statistics.median(values):7.1f} us")
        ratio = [r / s for r, s in zip(per["raw"], per["session"], strict=True)]
        print(f"raw / session per round: {', '.join(f'{x:.2f}' for x in ratio)}")
    finally:
        for backend in sides.values():
            await backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-kib", type=int, default=16)
    ap.add_argument("--count", type=int, default=2000, help="GETs per round and path")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    ident = SeaweedIdentity("admin", "bench-admin", secrets.token_urlsafe(24))
    with tempfile.TemporaryDirectory(prefix="s3lanes-bench-client-") as tmp:
        weed = SeaweedProcess(SeaweedOptions(state_dir=Path(tmp), identities=(ident,), buckets=("bench",)))
        weed.start()
        try:
            s3 = boto3.client(
                "s3",
                endpoint_url=weed.endpoint_url,
                aws_access_key_id=ident.access_key,
                aws_secret_access_key=ident.secret_key,
                region_name="us-east-1",
            )
            s3.put_object(Bucket="bench", Key="obj", Body=os.urandom(opts.size_kib * 1024))
            s3.close()
            cred = Credential("bench", "bench", ident.access_key, ident.secret_key)
            uvloop.run(run(weed.endpoint_url, cred, opts))  # the gateway's loop
        finally:
            weed.stop()


if __name__ == "__main__":
    main()
