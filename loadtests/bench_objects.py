"""The small-object phase of ``make bench``: concurrent GETs of objects already on the store, req/s and CPU
per request, direct vs through a gateway with the default configuration (spool on).

A dataset of small files read by many loader workers is the commonest read pattern of a training job; what
limits it is the CPU each request costs, not bandwidth. Each object set below is read by ``concurrency``
workers, each looping over the set's keys with the lean client of :mod:`loadtests.bench_proxy` (its own
SigV4 signature per request, keep-alive connections), in rounds ordered A/B/B/A against direct SeaweedFS and
the gateway. Every round records the user+sys CPU of the gateway, SeaweedFS and the client from ``/proc``,
so the report gives CPU per request of each process on both sides: what the store does per GET when the
gateway is in front of it, next to what it does when the client talks to it.

The gateway of this phase is its own ``s3lanes serve`` with the spool on (started with
:func:`loadtests.harness.gateway.start_spool_gateway`): the objects were uploaded to
SeaweedFS directly, so every GET goes to the store, as a dataset read does.

Run only this phase with ``python -m loadtests.bench_proxy --phases objects`` (``--quick`` for a short run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadtests.harness.endpoint import Endpoint
from loadtests.harness.errors import BenchError
from loadtests.harness.gateway import (
    GatewayProcess,
    SpoolGatewaySpec,
    start_spool_gateway,
    stop_gateway,
    tree_source,
)
from loadtests.harness.machine import CpuMeter
from loadtests.harness.rawclient import expect
from loadtests.harness.stats import MIB, Round, abba, med, run_all

if TYPE_CHECKING:
    from loadtests.bench_proxy import Bench

KIB = 1024


@dataclass(frozen=True, slots=True)
class ObjectSet:
    label: str
    size_bytes: int
    concurrency: int
    objects: int
    requests: int  # per round and side (a quick run reads a fifth)

    @property
    def phase(self) -> str:
        return "objects " + self.label


def object_sets(large_mib: int) -> tuple[ObjectSet, ...]:
    return (
        ObjectSet("16 KiB", 16 * KIB, 64, 512, 6000),
        ObjectSet("110 KiB", 110 * KIB, 16, 256, 4000),
        ObjectSet("1 MiB", MIB, 16, 64, 1000),
        ObjectSet(f"{large_mib} MiB", large_mib * MIB, 1, 1, 4),
    )


def key_of(s: ObjectSet, j: int) -> str:
    return f"obj-{s.size_bytes}-{j}"


async def object_phase(bench: Bench) -> None:
    """Upload the sets directly, start the spooling gateway, run the interleaved rounds, stop it."""

    o = bench.opts
    stack = bench.stack
    sets = object_sets(o.large_mib)
    direct = stack.direct
    t0 = time.perf_counter()
    jobs = [
        (key_of(s, j), s.size_bytes, 1000 + s.size_bytes % 997 + j) for s in sets for j in range(s.objects)
    ]
    bench.log(f"objects: uploading {len(jobs)} objects directly to SeaweedFS")
    sem = asyncio.Semaphore(8)

    async def up(key: str, size: int, seed: int) -> None:
        async with sem:
            expect(await bench.client.put(direct, key, size, seed, signed_payload=False), 200, f"PUT {key}")

    await bench.bounded("objects set-up", run_all(up(*j) for j in jobs))
    bench.log(
        f"objects: set-up done in {time.perf_counter() - t0:.1f} s; starting a gateway with the spool on"
    )
    spec = SpoolGatewaySpec(stack.weed.endpoint_url, stack.tmp / "spool-objects")
    gw: GatewayProcess = await asyncio.to_thread(start_spool_gateway, stack.tmp, "objects", spec)
    other: GatewayProcess | None = None
    try:
        store = stack.weed.pid or 0
        meters = {side: CpuMeter({"gateway": gw.pid, "seaweedfs": store}) for side in ("direct", "gateway")}
        eps = {"direct": direct, "gateway": gw.endpoint}
        bench.results.facts["objects gateway"] = "its own s3lanes serve, default config with [spool] enabled"
        if o.compare_tree is not None:
            spec = SpoolGatewaySpec(stack.weed.endpoint_url, stack.tmp / "spool-objects-compare")
            source = tree_source(o.compare_tree.resolve())
            other = await asyncio.to_thread(
                start_spool_gateway, stack.tmp, "objects-compare", spec, source=source
            )
            meters["compare"] = CpuMeter({"gateway": other.pid, "seaweedfs": store})
            eps["compare"] = other.endpoint
            bench.results.facts["objects compare"] = f"the same, run from {o.compare_tree} (side 'compare')"
        for s in sets:
            n = s.requests if not o.quick else max(s.requests // 5, 1)
            for side in eps:  # warm-up: connections, page cache, the gateway's pool
                await bench.bounded("warm-up", _gets(bench, eps[side], s, min(n, s.objects + s.concurrency)))
            for i, side in rounds_of(o.rounds, tuple(eps)):
                meter = meters[side]
                async with bench.profiled(f"objects-{s.size_bytes}-r{i}", side, gw.pid):
                    meter.start()
                    t = time.perf_counter()
                    await bench.bounded(s.phase, _gets(bench, eps[side], s, n))
                    seconds = time.perf_counter() - t
                    cpu = meter.stop()
                r = Round(s.phase, side, i, s.size_bytes * n, seconds, cpu, requests=n)
                bench.results.object_rounds.append(r)
                bench.log(
                    f"GET {s.label} x{s.concurrency} {side:7s} round {i}: {n / seconds:7.0f} req/s  "
                    + "  ".join(f"{k} {v / n * 1e6:.0f} us" for k, v in cpu.items() if k != "other")
                )
            if s.concurrency > 1:
                await _paced_rounds(bench, s, n, meters["direct"])
            if other is not None and s.concurrency > 1:
                await _mixed_rounds(bench, s, n, gw, other)
    finally:
        await asyncio.to_thread(stop_gateway, gw)
        if other is not None:
            await asyncio.to_thread(stop_gateway, other)


def rounds_of(rounds: int, sides: tuple[str, ...]) -> list[tuple[int, str]]:
    """A/B/B/A for two sides; with a third, A/B/C/C/B/A: each side as often early as late in a pair."""
    if len(sides) == 2:
        return list(abba(rounds))
    return [(i, side) for i in range(rounds) for side in (sides if i % 2 == 0 else sides[::-1])]


async def _mixed_rounds(
    bench: Bench, s: ObjectSet, n: int, gw: GatewayProcess, other: GatewayProcess
) -> None:
    """Both gateways at once, half the workers and half the requests each ("mixed"): their CPU per request
    is then measured over the same seconds, so a shared machine's changing load cancels out of the ratio."""
    half = dataclasses.replace(s, concurrency=s.concurrency // 2)
    meter = CpuMeter({"gateway": gw.pid, "compare": other.pid, "seaweedfs": bench.stack.weed.pid or 0})
    for i in range(bench.opts.rounds):
        meter.start()
        t = time.perf_counter()
        jobs = [_gets(bench, gw.endpoint, half, n // 2), _gets(bench, other.endpoint, half, n // 2)]
        await bench.bounded(s.phase, run_all(jobs))
        seconds = time.perf_counter() - t
        cpu = meter.stop()
        bench.results.object_rounds.append(
            Round(s.phase, "mixed", i, s.size_bytes * n, seconds, cpu, requests=n // 2)
        )
        bench.log(
            f"GET {s.label} x{s.concurrency} both gateways at once, round {i}: gateway "
            f"{cpu['gateway'] / (n // 2) * 1e6:.0f} us, compared {cpu['compare'] / (n // 2) * 1e6:.0f} us"
        )


async def _paced_rounds(bench: Bench, s: ObjectSet, n: int, meter: CpuMeter) -> None:
    """The store's own cost at the gateway's rate: direct GETs paced to the req/s each gateway round of
    this set reached ("direct-paced"). A server's CPU per request depends on how busy it is kept; this
    separates that from anything the gateway sends."""
    gateway_rounds = [r for r in bench.results.object_rounds if r.phase == s.phase and r.side == "gateway"]
    for r in gateway_rounds:
        rate = r.requests / r.seconds
        meter.start()
        t = time.perf_counter()
        await bench.bounded(s.phase, _gets(bench, bench.stack.direct, s, n, rate=rate))
        seconds = time.perf_counter() - t
        cpu = meter.stop()
        bench.results.object_rounds.append(
            Round(s.phase, "direct-paced", r.index, s.size_bytes * n, seconds, cpu, requests=n)
        )
        bench.log(
            f"GET {s.label} x{s.concurrency} direct paced to {rate:.0f} req/s, round {r.index}: "
            f"{n / seconds:7.0f} req/s  seaweedfs {cpu['seaweedfs'] / n * 1e6:.0f} us"
        )


async def _gets(bench: Bench, ep: Endpoint, s: ObjectSet, n: int, *, rate: float | None = None) -> None:
    """``n`` GETs by ``s.concurrency`` workers, each taking the next key of the set in turn; with ``rate``,
    request ``i`` starts no sooner than ``i / rate`` seconds after the first."""
    next_i = 0
    client = bench.client
    t0 = time.perf_counter()

    async def worker() -> None:
        nonlocal next_i
        while next_i < n:
            key = key_of(s, next_i % s.objects)
            if rate is not None:
                delay = t0 + next_i / rate - time.perf_counter()
                next_i += 1
                if delay > 0:
                    await asyncio.sleep(delay)
            else:
                next_i += 1
            reply = await client.get(ep, key)
            if reply.status != 200 or reply.body_bytes != s.size_bytes:
                expect(reply, 200, f"GET {key}", s.size_bytes)

    await run_all(worker() for _ in range(s.concurrency))


def summary(rounds: list[Round], large_mib: int) -> list[dict[str, Any]]:
    out = []
    for s in object_sets(large_mib):
        d = [r for r in rounds if r.phase == s.phase and r.side == "direct"]
        g = [r for r in rounds if r.phase == s.phase and r.side == "gateway"]
        if not d or not g:
            continue

        def rps(rs: list[Round]) -> float:
            return med([r.requests / r.seconds for r in rs])

        def us(rs: list[Round], who: str) -> float:
            return med([r.cpu_s[who] / r.requests * 1e6 for r in rs])

        md, mg = rps(d), rps(g)
        c = [r for r in rounds if r.phase == s.phase and r.side == "compare"]
        compare: dict[str, Any] | None = None
        if c:
            compare = {
                "rps": rps(c),
                "ratio": rps(c) / md if md else float("nan"),
                "gateway_cpu_us": us(c, "gateway"),
                "store_cpu_us": us(c, "seaweedfs"),
                # Per round pair: this tree's gateway CPU per request over the compared tree's.
                "gateway_cpu_pairs": [
                    round(rg.cpu_s["gateway"] / rg.requests / (rc.cpu_s["gateway"] / rc.requests), 3)
                    for rg, rc in zip(g, c, strict=False)
                    if rc.cpu_s["gateway"] > 0
                ],
            }
        mixed = [r for r in rounds if r.phase == s.phase and r.side == "mixed"]
        if compare is not None and mixed:
            compare["mixed_cpu_us"] = {"gateway": us(mixed, "gateway"), "compare": us(mixed, "compare")}
            compare["mixed_pairs"] = [
                round(r.cpu_s["gateway"] / r.cpu_s["compare"], 3) for r in mixed if r.cpu_s["compare"] > 0
            ]
        paced = [r for r in rounds if r.phase == s.phase and r.side == "direct-paced"]
        out.append(
            {
                "compare": compare,
                "paced": {"rps": rps(paced), "store_cpu_us": us(paced, "seaweedfs")} if paced else None,
                "objects": s.label,
                "concurrency": s.concurrency,
                "direct_rps": md,
                "gateway_rps": mg,
                "ratio": mg / md if md else float("nan"),
                # The ratio of each round pair (A/B/B/A: rounds of one index ran back to back).
                "pair_ratios": [
                    round((rg.requests / rg.seconds) / (rd.requests / rd.seconds), 3)
                    for rd, rg in zip(d, g, strict=False)
                ],
                "direct_rounds_rps": [round(r.requests / r.seconds) for r in d],
                "gateway_rounds_rps": [round(r.requests / r.seconds) for r in g],
                "gateway_cpu_us": us(g, "gateway"),
                "store_cpu_us": {"direct": us(d, "seaweedfs"), "gateway": us(g, "seaweedfs")},
                "client_cpu_us": {"direct": us(d, "client"), "gateway": us(g, "client")},
                "other_cores": {
                    "direct": med([r.other_cores for r in d]),
                    "gateway": med([r.other_cores for r in g]),
                },
                "requests_per_round": d[0].requests,
            }
        )
    return out


def _table(header: str, rows: Iterable[str], intro: str = "") -> list[str]:
    """A Markdown table (its separator row counted from ``header``), after a paragraph ``intro`` if any."""
    columns = header.count("|") - 1
    return [*(["", intro] if intro else []), "", header, "|---" * columns + "|", *rows]


def _ratios(values: Iterable[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def report(rows: list[dict[str, Any]], rounds: int) -> str:
    if not rows:
        raise BenchError("the objects phase recorded no rounds")
    lines = [
        f"### Objects already on the store: concurrent GETs ({rounds} rounds per side, A/B/B/A, medians)",
        *_table(
            "| objects | concurrency | direct req/s | gateway req/s | ratio (pairs) "
            "| gateway CPU per request | store CPU per request, direct / behind the gateway "
            "| client CPU per request, direct / gateway | other processes, cores busy |",
            (
                f"| {x['objects']} | {x['concurrency']} | {x['direct_rps']:,.0f} | {x['gateway_rps']:,.0f} "
                f"| {x['ratio']:.2f} ({_ratios(x['pair_ratios'])}) "
                f"| {x['gateway_cpu_us']:,.0f} us "
                f"| {x['store_cpu_us']['direct']:,.0f} / {x['store_cpu_us']['gateway']:,.0f} us "
                f"| {x['client_cpu_us']['direct']:,.0f} / {x['client_cpu_us']['gateway']:,.0f} us "
                f"| {x['other_cores']['direct']:.2f} / {x['other_cores']['gateway']:.2f} |"
                for x in rows
            ),
        ),
    ]
    paced = [x for x in rows if x.get("paced")]
    if paced:
        lines += _table(
            "| objects | concurrency | paced req/s "
            "| store CPU per request: direct / paced direct / behind the gateway |",
            (
                f"| {x['objects']} | {x['concurrency']} | {x['paced']['rps']:,.0f} "
                f"| {x['store_cpu_us']['direct']:,.0f} / {x['paced']['store_cpu_us']:,.0f} "
                f"/ {x['store_cpu_us']['gateway']:,.0f} us |"
                for x in paced
            ),
            "SeaweedFS's CPU per request when the direct client is paced to each gateway round's req/s "
            "(side 'direct-paced': the store's cost at the gateway's rate, same wire as direct):",
        )
    compared = [(x, x["compare"]) for x in rows if x.get("compare")]
    if compared:
        lines += _table(
            "| objects | concurrency | compared req/s (ratio to direct) | this tree req/s (ratio) "
            "| gateway CPU per request, compared / this tree | this / compared, per round | store CPU per "
            "request behind the compared / this tree |",
            (
                f"| {x['objects']} | {x['concurrency']} | {c['rps']:,.0f} ({c['ratio']:.2f}) "
                f"| {x['gateway_rps']:,.0f} ({x['ratio']:.2f}) "
                f"| {c['gateway_cpu_us']:,.0f} / {x['gateway_cpu_us']:,.0f} us "
                f"| {_ratios(c['gateway_cpu_pairs'])} "
                f"| {c['store_cpu_us']:,.0f} / {x['store_cpu_us']['gateway']:,.0f} us |"
                for x, c in compared
            ),
            "The same rounds, the compared tree's gateway (side 'compare') next to this tree's:",
        )
        mixed = [(x, c) for x, c in compared if c.get("mixed_cpu_us")]
        if mixed:
            lines += _table(
                "| objects | concurrency | gateway CPU per request, compared / this tree | this / compared, "
                "per round |",
                (
                    f"| {x['objects']} | {x['concurrency']} | {c['mixed_cpu_us']['compare']:,.0f} / "
                    f"{c['mixed_cpu_us']['gateway']:,.0f} us | {_ratios(c['mixed_pairs'])} |"
                    for x, c in mixed
                ),
                "Both gateways serving at once (half the workers each, same seconds: the machine's load "
                "cancels out):",
            )
    return "\n".join(lines)
