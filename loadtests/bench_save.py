"""Checkpoint save time through the spool, spool variants side by side: ``python -m loadtests.bench_save``.

What the trainer of the contention benchmark waits for when it saves (``loadtests.contention``, scenario
(c)), without the testbed around it: a checkpoint of ``--shards`` multipart objects (``--part-mib`` parts) by
``--writers`` concurrent writers, then a 4 KiB ``.metadata`` marker, each save timed from its first request
to the marker's 200 OK; then the checkpoint is read back at once (every shard and the marker, concurrently,
while the drain has not taken them yet: a restore served by the spool), timed to its last byte. The saves
go to gateways that differ in one setting (``--compare``: ``[spool] direct_io`` on and off by default, or
``[server] zero_copy_min_bytes`` at its default and 0), interleaved round by round (A B, B A, ...) so that
drift on a shared machine hits both alike. Results and their reading: ``docs/benchmarks.md`` ("Direct I/O
for spool files", "Restores from the spool").

Theory of operation
-------------------
- One SeaweedFS (``weed mini``, temporary state directory) and one gateway per variant, each with its own
  spool under the same temporary directory (same filesystem) and ``[backend] bandwidth = --trickle``, so the
  drain trickles instead of competing with the acks for the CPU, as in ``bench_spool``'s ack phase.
- The requests are those of the contention trainer (:class:`loadtests.harness.checkpoint.CheckpointWriter`):
  SigV4 ``UNSIGNED-PAYLOAD`` over HTTP with aiohttp, bodies streamed from views of one random block.
- Per variant: every save's time, the p50 of each request type (create, part, complete, marker PUT), and
  the gateway's CPU seconds per GB saved (``/proc/PID/stat``, user and system apart; sampled around each
  round, restores subtracted); every restore's time and the gateway's CPU per GB restored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from loadtests.harness.checkpoint import (
    METADATA_BYTES,
    CheckpointShape,
    CheckpointWriter,
    marker_key,
    shard_key,
)
from loadtests.harness.gateway import GatewayProcess, SpoolGatewaySpec, start_spool_gateway, stop_gateway
from loadtests.harness.machine import cpu_user_sys_seconds, machine_facts
from loadtests.harness.s3client import S3
from loadtests.harness.stats import GB, MIB, med
from loadtests.harness.store import ACCESS_KEY, BUCKET, SECRET_KEY, new_weed

# --compare: variant name -> ([server] lines, [spool] lines) added to the generated config.
COMPARISONS: dict[str, dict[str, tuple[str, str]]] = {
    "direct-io": {
        "direct_io on": ("", ""),
        "direct_io off": ("", "direct_io = false\n"),
    },
    "zero-copy": {
        "zero copy on": ("", ""),
        "zero copy off": ("zero_copy_min_bytes = 0\n", ""),
    },
}


@dataclass(slots=True)
class Timed:
    """The saves (or the restores) of one variant: how long each took, the bytes they moved, and the
    gateway's CPU seconds they cost."""

    seconds: list[float] = field(default_factory=list)
    bytes: int = 0
    cpu_user_s: float = 0.0
    cpu_sys_s: float = 0.0

    def cpu_s_per_gb(self) -> dict[str, float]:
        gb = self.bytes / GB
        return {
            "user": round(self.cpu_user_s / gb, 3),
            "system": round(self.cpu_sys_s / gb, 3),
            "total": round((self.cpu_user_s + self.cpu_sys_s) / gb, 3),
        }


@dataclass(slots=True)
class Variant:
    name: str
    gateway: GatewayProcess
    saves: Timed = field(default_factory=Timed)
    restores: Timed = field(default_factory=Timed)
    round_medians_s: list[float] = field(default_factory=list)
    request_ms: dict[str, list[float]] = field(default_factory=dict)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench_save", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds; each runs every variant once (5)")
    p.add_argument("--saves", type=int, default=8, help="saves per variant per round (8)")
    p.add_argument("--shards", type=int, default=4, help="objects per checkpoint (4)")
    p.add_argument("--shard-mib", type=int, default=16, help="MiB per object (16)")
    p.add_argument("--part-mib", type=int, default=8, help="multipart part size, MiB (8)")
    p.add_argument("--writers", type=int, default=4, help="concurrent writers (4)")
    p.add_argument("--pause-s", type=float, default=1.0, help="pause between saves, s (1.0)")
    p.add_argument("--trickle", type=float, default=5e6, help="[backend] bandwidth of the gateways, B/s")
    p.add_argument(
        "--compare", choices=sorted(COMPARISONS), default="direct-io", help="the setting varied (direct-io)"
    )
    p.add_argument("--tmp-dir", type=Path, default=None, help="parent of the temporary state directory")
    p.add_argument("--out", type=Path, default=None, help="write results.json and report.md here")
    return p.parse_args(argv)


class Bench:
    def __init__(self, args: argparse.Namespace, variants: list[Variant]) -> None:
        self.args = args
        self.variants = variants

    def shape(self) -> CheckpointShape:
        a = self.args
        return CheckpointShape(
            bucket=BUCKET,
            prefix="bench-save",
            shards=a.shards,
            shard_bytes=a.shard_mib * MIB,
            part_bytes=a.part_mib * MIB,
            writers=a.writers,
        )

    async def run(self) -> None:
        a = self.args
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            writers: dict[str, CheckpointWriter] = {}
            for v in self.variants:
                s3 = S3(
                    f"http://{v.gateway.endpoint.netloc}",
                    session,
                    access_key=ACCESS_KEY,
                    secret_key=SECRET_KEY,
                )
                s3.timings = v.request_ms
                writers[v.name] = CheckpointWriter(s3, self.shape(), {})
            index = 0
            for r in range(a.rounds):
                order = self.variants if r % 2 == 0 else list(reversed(self.variants))
                for v in order:
                    t = writers[v.name]
                    user0, sys0 = cpu_user_sys_seconds(v.gateway.pid)
                    times = []
                    restore_user = restore_sys = 0.0
                    for _ in range(a.saves):
                        t0 = time.monotonic()
                        rec = await t.save(index)
                        times.append(time.monotonic() - t0)
                        if rec.error is not None:
                            raise RuntimeError(f"{v.name}: save {index} failed: {rec.error}")
                        v.saves.bytes += rec.bytes_total
                        ru0, rs0 = cpu_user_sys_seconds(v.gateway.pid)
                        t1 = time.monotonic()
                        await self.restore(t.s3, rec.prefix)
                        v.restores.seconds.append(time.monotonic() - t1)
                        ru1, rs1 = cpu_user_sys_seconds(v.gateway.pid)
                        restore_user += ru1 - ru0
                        restore_sys += rs1 - rs0
                        v.restores.bytes += rec.bytes_total
                        index += 1
                        await asyncio.sleep(a.pause_s)
                    user1, sys1 = cpu_user_sys_seconds(v.gateway.pid)
                    v.saves.cpu_user_s += user1 - user0 - restore_user
                    v.saves.cpu_sys_s += sys1 - sys0 - restore_sys
                    v.restores.cpu_user_s += restore_user
                    v.restores.cpu_sys_s += restore_sys
                    v.saves.seconds += times
                    v.round_medians_s.append(med(times))
                    print(
                        f"round {r} {v.name:14s}: save median {med(times):.3f} s", file=sys.stderr, flush=True
                    )

    async def restore(self, s3: S3, prefix: str) -> None:
        """Read the checkpoint back: every shard whole and the marker, concurrently."""
        a = self.args
        keys = [(shard_key(prefix, i), a.shard_mib * MIB) for i in range(a.shards)]
        keys.append((marker_key(prefix), METADATA_BYTES))
        await asyncio.gather(*(s3.get_range(BUCKET, key, 0, size) for key, size in keys))


def summary(variants: list[Variant]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        out[v.name] = {
            "restore_median_s": med(v.restores.seconds),
            "restore_gateway_cpu_s_per_GB": v.restores.cpu_s_per_gb(),
            "saves": len(v.saves.seconds),
            "save_median_s": med(v.saves.seconds),
            "round_medians_s": [round(x, 4) for x in v.round_medians_s],
            "request_p50_ms": {k: round(med(x), 2) for k, x in sorted(v.request_ms.items())},
            "gateway_cpu_s_per_GB": v.saves.cpu_s_per_gb(),
        }
    base = variants[0].name
    for v in variants[1:]:
        rr = [
            b / a for a, b in zip(out[base]["round_medians_s"], out[v.name]["round_medians_s"], strict=True)
        ]
        out[v.name][f"per_round_ratio_to_{base}"] = [round(x, 3) for x in rr]
        out[v.name][f"median_ratio_to_{base}"] = round(med(rr), 3)
    return out


def report(args: argparse.Namespace, s: dict[str, Any], facts: dict[str, str]) -> str:
    names = list(s)
    kinds = sorted({k for x in s.values() for k in x["request_p50_ms"]})
    lines = [
        "## Checkpoint save time through the spool, variants side by side",
        "",
        f"Command: `python -m loadtests.bench_save {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"{args.rounds} rounds x {args.saves} saves per variant, interleaved; a save = {args.shards} "
        f"objects of {args.shard_mib} MiB ({args.part_mib} MiB parts) by {args.writers} writers, then a "
        f"4 KiB marker; gateways' drain trickling at {args.trickle / 1e6:g} MB/s.",
        "",
        "| variant | save median, s | per-round medians, s | "
        + " | ".join(f"{k} p50 ms" for k in kinds)
        + " | gateway CPU s/GB (user / system) |",
        "|---|---|---|" + "---|" * len(kinds) + "---|",
    ]
    for n in names:
        x = s[n]
        c = x["gateway_cpu_s_per_GB"]
        lines.append(
            f"| {n} | {x['save_median_s']:.3f} | {', '.join(f'{y:.3f}' for y in x['round_medians_s'])} | "
            + " | ".join(f"{x['request_p50_ms'].get(k, float('nan')):.1f}" for k in kinds)
            + f" | {c['total']:.2f} ({c['user']:.2f} / {c['system']:.2f}) |"
        )
    for n in names[1:]:
        key = f"median_ratio_to_{names[0]}"
        lines += [
            "",
            f"{n} / {names[0]}, save time: median of per-round ratios {s[n][key]:.2f}x "
            f"(rounds: {', '.join(f'{y:.2f}' for y in s[n][f'per_round_ratio_to_{names[0]}'])}).",
        ]
    lines += [
        "",
        "Restores right after each save (every shard and the marker read back concurrently, from the spool):",
        "",
        "| variant | restore median, s | gateway CPU s/GB restored (user / system) |",
        "|---|---|---|",
    ]
    for n in names:
        c = s[n]["restore_gateway_cpu_s_per_GB"]
        cpu = f"{c['total']:.2f} ({c['user']:.2f} / {c['system']:.2f})"
        lines.append(f"| {n} | {s[n]['restore_median_s']:.3f} | {cpu} |")
    lines += ["", "| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="s3lanes-bench-save-", dir=args.tmp_dir))
    weed = new_weed(tmp)
    gateways: list[GatewayProcess] = []
    try:
        weed.start()
        variants = []
        for name, (server_extra, spool_extra) in COMPARISONS[args.compare].items():
            slug = name.replace(" ", "-").replace("_", "")
            spec = SpoolGatewaySpec(
                weed.endpoint_url,
                tmp / f"spool-{slug}",
                args.trickle,
                spool_extra=spool_extra,
                server_extra=server_extra,
            )
            gw = start_spool_gateway(tmp, slug, spec)
            gateways.append(gw)
            variants.append(Variant(name, gw))
        uvloop.run(Bench(args, variants).run())
    finally:
        for gw in gateways:
            stop_gateway(gw)
        weed.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    s = summary(variants)
    text = report(args, s, machine_facts())
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(
            json.dumps(
                {"argv": sys.argv[1:], "summary": s, "saves_s": {v.name: v.saves.seconds for v in variants}},
                indent=2,
            )
        )
        (args.out / "report.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
