"""Cluster-wide budgets for shared lanes: Doorman-style apportionment over reports on a blackboard.

Theory of operation
-------------------
A cluster runs one gateway per GPU node, all draining into one store. A *shared* lane's cap (the checkpoint
lane's 30% of the store's bandwidth while dataset reads are active anywhere) must hold for the sum of the
nodes, not per node. There is no coordinator: every ``interval_s`` each
node publishes a :class:`NodeReport` on a blackboard (Redis, ``s3lanes.runtime.cluster``) with a TTL, reads
every live report back, and runs the same deterministic function, :func:`apportion`, on that snapshot. Since
the nodes compute the same thing from (nearly) the same snapshot, each can take its own allowance without
asking anyone; a node that goes away stops refreshing its report and drops out after the TTL.

**The budget** of a shared lane is ``B = f x C_glob`` where ``f`` is the lane's ``limit_while_reads_active``
if *any* live node reports reads active (strict mode), else 1 (work-conserving: the drains may use the whole
store when nobody reads), capped in both cases by the lane's ``limit``. ``C_glob`` is the **median** of the
nodes' capacity figures: they all describe the same store, and the median ignores a minority of wrong ones
(a node whose estimator still holds its start-up guess, or collapsed after a local network fault). The
minimum would let one sick node throttle the whole cluster, the maximum or the mean would let one
over-optimistic node lift everyone's cap.

**Apportionment** is Doorman's FAIR_SHARE (max-min water-filling) over the nodes' *demands*, on top of their
floors. The local scheduler never caps a lane below its ``floor`` (writes must not starve), so every node's
floor is spent first, whatever its demand; that is also the small non-zero allowance a node whose demand
appears suddenly can use before the next round. The rest, ``B - sum(floors)``, is water-filled over the
demands above the floors: every node gets ``min(demand - floor, level)``, the level as high as the rest
allows. What is left when every demand is met is spread equally, so the allowances always add up to ``B``:
a node whose demand was underestimated can still grow into its share. If the floors alone exceed ``B``
(more than ``limit_while_reads_active / floor`` nodes, 15 with the default checkpoint lane) the cap cannot
hold without starving someone; the floors win and :attr:`LaneBudget.floors_exceed_budget` says so.

A node's **demand** (:func:`lane_demand_bps`) is what it would use before the next round if it were allowed:
a backlogged lane (tickets queued, spool bytes pending) wants its backlog over one interval, up to the
capacity ("as much as it can get"); otherwise its recent rate with 25% headroom, so a node that is not
backlogged can grow by a quarter per round and is never handed much more than it uses.

**One node's lease** (:class:`NodeLease`) turns views into the allowance it applies, through explicit modes
(h11-style transition table below):

- ``STARTING``: no round has succeeded yet.
- ``LEARNING``: a round succeeded after ``STARTING`` or ``SAFE``. For one TTL the allowance is the computed
  one but never more than what the node held before (its floor at start): the others may not have seen this
  node's report yet, or (after an outage) this node may not have seen theirs, and a node that thinks it is
  alone would take the whole budget. Doorman's *learning mode* after a master failover, in spirit.
- ``NORMAL``: the computed allowance.
- ``SAFE``: the blackboard cannot be reached (or this node's own report is not in it). Starting from what it
  held, the allowance moves linearly, over ``SAFE_DECAY_INTERVALS`` intervals, to the *safe share* ``B_r /
  N``: the budget with reads active and the node count of the last good view (Doorman's safe capacity,
  capacity / #clients), never below the floor. ``B_r``, not the last ``B``: a node that cannot see the
  others cannot know whether readers started meanwhile, and a safe mode is there to protect them. If every
  node loses the blackboard at once (Redis is down), their allowances all move towards ``B_r / N`` with the
  same weight, so their sum goes from the last total to ``B_r`` and never above the larger of the two. Before
  any good view the safe share is the floor (the cluster's size is unknown).

Deterministic: reports are sorted by node id, ties broken by it, sums taken with ``math.fsum``; the same
snapshot gives the same result on every node, in any order. Pure: no I/O, no clock; ``now`` is passed in
(the blackboard's clock for report ages, the node's monotonic clock for the lease's timers).

This module is *not* a rate limiter: it only decides each node's allowance; the node's own scheduler
(:meth:`s3lanes.core.scheduler.Scheduler.set_external_limit`) paces the lane to it.
"""

from __future__ import annotations

import enum
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from s3lanes.core.transitions import Transitions

REPORT_VERSION = 1
DEMAND_HEADROOM = 1.25  # a lane that is not backlogged may grow by a quarter per round
SAFE_DECAY_INTERVALS = 4  # safe mode reaches the safe share after this many intervals
MAX_NODE_ID_CHARS = 200
_LaneT = TypeVar("_LaneT")  # what one lane's entry of a report reads as


# -- what nodes publish -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneReport:
    """One shared lane on one node, as published."""

    rate_bps: float  # granted over the last second
    demand_bps: float  # lane_demand_bps
    backlog_bytes: int  # queued in the scheduler plus pending in the spool
    floor_bps: float  # the local scheduler never caps the lane below this
    allowance_bps: float | None  # what the node applies now (None: no external limit yet)


@dataclass(frozen=True, slots=True)
class LaneDemandReport:
    """One lane (any lane, not only the shared ones) on one worker of a node, as published for the node's
    per-lane split (:func:`s3lanes.core.node_lanes.split_node_lanes`)."""

    rate_bps: float  # granted over the last second
    demand_bps: float  # lane_demand_bps
    backlog_bytes: int  # queued in the scheduler plus pending in the spool


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A node's report on the blackboard. ``reported_at`` is on the blackboard's clock (seconds)."""

    node_id: str
    instance: str  # random per process: two gateways configured with one node id can be told apart
    reported_at: float
    capacity_bps: float
    reads_active: bool
    mode: str
    lanes: Mapping[str, LaneReport] = field(default_factory=dict)
    # Several workers of one node: what this worker would use of the store over all its lanes (node_share).
    demand_bps: float | None = None
    # Several workers of one node: every lane's demand on this worker (core.node_lanes), None if not sent.
    node_lanes: Mapping[str, LaneDemandReport] | None = None
    # Several workers of one node: this worker's read-latency guard multiplier (in (0, 1]; None: not sent).
    guard_multiplier: float | None = None
    # Several workers of one node: what the store delivered to this worker over the last full second
    # (bytes/s, all lanes), and the fraction of that second with a read queued or in flight on it; the node's
    # caps follow a saturated store with them (core.node_lanes.node_cap_scale). None: not sent.
    delivered_bps: float | None = None
    reads_busy: float | None = None
    # Several workers, an estimated capacity: this worker's in-flight window was full within the last second
    # (the store was its bottleneck: core.node_lanes.node_capacity_bps). None: not sent.
    store_saturated: bool | None = None


class ReportError(ValueError):
    """A blackboard entry that is not a report this version understands (ignored, counted)."""


def encode_report(r: NodeReport) -> bytes:
    """JSON (an operator can read it with redis-cli), keys sorted, no spaces."""
    doc = {
        "v": REPORT_VERSION,
        "node": r.node_id,
        "inst": r.instance,
        "at": r.reported_at,
        "cap": r.capacity_bps,
        "reads": r.reads_active,
        "mode": r.mode,
        "lanes": {
            name: {
                "rate": ln.rate_bps,
                "demand": ln.demand_bps,
                "backlog": ln.backlog_bytes,
                "floor": ln.floor_bps,
                "allow": ln.allowance_bps,
            }
            for name, ln in sorted(r.lanes.items())
        },
    }
    if r.demand_bps is not None:
        doc["dem"] = r.demand_bps
    if r.node_lanes is not None:
        doc["nl"] = {
            name: {"rate": ln.rate_bps, "demand": ln.demand_bps, "backlog": ln.backlog_bytes}
            for name, ln in sorted(r.node_lanes.items())
        }
    if r.guard_multiplier is not None:
        doc["gm"] = r.guard_multiplier
    if r.delivered_bps is not None:
        doc["dlv"] = r.delivered_bps
    if r.reads_busy is not None:
        doc["rb"] = r.reads_busy
    if r.store_saturated is not None:
        doc["sat"] = r.store_saturated
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _num(doc: Mapping[str, Any], key: str) -> Any:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ReportError(f"{key!r} must be a finite number >= 0, got {v!r}")
    return v


def decode_report(raw: bytes | str) -> NodeReport:
    """Parse and check one report; raises :class:`ReportError` for anything else."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != REPORT_VERSION:
        raise ReportError(f"not a version {REPORT_VERSION} report")
    node, inst, mode = doc.get("node"), doc.get("inst"), doc.get("mode")
    if not isinstance(node, str) or not node or len(node) > MAX_NODE_ID_CHARS:
        raise ReportError(f"bad node id {node!r}")
    if not isinstance(inst, str) or not isinstance(mode, str) or not isinstance(doc.get("reads"), bool):
        raise ReportError("'inst' and 'mode' must be strings, 'reads' a boolean")
    lanes = _lane_tables(doc.get("lanes"), _lane_report, "lanes")
    return NodeReport(
        node_id=node,
        instance=inst,
        reported_at=float(_num(doc, "at")),
        capacity_bps=float(_num(doc, "cap")),
        reads_active=doc["reads"],
        mode=mode,
        lanes=lanes,
        demand_bps=None if doc.get("dem") is None else float(_num(doc, "dem")),
        node_lanes=_node_lanes(doc.get("nl")),
        guard_multiplier=_guard_multiplier(doc),
        delivered_bps=None if doc.get("dlv") is None else float(_num(doc, "dlv")),
        reads_busy=_reads_busy(doc),
        store_saturated=_store_saturated(doc.get("sat")),
    )


def _store_saturated(raw: Any) -> bool | None:
    """A worker's "sat" flag; absent in reports of older versions (None)."""
    if raw is not None and not isinstance(raw, bool):
        raise ReportError(f"'sat' must be a boolean, got {raw!r}")
    return raw


def _reads_busy(doc: Mapping[str, Any]) -> float | None:
    """A worker's reads-busy fraction ("rb", within [0, 1]); absent in reports of older versions (None)."""
    return _fraction(doc, "rb", zero=True)


def _guard_multiplier(doc: Mapping[str, Any]) -> float | None:
    """A worker's read-latency guard multiplier ("gm"); absent in reports of older versions (None)."""
    return _fraction(doc, "gm", zero=False)


def _fraction(doc: Mapping[str, Any], key: str, *, zero: bool) -> float | None:
    """The report's ``key``, a fraction within (0, 1] (``zero``: [0, 1]), or None if absent."""
    if doc.get(key) is None:
        return None
    m = float(_num(doc, key))
    if m > 1.0 or (m == 0.0 and not zero):  # _num refuses a negative one
        raise ReportError(f"{key!r} must be within {'[' if zero else '('}0, 1], got {m!r}")
    return m


def _node_lanes(raw: Any) -> dict[str, LaneDemandReport] | None:
    """The per-lane demands of a worker's report ("nl"); absent in reports of older versions (None).
    Unknown keys inside a lane's entry are ignored, as unknown keys of the report are."""
    if raw is None:
        return None
    return _lane_tables(raw, _lane_demand, "nl", " of 'nl'")


def _lane_tables(
    raw: Any, parse: Callable[[Mapping[str, Any]], _LaneT], key: str, where: str = ""
) -> dict[str, _LaneT]:
    """The report's table ``key`` (``raw``): one table per lane, each read by ``parse``. ``where`` follows a
    bad lane's name in the error."""
    if not isinstance(raw, dict):
        raise ReportError(f"{key!r} must be a table")
    out: dict[str, _LaneT] = {}
    for name, ln in raw.items():
        if not isinstance(ln, dict):
            raise ReportError(f"lane {name!r}{where} must be a table")
        out[name] = parse(ln)
    return out


def _lane_report(ln: Mapping[str, Any]) -> LaneReport:
    backlog = _num(ln, "backlog")
    return LaneReport(
        rate_bps=float(_num(ln, "rate")),
        demand_bps=float(_num(ln, "demand")),
        backlog_bytes=int(backlog),
        floor_bps=float(_num(ln, "floor")),
        allowance_bps=None if ln.get("allow") is None else float(_num(ln, "allow")),
    )


def _lane_demand(ln: Mapping[str, Any]) -> LaneDemandReport:
    return LaneDemandReport(
        rate_bps=float(_num(ln, "rate")),
        demand_bps=float(_num(ln, "demand")),
        backlog_bytes=int(_num(ln, "backlog")),
    )


def lane_demand_bps(*, rate_bps: float, backlog_bytes: int, capacity_bps: float, horizon_s: float) -> float:
    """What a lane on one node would use before the next round (``horizon_s`` away) if it were allowed.

    Backlogged: its backlog over the horizon, up to the capacity (a big backlog wants all it can get).
    Otherwise, or if that is less: its recent rate plus ``DEMAND_HEADROOM``."""
    want = rate_bps * DEMAND_HEADROOM
    if backlog_bytes > 0:
        want = max(want, backlog_bytes / horizon_s)
    return min(capacity_bps, want)


# -- apportionment ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SharedLane:
    """A lane whose budget is cluster-wide. Fractions are of the cluster capacity ``C_glob``."""

    name: str
    limit: float | None  # always in force
    limit_while_reads_active: (
        float | None
    )  # while reads are active on any node (None in work-conserving mode)
    floor: float = 0.0

    def budget_fraction(self, reads_active: bool) -> float:
        f = 1.0 if self.limit is None else min(1.0, self.limit)
        if reads_active and self.limit_while_reads_active is not None:
            f = min(f, self.limit_while_reads_active)
        return f

    def for_reads(self, reads_active: bool) -> bool:
        """Whether the budget for this read activity is the reads' cap (``limit_while_reads_active``, no
        looser than ``limit``): a node then paces its allowance under it with the cap's headroom, as it does
        its own cap while reads are active (``Scheduler.set_external_limit(for_reads=True)``)."""
        cap = self.limit_while_reads_active
        return reads_active and cap is not None and (self.limit is None or cap <= self.limit)


@dataclass(frozen=True, slots=True)
class LaneBudget:
    lane: str
    budget_bps: float  # B for the current read activity
    safe_budget_bps: float  # B with reads active (what safe mode shares out)
    allowances: Mapping[str, float]  # node id -> bytes/s; sums to B unless the floors exceed it
    demand_bps: float  # sum of the live nodes' demands
    floors_exceed_budget: bool


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The result of :func:`apportion` on one snapshot of the blackboard."""

    at: float  # the blackboard's clock
    nodes: tuple[str, ...]  # live nodes, sorted
    capacity_bps: float  # C_glob
    readers: tuple[str, ...]  # live nodes with reads active
    lanes: Mapping[str, LaneBudget]

    @property
    def reads_active(self) -> bool:
        return bool(self.readers)


def fair_share(budget: float, wants: Sequence[float]) -> list[float]:
    """Max-min fair split of ``budget`` over ``wants`` (water-filling; Doorman's FAIR_SHARE): each gets
    ``min(want, level)``, with the level as high as the budget allows. Never more than the budget in total.
    Wants are visited smallest first (ties in index order), each taking at most an equal split of what is
    left, so the result is exact and deterministic in O(n log n)."""
    n = len(wants)
    out = [0.0] * n
    left = max(0.0, budget)
    for k, i in enumerate(sorted(range(n), key=lambda j: (wants[j], j))):
        give = min(max(0.0, wants[i]), left / (n - k))
        out[i] = give
        left = max(0.0, left - give)
    return out


def live_reports(reports: Iterable[NodeReport], now: float, ttl_s: float) -> list[NodeReport]:
    """Reports younger than ``ttl_s`` at ``now``, the newest per node id, sorted by node id."""
    newest: dict[str, NodeReport] = {}
    for r in reports:
        if r.reported_at < now - ttl_s:
            continue
        seen = newest.get(r.node_id)
        if seen is None or (r.reported_at, r.instance) > (seen.reported_at, seen.instance):
            newest[r.node_id] = r
    return [newest[k] for k in sorted(newest)]


def apportion(
    reports: Iterable[NodeReport], lanes: Sequence[SharedLane], now: float, ttl_s: float
) -> ClusterView | None:
    """Every shared lane's budget and each live node's allowance of it; None if no report is live."""
    live = live_reports(reports, now, ttl_s)
    if not live:
        return None
    ids = tuple(r.node_id for r in live)
    readers = tuple(r.node_id for r in live if r.reads_active)
    c_glob = float(statistics.median(r.capacity_bps for r in live))
    budgets: dict[str, LaneBudget] = {}
    for spec in lanes:
        b = spec.budget_fraction(bool(readers)) * c_glob
        empty = LaneReport(0.0, 0.0, 0, 0.0, None)
        per_node = [r.lanes.get(spec.name, empty) for r in live]
        floors = [min(ln.floor_bps, b) for ln in per_node]
        floor_sum = math.fsum(floors)
        if floor_sum >= b:
            allow = floors
        else:
            rest = b - floor_sum
            extra = fair_share(
                rest, [max(0.0, ln.demand_bps - f) for ln, f in zip(per_node, floors, strict=True)]
            )
            leftover = max(0.0, rest - math.fsum(extra)) / len(live)
            allow = [f + e + leftover for f, e in zip(floors, extra, strict=True)]
        budgets[spec.name] = LaneBudget(
            lane=spec.name,
            budget_bps=b,
            safe_budget_bps=spec.budget_fraction(True) * c_glob,
            allowances=dict(zip(ids, allow, strict=True)),
            demand_bps=math.fsum(ln.demand_bps for ln in per_node),
            floors_exceed_budget=floor_sum > b,
        )
    return ClusterView(at=now, nodes=ids, capacity_bps=c_glob, readers=readers, lanes=budgets)


# -- one node's lease -------------------------------------------------------------------------------------


class Mode(enum.Enum):
    STARTING = "starting"
    LEARNING = "learning"
    NORMAL = "normal"
    SAFE = "safe"


_MOVES = Transitions(
    {
        Mode.STARTING: {Mode.LEARNING, Mode.SAFE},
        Mode.LEARNING: {Mode.NORMAL, Mode.SAFE},
        Mode.NORMAL: {Mode.SAFE},
        Mode.SAFE: {Mode.LEARNING},
    }
)


@dataclass(frozen=True, slots=True)
class Verdict:
    mode: Mode
    allowances: Mapping[str, float]  # shared lane -> bytes/s to apply
    view: ClusterView | None  # the view this round computed (None in safe mode)
    # shared lanes whose allowance is a share of the reads' cap (SharedLane.for_reads; in safe mode every
    # lane with one: safe mode heads for the reads-active budget)
    for_reads: frozenset[str] = frozenset()


class NodeLease:
    """One node's allowances of the shared lanes, round after round. See the module docstring for the
    modes; ``now`` is the node's monotonic clock, ``board_now`` the blackboard's clock."""

    def __init__(
        self, node_id: str, lanes: Sequence[SharedLane], *, interval_s: float, ttl_s: float, now: float
    ) -> None:
        if not lanes:
            raise ValueError("at least one shared lane")
        if not (interval_s > 0 and ttl_s > interval_s):
            raise ValueError("need interval_s > 0 and ttl_s > interval_s")
        self.node_id = node_id
        self.lanes = tuple(lanes)
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.mode = Mode.STARTING
        self.since = now  # when the current mode began
        self.allowances: dict[str, float] = {}
        self.last_view: ClusterView | None = None
        self._learn_cap: dict[str, float] = {}
        self._safe_from: dict[str, float] = {}

    def _to(self, mode: Mode, now: float) -> None:
        _MOVES.check(self.mode, mode, "cluster lease")
        self.mode = mode
        self.since = now

    def _held(self, own: NodeReport) -> dict[str, float]:
        """What the node holds now: its allowance, or its floor before the first one."""
        return {s.name: self.allowances.get(s.name, _floor(own, s.name)) for s in self.lanes}

    def decide(
        self, own: NodeReport, reports: Sequence[NodeReport] | None, *, board_now: float, now: float
    ) -> Verdict:
        """One round. ``reports`` is the blackboard's snapshot (this node's own report included, as just
        published), or None if the blackboard could not be reached."""
        view = None if reports is None else apportion(reports, self.lanes, board_now, self.ttl_s)
        if view is None or self.node_id not in view.nodes:
            return self._safe(own, now)
        computed = {s.name: view.lanes[s.name].allowances[self.node_id] for s in self.lanes}
        if self.mode in (Mode.STARTING, Mode.SAFE):
            self._learn_cap = self._held(own)
            self._to(Mode.LEARNING, now)
        if self.mode is Mode.LEARNING and now - self.since >= self.ttl_s:
            self._to(Mode.NORMAL, now)
        if self.mode is Mode.LEARNING:
            computed = {k: min(v, self._learn_cap[k]) for k, v in computed.items()}
        self.allowances = computed
        self.last_view = view
        for_reads = frozenset(s.name for s in self.lanes if s.for_reads(view.reads_active))
        return Verdict(self.mode, dict(computed), view, for_reads)

    def safe_share(self, own: NodeReport, lane: str) -> float:
        """Where safe mode is heading: the reads-active budget over the last node count, or the floor."""
        floor = _floor(own, lane)
        if self.last_view is None:
            return floor
        budget = self.last_view.lanes[lane]
        return max(floor, budget.safe_budget_bps / len(self.last_view.nodes))

    def _safe(self, own: NodeReport, now: float) -> Verdict:
        if self.mode is not Mode.SAFE:
            self._safe_from = self._held(own)
            self._to(Mode.SAFE, now)
        progress = min(1.0, (now - self.since) / (SAFE_DECAY_INTERVALS * self.interval_s))
        out = {}
        for s in self.lanes:
            start, target = self._safe_from[s.name], self.safe_share(own, s.name)
            out[s.name] = max(_floor(own, s.name), start + (target - start) * progress)
        self.allowances = out
        return Verdict(self.mode, dict(out), None, frozenset(s.name for s in self.lanes if s.for_reads(True)))


def _floor(own: NodeReport, lane: str) -> float:
    ln = own.lanes.get(lane)
    return 0.0 if ln is None else ln.floor_bps
