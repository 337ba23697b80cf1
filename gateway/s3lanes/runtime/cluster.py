"""The async shell of the cluster budget: publish this node's report, read the others', apply the allowance.

Theory of operation
-------------------
:class:`~s3lanes.core.cluster_budget.NodeLease` decides, this module carries out. Every
``[cluster].interval_s`` :meth:`ClusterMember.step` builds this node's
:class:`~s3lanes.core.cluster_budget.NodeReport` from the scheduler's snapshot (and the spool's pending
bytes), exchanges it with the blackboard, hands the snapshot to the lease, and applies the allowance of
each shared lane with :meth:`~s3lanes.core.scheduler.Scheduler.set_external_limit`. A raised limit takes
effect at the scheduler's next window tick at the latest (100 ms): waiting tickets are re-pulled then.

The blackboard is Redis (:class:`RedisBoard`), or an in-process :class:`MemoryBoard` for tests. Layout, all
under ``s3lanes:<name>:``:

- ``node:<node id>``: the node's report (JSON), written with ``SET ... PX ttl``: Redis expires a node that
  stopped reporting, whatever the nodes' clocks say;
- ``nodes``: a sorted set of node ids scored by their last report time, so one read finds every member (no
  ``KEYS``/``SCAN``); members silent for ``MEMBER_GC_TTLS`` TTLs are removed by whoever notices.

One round is one pipelined round trip: SET own report, ZADD, ZREMRANGEBYSCORE, ZRANGE, TIME, and MGET of
the members known from the previous round; only when ZRANGE shows a new member does a second MGET fetch it.
Report times are on Redis' clock (``TIME``, mapped onto this node's monotonic clock), so report ages do not
depend on the nodes' wall clocks agreeing.

A dead Redis never blocks the loop: the client has short socket timeouts and no retries of its own, the
whole round has a deadline, and after a failure the next attempt waits a capped, jittered exponential
backoff; meanwhile every interval still runs the lease (safe mode). The loop runs as a background task
beside request handling; it costs one snapshot and one round trip per interval. Only RedisError, OSError
and timeouts count as the blackboard failing; anything else is a bug and takes the process down
(``crash_on_failure``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from s3lanes.clock import Clock
from s3lanes.config import ClusterConfig
from s3lanes.core.cluster_budget import (
    LaneDemandReport,
    LaneReport,
    Mode,
    NodeLease,
    NodeReport,
    ReportError,
    SharedLane,
    decode_report,
    encode_report,
    lane_demand_bps,
)
from s3lanes.core.node_lanes import (
    NodeLaneSplit,
    NodeRulesLease,
    WorkerRules,
    split_node_lanes,
    tighter_limits,
)
from s3lanes.core.scheduler import LaneSnapshot, Scheduler
from s3lanes.runtime.spool import Spool

log = logging.getLogger("s3lanes.cluster")

MEMBER_GC_TTLS = 20  # a member silent this many TTLs leaves the member set (its key expired long ago)
BACKOFF_MAX_S = 2.0  # a Redis that is back is found within 2 s; a refused connect costs nothing


@dataclass(frozen=True, slots=True)
class BoardRound:
    """What one exchange with the blackboard returned."""

    board_now: float  # the blackboard's clock, read during the round (seconds)
    payloads: list[bytes]  # every live report, this node's included
    previous: bytes | None = None  # what this node's key held before the write (None: expired or new)


class Board(Protocol):
    """Where reports are shared. ``exchange`` publishes ``payload`` for ``node_id`` (expiring after
    ``ttl_s``) and returns every live report; it raises RedisError, OSError or TimeoutError on failure."""

    async def exchange(self, node_id: str, payload: bytes, ttl_s: float, score: float) -> BoardRound: ...

    async def close(self) -> None: ...


class RedisBoard:
    """The blackboard on a Redis server (standalone, or the primary Sentinel points at)."""

    def __init__(self, url: str, name: str, *, timeout_s: float) -> None:
        self._redis: Redis = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # our loop retries, with backoff; the client must fail fast
            health_check_interval=0,
        )
        self._prefix = f"s3lanes:{name}:"
        self._members_key = self._prefix + "nodes"
        self._known: list[str] = []

    def _key(self, node_id: str) -> str:
        return f"{self._prefix}node:{node_id}"

    async def exchange(self, node_id: str, payload: bytes, ttl_s: float, score: float) -> BoardRound:
        known = self._known
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._key(node_id), payload, px=max(1, int(ttl_s * 1000)), get=True)  # Redis >= 6.2
        pipe.zadd(self._members_key, {node_id: score})
        pipe.zremrangebyscore(self._members_key, "-inf", score - MEMBER_GC_TTLS * ttl_s)
        pipe.zrange(self._members_key, 0, -1)
        pipe.time()
        if known:
            pipe.mget([self._key(m) for m in known])
        res = await pipe.execute()
        members = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in res[3])
        seconds, micros = res[4]
        values: list[Any] = list(res[5]) if known else []
        known_set = set(known)
        new = [m for m in members if m not in known_set]
        if new:
            values.extend(await self._redis.mget([self._key(m) for m in new]))
        self._known = members
        return BoardRound(
            board_now=int(seconds) + int(micros) / 1e6,
            payloads=[v for v in values if v is not None],
            previous=res[0],
        )

    async def close(self) -> None:
        await self._redis.aclose()


class MemoryBoard:
    """An in-process blackboard with Redis' semantics (expiry by TTL, one clock), for tests and simulations.
    ``down = True`` makes every exchange fail as an unreachable Redis would."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, bytes]] = {}  # node id -> (expires at, payload)
        self.down = False

    async def exchange(self, node_id: str, payload: bytes, ttl_s: float, score: float) -> BoardRound:
        if self.down:
            raise ConnectionError("blackboard down")
        now = self._clock.wall()
        old = self._entries.get(node_id)
        self._entries[node_id] = (now + ttl_s, payload)
        live = [p for _, (exp, p) in sorted(self._entries.items()) if exp > now]
        return BoardRound(board_now=now, payloads=live, previous=old[1] if old and old[0] > now else None)

    async def close(self) -> None:
        return None


class ClusterMember:
    """This node in the cluster budget. Start :meth:`run` as a background task; :meth:`close` stops it."""

    def __init__(
        self,
        cfg: ClusterConfig,
        scheduler: Scheduler,
        clock: Clock,
        *,
        board: Board | None = None,
        backlog_bytes: Callable[[str], int] | None = None,
        wake: Callable[[], None] | None = None,
        node_share: bool = False,
        node_workers: int = 1,
        node_board: Board | None = None,
    ) -> None:
        if cfg.redis_url is None and board is None:
            raise ValueError("a cluster member needs [cluster].redis_url (or a board)")
        self.cfg = cfg
        self.node_id = cfg.node_id
        self.instance = secrets.token_hex(6)
        self._scheduler = scheduler
        self._clock = clock
        self._board: Board = (
            board
            if board is not None
            else RedisBoard(cfg.redis_url or "", cfg.name, timeout_s=cfg.redis_timeout_s)
        )
        self._backlog = backlog_bytes
        self._wake = wake  # lets requests the new allowance admits go at once, not at the next window
        # The workers of one node on their own board: they also split the node's configured capacity per
        # lane, so every lane's share and cap holds for the node, not per worker (core.node_lanes).
        self.node_share = node_share
        self.capacity_share = 1.0
        self.node_split: NodeLaneSplit | None = None  # the last per-lane split of the node (node_share)
        self.node_applied: WorkerRules | None = None  # what this worker applies of the node's rules
        # Several workers beside the cluster's Redis: the node's own board, for the split only (node_share).
        self._node_board = node_board
        self.node_board_errors = 0
        self.node_rules = NodeRulesLease(
            self.node_id,
            scheduler.config.lanes,
            ttl_s=cfg.ttl_s,
            workers=node_workers,
            strict=scheduler.config.write_cap_mode == "strict",
            cap_headroom=scheduler.config.cap_headroom,
            now=clock.monotonic(),
        )
        specs = {s.name: s for s in scheduler.config.lanes}
        strict = scheduler.config.write_cap_mode == "strict"
        self.shared = tuple(
            SharedLane(
                name=name,
                limit=specs[name].limit,
                limit_while_reads_active=specs[name].limit_while_reads_active if strict else None,
                floor=specs[name].floor,
            )
            for name in cfg.lanes
        )
        self.lease = NodeLease(
            self.node_id, self.shared, interval_s=cfg.interval_s, ttl_s=cfg.ttl_s, now=clock.monotonic()
        )
        self.redis_up = False
        self.redis_errors = 0
        self.bad_reports = 0
        self.rounds = 0
        self.last_error: str | None = None
        self.last_ok_at: float | None = None  # monotonic
        self.node_id_conflict = False
        self._foreign_writes = 0  # consecutive rounds that found another instance's report under our key
        self._board_offset: float | None = None  # blackboard clock - monotonic clock
        self._next_attempt = -math.inf
        self._failures = 0
        self._rng = random.Random()
        self._last_own: NodeReport | None = None
        self._last_reports: list[NodeReport] = []

    # -- the loop -----------------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            started = self._clock.monotonic()
            await self.step()
            elapsed = self._clock.monotonic() - started
            await self._clock.sleep(max(0.0, self.cfg.interval_s - elapsed))

    async def close(self) -> None:
        await self._board.close()
        if self._node_board is not None:
            await self._node_board.close()

    async def step(self) -> None:
        """One round: report, exchange (unless backing off), decide, apply."""
        now = self._clock.monotonic()
        own = self._report(now)
        reports: list[NodeReport] | None = None
        board_now = self._board_time(now)
        if now >= self._next_attempt:
            reports, board_now = await self._exchange(own, now)
        verdict = self.lease.decide(own, reports, board_now=board_now, now=self._clock.monotonic())
        now = self._clock.monotonic()
        rules = None
        if self.node_share:
            node_reports, node_now = reports, board_now
            if self._node_board is not None:  # the node's own board beside the cluster's Redis
                node_reports, node_now = await self._exchange_node(own)
            split = None
            if node_reports is not None:
                split = split_node_lanes(
                    node_reports,
                    self._scheduler.config.lanes,
                    now=node_now,
                    ttl_s=self.cfg.ttl_s,
                    strict=self._scheduler.config.write_cap_mode == "strict",
                    cap_headroom=self._scheduler.config.cap_headroom,
                    estimated=self._scheduler.config.capacity_bps is None,
                )
            # No fresh split: the last one for a TTL, then the safe local rule (core.node_lanes).
            rules = self.node_rules.decide(split, capacity_bps=self._scheduler.node_capacity_bps(), now=now)
            if split is not None and self.node_id in split.shares:
                self.node_split = split
            if rules is not None:
                self.node_applied = rules
                self.capacity_share = rules.share
                self._scheduler.set_node_caps(True, now)
                self._scheduler.set_capacity_share(self.capacity_share, now)
                self._scheduler.set_node_guard(rules.guard_multiplier, now)
                for lane, floor in rules.floors.items():
                    self._scheduler.set_node_floor(lane, floor, now)
        # The cluster's allowance or the node's part, whichever paces a lane lower.
        limits = tighter_limits(
            verdict.allowances, verdict.for_reads, rules, cap_headroom=self._scheduler.config.cap_headroom
        )
        for lane, lim in limits.items():
            self._scheduler.set_external_limit(
                lane, lim.bps, now, for_reads=lim.for_reads, headroom_taken=lim.headroom_taken
            )
        if self._wake is not None:
            self._wake()
        self._last_own = own
        self.rounds += 1

    async def _exchange(self, own: NodeReport, now: float) -> tuple[list[NodeReport] | None, float]:
        was_up = self.redis_up
        try:
            async with asyncio.timeout(2 * self.cfg.redis_timeout_s):
                rnd = await self._board.exchange(
                    self.node_id, encode_report(own), self.cfg.ttl_s, own.reported_at
                )
        except (RedisError, OSError, TimeoutError) as exc:
            self.redis_errors += 1
            self.redis_up = False
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._failures += 1
            backoff = min(BACKOFF_MAX_S, self.cfg.interval_s * 2 ** (self._failures - 1))
            self._next_attempt = now + backoff * self._rng.uniform(0.5, 1.0)
            if was_up or self._failures == 1:
                log.warning(
                    "cluster: Redis unreachable (%s); shared lanes in safe mode until it is back",
                    self.last_error,
                )
            return None, self._board_time(now)
        after = self._clock.monotonic()
        # TIME was read somewhere during the round: assume its middle.
        self._board_offset = rnd.board_now - (now + after) / 2
        self._failures = 0
        self._next_attempt = -math.inf
        self.redis_up = True
        self.last_ok_at = after
        if not was_up:
            log.info("cluster: Redis reachable, %d report(s) on the board", len(rnd.payloads))
        reports = self._decode(rnd.payloads)
        # Our key held another instance's report: once is a restart (our previous life's report had not
        # expired yet), twice in a row is another live gateway with the same node_id.
        self._foreign_writes = self._foreign_writes + 1 if self._foreign(rnd.previous) else 0
        conflict = self._foreign_writes >= 2
        if conflict and not self.node_id_conflict:
            log.error("cluster: another gateway reports as node %r; give each a unique node_id", self.node_id)
        self.node_id_conflict = conflict
        self._last_reports = reports
        return reports, rnd.board_now

    async def _exchange_node(self, own: NodeReport) -> tuple[list[NodeReport] | None, float]:
        """One round on the node's board (several workers beside the cluster's Redis): this worker's report
        on the board's clock, every live one back; None if the board failed (counted)."""
        assert self._node_board is not None
        at = self._clock.wall()
        try:
            async with asyncio.timeout(2 * self.cfg.redis_timeout_s):
                rnd = await self._node_board.exchange(
                    self.node_id, encode_report(replace(own, reported_at=at)), self.cfg.ttl_s, at
                )
        except (OSError, TimeoutError) as exc:
            self.node_board_errors += 1
            log.debug("cluster: the node's board failed: %s", exc)
            return None, at
        return self._decode(rnd.payloads), rnd.board_now

    def _decode(self, payloads: list[bytes]) -> list[NodeReport]:
        """The reports among ``payloads``; a bad one is ignored and counted."""
        reports: list[NodeReport] = []
        for raw in payloads:
            try:
                reports.append(decode_report(raw))
            except ReportError as exc:
                self.bad_reports += 1
                log.debug("cluster: ignoring a bad report: %s", exc)
        return reports

    def _foreign(self, previous: bytes | None) -> bool:
        if previous is None:
            return False
        try:
            return decode_report(previous).instance != self.instance
        except ReportError:
            return True

    def _board_time(self, now: float) -> float:
        return now + self._board_offset if self._board_offset is not None else self._clock.wall()

    def _lane_demand(self, ln: LaneSnapshot, capacity_bps: float) -> LaneDemandReport:
        """A lane's rate, backlog (queued here plus pending in the spool) and demand until the next report."""
        backlog = ln.queued_bytes + (self._backlog(ln.name) if self._backlog is not None else 0)
        return LaneDemandReport(
            rate_bps=ln.granted_rate_bps,
            demand_bps=lane_demand_bps(
                rate_bps=ln.granted_rate_bps,
                backlog_bytes=backlog,
                capacity_bps=capacity_bps,
                horizon_s=self.cfg.interval_s,
            ),
            backlog_bytes=backlog,
        )

    def _report(self, now: float) -> NodeReport:
        snap = self._scheduler.snapshot(now)
        lanes = {}
        for s in self.shared:
            d = self._lane_demand(snap.lane(s.name), snap.capacity_bps)
            lanes[s.name] = LaneReport(
                rate_bps=d.rate_bps,
                demand_bps=d.demand_bps,
                backlog_bytes=d.backlog_bytes,
                floor_bps=s.floor * snap.capacity_bps,
                allowance_bps=self.lease.allowances.get(s.name),
            )
        demand: float | None = None
        node_lanes: dict[str, LaneDemandReport] | None = None
        delivered: float | None = None
        busy: float | None = None
        if self.node_share:
            delivered, busy = self._scheduler.delivered_last_s(now)
            node_lanes = {
                ln.name: self._lane_demand(ln, self._scheduler.node_capacity_bps()) for ln in snap.lanes
            }
            demand = math.fsum(ln.demand_bps for ln in node_lanes.values())
        return NodeReport(
            node_id=self.node_id,
            instance=self.instance,
            reported_at=self._board_time(now),
            capacity_bps=self._scheduler.node_capacity_bps(),
            reads_active=snap.reads_active,
            mode=self.lease.mode.value,
            lanes=lanes,
            demand_bps=demand,
            node_lanes=node_lanes,
            guard_multiplier=snap.guard_multiplier if self.node_share else None,
            delivered_bps=delivered,
            reads_busy=busy,
            store_saturated=self._scheduler.store_saturated(now) if self.node_share else None,
        )

    # -- what an operator sees ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The ``cluster`` section of ``/_s3lanes/status`` (JSON-ready)."""
        view = self.lease.last_view
        now = self._clock.monotonic()
        board_now = self._board_time(now)
        return {
            "enabled": True,
            "name": self.cfg.name,
            "node_id": self.node_id,
            "mode": self.lease.mode.value,
            "redis_up": self.redis_up,
            "redis_errors_total": self.redis_errors,
            "last_error": self.last_error,
            "last_ok_age_s": None if self.last_ok_at is None else max(0.0, now - self.last_ok_at),
            "bad_reports_total": self.bad_reports,
            "node_id_conflict": self.node_id_conflict,
            "interval_s": self.cfg.interval_s,
            "ttl_s": self.cfg.ttl_s,
            "capacity_bps": None if view is None else view.capacity_bps,
            # Several workers: this worker's part of the node's capacity (1 otherwise).
            "capacity_share": self.capacity_share,
            # Several workers: the node's read-latency guard multiplier this worker applies (1: no cut).
            "node_guard_multiplier": None
            if self.node_applied is None
            else self.node_applied.guard_multiplier,
            # Several workers: "node" (a fresh split), "held" (the last one, the board not fresh for up to a
            # TTL), "safe" (no fresh board for a TTL: 1 / N of the node and its caps, its own guard) or
            # "starting"; and how long ago the last fresh split was.
            "node_rules_mode": self.node_rules.mode.value if self.node_share else None,
            # Several workers: what the node's caps while reads are active are scaled by (a saturated store
            # delivering less than the configured bandwidth; 1 otherwise).
            "node_cap_scale": None if self.node_split is None else self.node_split.cap_scale,
            # Several workers: the node's capacity the split is of (the configured one, or the node's estimate
            # from the workers' reports: core.node_lanes.node_capacity_bps).
            "node_capacity_bps": None if self.node_split is None else self.node_split.capacity_bps,
            "node_board_age_s": self.node_rules.board_age_s(now) if self.node_share else None,
            # Several workers beside the cluster's Redis: failed exchanges with the node's own board.
            "node_board_errors_total": self.node_board_errors,
            # Several workers: the node's allocation per lane and this worker's part of each (bytes/s).
            "node_lanes": None
            if self.node_split is None or self.node_id not in self.node_split.parts
            else {
                name: {"node_bps": bps, "part_bps": self.node_split.parts[self.node_id][name]}
                for name, bps in sorted(self.node_split.lanes.items())
            },
            "reads_active_on": [] if view is None else list(view.readers),
            "lanes": {
                s.name: {
                    "allowance_bps": self.lease.allowances.get(s.name),
                    "budget_bps": None if view is None else view.lanes[s.name].budget_bps,
                    "cluster_demand_bps": None if view is None else view.lanes[s.name].demand_bps,
                    "floors_exceed_budget": None if view is None else view.lanes[s.name].floors_exceed_budget,
                    "safe_share_bps": None
                    if self._last_own is None
                    else self.lease.safe_share(self._last_own, s.name),
                }
                for s in self.shared
            },
            "nodes": [
                {
                    "node_id": r.node_id,
                    "age_s": max(0.0, board_now - r.reported_at),
                    "mode": r.mode,
                    "reads_active": r.reads_active,
                    "capacity_bps": r.capacity_bps,
                    "lanes": {
                        name: {
                            "rate_bps": ln.rate_bps,
                            "demand_bps": ln.demand_bps,
                            "backlog_bytes": ln.backlog_bytes,
                            "allowance_bps": ln.allowance_bps,
                        }
                        for name, ln in sorted(r.lanes.items())
                    },
                }
                for r in sorted(self._last_reports, key=lambda r: r.node_id)
            ]
            if self.redis_up
            else [],
        }

    def collector(self) -> Callable[[], Iterable[Metric]]:
        """Prometheus families read at scrape time (register with ``Metrics.add_snapshot_collector``)."""

        def collect() -> Iterable[Metric]:
            view = self.lease.last_view
            yield GaugeMetricFamily(
                "s3lanes_cluster_redis_up",
                "1 if the last exchange with the cluster's Redis succeeded.",
                value=1.0 if self.redis_up else 0.0,
            )
            yield GaugeMetricFamily(
                "s3lanes_cluster_safe_mode",
                "1 while the shared lanes run on the safe local share (Redis unreachable).",
                value=1.0 if self.lease.mode is Mode.SAFE else 0.0,
            )
            yield GaugeMetricFamily(
                "s3lanes_cluster_nodes",
                "Live gateways in the last cluster view (this one included; 0 before the first).",
                value=0.0 if view is None or not self.redis_up else float(len(view.nodes)),
            )
            yield GaugeMetricFamily(
                "s3lanes_cluster_reads_active",
                "1 if any gateway of the cluster reported reads active in the last view.",
                value=1.0 if view is not None and view.reads_active else 0.0,
            )
            errors = CounterMetricFamily(
                "s3lanes_cluster_redis_errors", "Failed exchanges with the cluster's Redis."
            )
            errors.add_metric([], float(self.redis_errors))
            yield errors
            allowance = GaugeMetricFamily(
                "s3lanes_cluster_allowance_bytes_per_second",
                "This gateway's allowance of the shared lane's cluster budget.",
                labels=["lane"],
            )
            budget = GaugeMetricFamily(
                "s3lanes_cluster_budget_bytes_per_second",
                "The shared lane's cluster-wide budget in the last view.",
                labels=["lane"],
            )
            for s in self.shared:
                a = self.lease.allowances.get(s.name)
                if a is not None:
                    allowance.add_metric([s.name], a)
                if view is not None:
                    budget.add_metric([s.name], view.lanes[s.name].budget_bps)
            yield allowance
            yield budget

        return collect


def spool_backlog(spool: Spool) -> Callable[[str], int]:
    """Bytes acknowledged into ``spool`` and not yet on the backend, per lane (the drains' backlog)."""

    def backlog(lane: str) -> int:
        return sum(e.size for e in spool.entries() if e.lane == lane)

    return backlog
