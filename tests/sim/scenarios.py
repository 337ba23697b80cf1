"""Scenarios (anchors-scheduler.md §8.3), the runner, and the measurements the properties are stated in.

Scale: a 400 MB/s backend, 1 MiB chunks, 100 MB/s per connection, a 2 ms TTFB at no load. Shares are
measured on bytes the backend *delivered* (fluidly, per 0.1 s bin), never on bytes granted; read latency is
``extra = gateway wait + max(0, TTFB - t0)``, with the model's own no-load TTFB ``t0`` as the baseline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from s3lanes.config import Config
from s3lanes.core.scheduler import LaneSpec, Scheduler, SchedulerConfig, SchedulerSnapshot
from s3lanes.runtime.wiring import scheduler_config
from tests.sim.backend_model import BIN_S, Backend, BackendParams, Meter
from tests.sim.des import Simulator
from tests.sim.fifo import FifoScheduler
from tests.sim.workload import ClientSpec, Context, Population, ReadSample, SchedulerLike, SimShell

MB = 1_000_000
MiB = 1024 * 1024
C0 = 400 * MB

LANES = ("dataset", "checkpoint", "restore", "metadata")


def base_config(**overrides: object) -> SchedulerConfig:
    """The scheduler users run (the shipped lanes and settings, through the gateway's own conversion), at the
    scenarios' scale: the model store's bandwidth, a window and a burst that fit it."""
    cfg = replace(
        scheduler_config(Config(), C0),
        inflight_bytes_max=32 * MiB,
        inflight_requests_max=64,
        burst_bytes=2 * MiB,
    )
    return replace(cfg, **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    duration_s: float
    backend: BackendParams
    cfg: SchedulerConfig
    clients: tuple[ClientSpec, ...]
    drain_s: float = 0.0  # extra time after the clients stop, for in-flight work to finish


@dataclass(slots=True)
class Sample:
    at: float
    capacity_true_bps: float
    capacity_est_bps: float
    guard_multiplier: float
    reads_active: bool


@dataclass(slots=True)
class Result:
    scenario: Scenario
    seed: int
    scheduler: str
    delivered: Meter
    granted: Meter
    reads: list[ReadSample]
    samples: list[Sample]
    trace_hash: str
    events: int
    wall_s: float
    ctx: Context
    shell: SimShell
    backend: Backend
    sched: SchedulerLike
    snapshot: SchedulerSnapshot | None = None
    notes: dict[str, float] = field(default_factory=dict)

    # -- measurements ---------------------------------------------------------------------------------

    def capacity_bytes(self, t0: float, t1: float) -> float:
        """The integral of the true capacity over [t0, t1)."""
        p = self.scenario.backend
        n = round((t1 - t0) / BIN_S)
        return sum(p.capacity_at(t0 + (i + 0.5) * BIN_S) * BIN_S for i in range(n))

    def fraction_of_capacity(self, lane: str, t0: float, t1: float) -> float:
        return self.delivered.window(lane, t0, t1) / self.capacity_bytes(t0, t1)

    def share(self, lane: str, t0: float, t1: float) -> float:
        total = sum(self.delivered.window(x, t0, t1) for x in LANES)
        return self.delivered.window(lane, t0, t1) / total if total > 0 else 0.0

    def extras(self, t0: float, t1: float, lane: str = "dataset") -> list[float]:
        t_base = self.scenario.backend.t0_s
        return [
            r.wait_s + max(0.0, r.ttfb_s - t_base) for r in self.reads if r.lane == lane and t0 <= r.at < t1
        ]

    def p99_extra(self, t0: float, t1: float, lane: str = "dataset") -> float:
        xs = sorted(self.extras(t0, t1, lane))
        if not xs:
            return 0.0
        return xs[max(0, math.ceil(0.99 * len(xs)) - 1)]

    def estimate_at(self, t: float) -> float:
        best = self.samples[0]
        for s in self.samples:
            if s.at <= t + 1e-9:
                best = s
        return best.capacity_est_bps


def windows(t0: float, t1: float, width: float = 1.0) -> list[tuple[float, float]]:
    n = round((t1 - t0) / width)
    return [(t0 + i * width, t0 + (i + 1) * width) for i in range(n)]


def run(sc: Scenario, seed: int = 1, scheduler: str = "ours") -> Result:
    started = time.perf_counter()
    sim = Simulator(seed)
    horizon = sc.duration_s + sc.drain_s
    backend = Backend(sim, sc.backend, LANES, horizon)
    sched: SchedulerLike
    if scheduler == "ours":
        sched = Scheduler(sc.cfg, 0.0)
    elif scheduler == "fifo":
        sched = FifoScheduler(sc.cfg, 0.0)
    else:
        raise ValueError(scheduler)
    granted = Meter(LANES, horizon)
    shell = SimShell(sim, sched, granted)
    ctx = Context(sim, shell, backend, sc.cfg.request_cost_bytes, sc.backend.t0_s)
    for i, spec in enumerate(sc.clients):
        Population(ctx, spec, i)
    samples: list[Sample] = []
    if isinstance(sched, Scheduler):
        ours = sched

        def sample() -> None:
            snap = ours.snapshot(sim.now)
            samples.append(
                Sample(
                    sim.now,
                    sc.backend.capacity_at(sim.now),
                    snap.capacity_bps,
                    snap.guard_multiplier,
                    snap.reads_active,
                )
            )
            if sim.now + BIN_S <= horizon:
                sim.after(BIN_S, sample)

        sim.at(0.0, sample)
    sim.run(horizon)
    snap = sched.snapshot(sim.now) if isinstance(sched, Scheduler) else None
    return Result(
        scenario=sc,
        seed=seed,
        scheduler=scheduler,
        delivered=backend.delivered,
        granted=granted,
        reads=ctx.reads,
        samples=samples,
        trace_hash=sim.trace_hash(),
        events=sim.events,
        wall_s=time.perf_counter() - started,
        ctx=ctx,
        shell=shell,
        backend=backend,
        sched=sched,
        snapshot=snap,
    )


# -- the scenarios ---------------------------------------------------------------------------------------


def saturation(cfg: SchedulerConfig | None = None) -> Scenario:
    """S1: dataset and checkpoint both backlogged (closed loop, 8 readers vs 16 writers)."""
    return Scenario(
        name="saturation",
        duration_s=12.0,
        backend=BackendParams(capacity_steps=((0.0, C0),)),
        cfg=cfg or base_config(),
        clients=(
            ClientSpec("dataset", "read", "closed", 64 * MiB, 0.0, 12.0, streams=8),
            ClientSpec("checkpoint", "write", "closed", 64 * MiB, 0.0, 12.0, streams=16),
        ),
    )


READ_RATE = 0.6 * C0
BURST_AT = 6.0
READS_STOP = 16.0
READS_BACK = 22.0
CAP_END = 26.0


def burst(cfg: SchedulerConfig | None = None) -> Scenario:
    """S3 + S2 + S9: steady reads at 0.6 C; a checkpoint burst at t=6 s; reads stop at 16 s (the cap must
    lift and the writes take everything); reads come back at 22 s (the cap must re-apply)."""
    return Scenario(
        name="burst",
        duration_s=CAP_END,
        backend=BackendParams(capacity_steps=((0.0, C0),)),
        cfg=cfg or base_config(),
        clients=(
            ClientSpec("dataset", "read", "open", 1 * MiB, 0.0, READS_STOP, rate_bps=READ_RATE),
            ClientSpec("dataset", "read", "open", 1 * MiB, READS_BACK, CAP_END, rate_bps=READ_RATE),
            ClientSpec("checkpoint", "write", "closed", 64 * MiB, BURST_AT, CAP_END, streams=16),
        ),
    )


def contention() -> Scenario:
    """S8: dataset, checkpoint and restore backlogged, plus a metadata storm: nobody starves."""
    return Scenario(
        name="contention",
        duration_s=10.0,
        backend=BackendParams(capacity_steps=((0.0, C0),)),
        cfg=base_config(),
        clients=(
            ClientSpec("dataset", "read", "closed", 64 * MiB, 0.0, 10.0, streams=8),
            ClientSpec("checkpoint", "write", "closed", 64 * MiB, 0.0, 10.0, streams=16),
            ClientSpec("restore", "read", "closed", 64 * MiB, 0.0, 10.0, streams=8),
            ClientSpec("metadata", "meta", "open", 0, 0.0, 10.0, rate_ops=400.0),
        ),
    )


STEP_DOWN_AT = 8.0
STEP_UP_AT = 20.0
C_LOW = 240 * MB


def capacity_step() -> Scenario:
    """S4: capacity unknown (estimated from the default 1 GB/s guess), 400 -> 240 MB/s at 8 s, back at 20 s.
    Writes are backlogged, so the store is saturated and its capacity observable."""
    return Scenario(
        name="capacity_step",
        duration_s=32.0,
        backend=BackendParams(capacity_steps=((0.0, C0), (STEP_DOWN_AT, C_LOW), (STEP_UP_AT, C0))),
        cfg=base_config(capacity_bps=None, inflight_bytes_max=None, inflight_requests_max=None),
        clients=(ClientSpec("checkpoint", "write", "closed", 64 * MiB, 0.0, 32.0, streams=16),),
    )


STORM_AT = 6.0
STORM_END = 10.0


def slowdown_storm() -> Scenario:
    """S7: 20% of checkpoint PUTs answered 503 SlowDown for 4 s, reads at 0.5 C alongside."""
    return Scenario(
        name="slowdown_storm",
        duration_s=16.0,
        backend=BackendParams(
            capacity_steps=((0.0, C0),), faults=((STORM_AT, STORM_END, "checkpoint", 0.2),)
        ),
        cfg=base_config(),
        clients=(
            ClientSpec("dataset", "read", "open", 1 * MiB, 0.0, 16.0, rate_bps=0.5 * C0),
            # S3's minimum part size, so that many requests start and the storm is felt.
            ClientSpec("checkpoint", "write", "closed", 5 * MiB, 0.0, 16.0, streams=16),
        ),
    )


CHURN_STOP = 8.0


def churn(seed_prefix: str = "p0") -> Scenario:
    """S10: every lane busy, 5% of the requests abandoned mid-flight; clients stop at 8 s, then drain."""
    return Scenario(
        name="churn",
        duration_s=CHURN_STOP,
        drain_s=4.0,
        backend=BackendParams(capacity_steps=((0.0, C0),), service_slots=16),
        cfg=base_config(),
        clients=(
            ClientSpec(
                "dataset", "read", "open", 1 * MiB, 0.0, CHURN_STOP, rate_bps=0.5 * C0, cancel_prob=0.05
            ),
            ClientSpec(
                "checkpoint", "write", "closed", 16 * MiB, 0.0, CHURN_STOP, streams=12, cancel_prob=0.05
            ),
            ClientSpec("restore", "read", "closed", 16 * MiB, 2.0, CHURN_STOP, streams=4, cancel_prob=0.05),
            ClientSpec("metadata", "meta", "open", 0, 0.0, CHURN_STOP, rate_ops=200.0, cancel_prob=0.05),
        ),
    )


def work_conserving_mode() -> Scenario:
    """Reads at 0.3 C, writes backlogged, ``write_cap_mode = work_conserving``: writes take what reads
    leave, and only the latency guard holds them back."""
    return Scenario(
        name="work_conserving",
        duration_s=14.0,
        backend=BackendParams(capacity_steps=((0.0, C0),)),
        cfg=base_config(write_cap_mode="work_conserving"),
        clients=(
            ClientSpec("dataset", "read", "open", 1 * MiB, 0.0, 14.0, rate_bps=0.3 * C0),
            ClientSpec("checkpoint", "write", "closed", 64 * MiB, 2.0, 14.0, streams=16),
        ),
    )


def lanes_with(**changes: dict[str, object]) -> tuple[LaneSpec, ...]:
    return tuple(replace(x, **changes.get(x.name, {})) for x in base_config().lanes)  # type: ignore[arg-type]


def hidden_queue(*, window: bool) -> Scenario:
    """A store that serves 8 operations at a time and queues the rest inside, first come first served: with
    a window no larger than that, the queue stays in the gateway, where reads can be put first; without
    one, reads queue inside the store behind the writes and no ordering in the gateway can help."""
    cfg = (
        base_config(inflight_bytes_max=8 * MiB, inflight_requests_max=8)
        if window
        else base_config(inflight_bytes_max=None, inflight_requests_max=None)
    )
    return Scenario(
        name="hidden_queue",
        duration_s=8.0,
        backend=BackendParams(capacity_steps=((0.0, C0),), service_slots=8),
        cfg=cfg,
        clients=(
            ClientSpec("dataset", "read", "open", 1 * MiB, 0.0, 8.0, rate_bps=READ_RATE),
            ClientSpec("checkpoint", "write", "closed", 64 * MiB, 2.0, 8.0, streams=16),
        ),
    )


C_SLOW = 40 * MB
SLOW_PIECE_BYTES = 192 * 1024  # Scheduler.piece_bytes for a paced lane at 40 MB/s and a 5 ms target


def many_writers(progress_interval_s: float | None = 2.0) -> Scenario:
    """16 writer connections against 2 saturating readers on a 40 MB/s store: the latency guard holds the
    checkpoint lane low, and every writer must still get a piece every few seconds."""
    return Scenario(
        name="many_writers",
        duration_s=30.0,
        backend=BackendParams(capacity_steps=((0.0, C_SLOW),)),
        cfg=base_config(capacity_bps=C_SLOW, progress_interval_s=progress_interval_s),
        clients=(
            ClientSpec("dataset", "read", "closed", 64 * MiB, 0.0, 30.0, streams=2),
            ClientSpec(
                "checkpoint", "write", "closed", 64 * MiB, 2.0, 30.0, streams=16, chunk_bytes=SLOW_PIECE_BYTES
            ),
        ),
    )


def faster_store() -> Scenario:
    """The e2e lanes test's shape: a gateway configured at 40 MB/s in front of a store four times faster, so
    nothing but the scheduler holds the total. Eight readers of 4 MiB objects (their weight-phase grants
    borrow below the capacity bucket) and eight 4 MiB writers, every stream closed loop."""
    return Scenario(
        name="faster_store",
        duration_s=12.0,
        backend=BackendParams(capacity_steps=((0.0, 4 * C_SLOW),)),
        cfg=replace(scheduler_config(Config(), C_SLOW), latency_target_s=2.0),
        clients=(
            ClientSpec("dataset", "read", "closed", 4 * MiB, 0.0, 12.0, streams=8),
            ClientSpec("checkpoint", "write", "closed", 4 * MiB, 0.0, 12.0, streams=8),
        ),
    )
