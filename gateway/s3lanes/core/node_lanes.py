"""Several workers of one node: the node's bandwidth split per lane, so the lanes' shares hold for the node.

Theory of operation
-------------------
The workers of a node (``[server] workers``) sit in front of one store, but each runs its own scheduler on
the connections the kernel gave it. If each worker kept the lanes' rules (dataset 70 %, checkpoint at most
30 % while reads are active) inside its own part of the node's bandwidth, a worker that has only readers and
another that has only writers would split the node by their demands, not 70/30. So the rules are applied
once, to the node, and the result is handed out per lane:

1. **The node's allocation per lane.** From the node-wide demand of each lane (the sum of the workers'
   :class:`~s3lanes.core.cluster_budget.LaneDemandReport`; a lane with bytes waiting on any worker is
   *backlogged*: it wants all it can get, as a backlogged lane does in the scheduler, since a closed-loop
   stream held at its part would otherwise only ever be given its rate plus a quarter), with the *same*
   lane table and the same rules as the scheduler: each lane's guarantee (``max(reservation, floor)``), its
   weight, its ``limit``, and, in ``strict`` mode while reads are active on *any* worker, its
   ``limit_while_reads_active`` less the scheduler's ``cap_headroom`` (what the scheduler itself paces a
   capped lane to while reads are active). :func:`s3lanes.core.sched_alloc.allocate` water-fills the
   demands; what is left once they are met goes to the backlogged lanes (to the lanes that have any demand
   if none is), by weight, within their limits: work-conserving (with no reads anywhere the writes get
   everything), and a few HEADs do not take a share of what the reads leave.
2. **Each lane's allocation among the workers.** ``LANE_FLOOR`` of it is split equally (a lane's traffic that
   appears on a worker can start before the next round), the rest water-filled over the workers' demands in
   that lane (max-min fair, :func:`~s3lanes.core.cluster_budget.fair_share`); what is left once every demand
   is met goes to the workers in proportion to their demand (they can grow into it), equally if none has any.
3. **Each worker's part of the node** is the sum of its lanes' parts, plus an equal split of what no lane was
   given (only when the capped lanes are all that want anything). The parts add up to the node's capacity.

A worker paces to its part with the scheduler's existing knobs: the capacity share
(:meth:`~s3lanes.core.scheduler.Scheduler.set_capacity_share`) bounds its total, and an external limit
(:meth:`~s3lanes.core.scheduler.Scheduler.set_external_limit`) each of its lanes, at the lane's part: within
its part a worker would otherwise split by the lanes' reservations and weights again (a worker with half
the node's readers and all its writers would give the writes 30 % of its part, not the node's 30 %).
A lane that nobody on the node uses has no part; it is limited to ``LANE_FLOOR`` of its cap (split among
the workers) if it has one, and otherwise only by its worker's part, so that its first requests go at once.
Since the node split already applies the caps while reads are active, the worker's scheduler no longer
applies them to its part (:meth:`~s3lanes.core.scheduler.Scheduler.set_node_caps`). A lane's part of a cap
for the reads' sake (:func:`capped_for_reads`) is paced as that cap would be by one scheduler: at
``SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)`` of it (``set_external_limit(for_reads=True,
headroom_taken=True)``: the headroom is off already), so that no second, even one that starts with the
lane's ceiling bucket full, goes over the part, and the node's lane over its cap.

The caps while reads are active are shares of what a saturated store *delivers*, as in one scheduler
(:func:`~s3lanes.core.scheduler.saturation_scale`): each worker publishes what the store delivered to it
over the last second and how busy its reads kept it, and once the readers of some worker kept the store
busy, the node's caps are scaled by the saturation scale of the workers' sum over the node's configured
capacity (:func:`node_cap_scale`). A store configured at 40 MB/s that carries 37 MB/s then gives the
writes their cap of 37 MB/s, not of 40.

The read-latency guard is the node's too. Each worker's scheduler runs its own guard
(:class:`~s3lanes.core.sched_control.LatencyGuard`) on the reads it serves, and a worker with only writers
never sees one. So each worker publishes its guard's multiplier, and every worker paces its paced lanes
(``paced_by_guard``) by the smallest multiplier among the live workers whose reads are active, its own
included (:func:`node_guard_multiplier`, :meth:`~s3lanes.core.scheduler.Scheduler.set_node_guard`):
readers missing their target on one worker cut the writes of all, and the writes grow back as that guard
lets go, once those reads stop, or once that worker's report goes stale.

A report without per-lane demands (an older version's) wants the whole capacity in every lane. The node's
capacity is the median of the reports' figures (they describe one store). Deterministic and pure: the same
reports give the same split on every worker; no I/O, no clock (``now`` is the board's).

The progress floor (``progress_interval_s``) needs nothing of the node: it is one round of a lane's queue
per interval, and each worker's queue holds its own streams, so the workers' floors add up to one round of
the node's streams, what one scheduler with all of them would give (within each worker's part of a cap).

**An estimated capacity** (no configured bandwidth) is each worker's own view: its estimator sees only
the traffic whose connections landed on it, so a worker that has half the readers estimates about half
the store, and one that has no traffic keeps its first guess. Each worker publishes, besides its estimate,
what the store delivered to it over the last second and whether its in-flight window was full then (the
store its bottleneck). While some worker's was, the node's capacity is the sum of what the workers got
(the measurement a single estimator takes in that case); otherwise that sum, or the median estimate if
more (:func:`node_capacity_bps`). The split then applies the node's caps as with a configured capacity
(not scaled again: the estimate follows the store already), but the lanes with no cap in force get no part
as a limit: a worker paces them to its own estimate, so a node estimate that is low cannot hold the reads
down and itself with them. Each worker's floors are fractions of its own estimate.

**A board that fails** (:class:`NodeRulesLease`) does not freeze the node's rules. A worker that has no
fresh split (the board's exchange failed, or its own report is not in it) keeps applying the last one for
``ttl_s``, as long as the others keep its report; after that, when they have dropped it from their split
and it may no longer count on theirs, it falls back to a safe local rule (:func:`safe_worker_rules`): its
own read-latency guard (the node's multiplier lets go), the configured floors, ``1 / N`` of the node
(``N`` the configured workers, or the last split's if more) and ``1 / N`` of each lane's cap as it stands
while reads are active (the others' readers may be active: a worker that cannot see them must assume so).
If the board fails for every worker at once (it is one directory), their parts of each cap add up to the
node's cap, never more; if it fails for one worker only, the others split the node without it once its
report is stale, and the node may go over a cap by that worker's ``1 / N`` of it meanwhile. A fresh split
applies again at once. Like the cluster budget's ``SAFE`` mode
(:class:`~s3lanes.core.cluster_budget.NodeLease`), but a step, not a decay: after a TTL the others no longer
count this worker, and its old part of a cap, which can be far above ``1 / N`` of it, would add to theirs.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from s3lanes.core.cluster_budget import NodeReport, fair_share, live_reports
from s3lanes.core.sched_alloc import LaneDemand, allocate
from s3lanes.core.scheduler import READS_BUSY_FRACTION, LaneSpec, external_paced_bps, saturation_scale

# Of each lane's node allocation, this much is split equally among the workers before demands count.
LANE_FLOOR = 0.05
# A worker's part never goes below this fraction of the node (the scheduler needs a share > 0).
MIN_SHARE = 1e-3


@dataclass(frozen=True, slots=True)
class NodeLaneSplit:
    """The result of :func:`split_node_lanes` on one snapshot of the board. Rates in bytes/s."""

    capacity_bps: float  # the node's capacity (median of the reports')
    reads_active: bool  # on any worker
    lanes: Mapping[str, float]  # the node's allocation per lane
    parts: Mapping[str, Mapping[str, float]]  # worker id -> lane -> its part of the lane's allocation
    shares: Mapping[str, float]  # worker id -> its part of the node (fractions adding up to 1)
    # worker id -> lane -> the external limit the worker paces the lane to (None: its part of the node only)
    limits: Mapping[str, Mapping[str, float | None]]
    # the lanes whose limits are parts of a cap for the reads' sake (paced as that cap would be locally)
    for_reads: frozenset[str] = frozenset()
    # the read-latency guard's multiplier for the node's paced lanes (node_guard_multiplier)
    guard_multiplier: float = 1.0
    # worker id -> lane -> its part of the lane's configured floor, a fraction of the worker's own part of the
    # node (Scheduler.set_node_floor): the floor is the node's, not each worker's
    floors: Mapping[str, Mapping[str, float]] | None = None
    # what the caps while reads are active were scaled by (node_cap_scale): 1 unless the store is saturated
    # below the node's configured capacity
    cap_scale: float = 1.0


def node_lane_limit(
    spec: LaneSpec, *, reads_active: bool, strict: bool, cap_headroom: float, cap_scale: float = 1.0
) -> float:
    """A lane's cap in force on the node, a fraction of its capacity (``inf``: none). ``cap_scale``: what
    the caps while reads are active are scaled by (:func:`node_cap_scale`)."""
    f = spec.limit if spec.limit is not None else math.inf
    if reads_active and strict and spec.limit_while_reads_active is not None:
        f = min(f, max(spec.floor, spec.limit_while_reads_active * cap_scale * (1.0 - cap_headroom)))
    return f


def node_capacity_bps(live: Sequence[NodeReport], *, estimated: bool) -> float:
    """The node's capacity: the median of the workers' figures (a configured capacity: they all say the
    same). An estimated one: each worker's estimate sees only its own traffic, so while the store is the
    bottleneck of some worker (its in-flight window was full within the last second) the node's is what
    the store delivered to all of them together, the estimate's own measurement; otherwise at least that,
    and the workers' median estimate if more. A report that does not say what it delivered (an older one)
    leaves the median."""
    median = float(statistics.median(r.capacity_bps for r in live))
    total = _delivered_bps(live)
    if not estimated or total is None:
        return median
    if total > 0 and any(r.store_saturated for r in live):
        return total
    return max(median, total)


def node_cap_scale(live: Sequence[NodeReport], capacity_bps: float) -> float:
    """What the node's caps while reads are active are scaled by: the saturation scale
    (:func:`~s3lanes.core.scheduler.saturation_scale`) of what the store delivered to all the workers
    together over the last second, as a fraction of the node's configured capacity, once the readers keep
    it busy (a worker with reads active had a read queued or in flight for
    :data:`~s3lanes.core.scheduler.READS_BUSY_FRACTION` of that second), as one scheduler scales its own;
    1 otherwise, or if a report does not say what it delivered (an older one)."""
    readers = [r.reads_busy or 0.0 for r in live if r.reads_active]
    if not readers or max(readers) < READS_BUSY_FRACTION or capacity_bps <= 0:
        return 1.0
    total = _delivered_bps(live)
    return 1.0 if total is None else saturation_scale(total / capacity_bps)


def _delivered_bps(live: Sequence[NodeReport]) -> float | None:
    """What the store delivered to all the workers together over the last second; None if a report does not
    say (an older one)."""
    delivered = [r.delivered_bps for r in live]
    if any(d is None for d in delivered):
        return None
    return math.fsum(d for d in delivered if d is not None)


def capped_for_reads(spec: LaneSpec, *, reads_active: bool, strict: bool, cap_headroom: float) -> bool:
    """Whether the lane's cap in force on the node (:func:`node_lane_limit`) is its cap for the reads' sake
    (``limit_while_reads_active``, no looser than ``limit``): its parts are then paced as the scheduler paces
    that cap while reads are active, at ``SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)`` of it, so
    that no second goes over it (the headroom is already off)."""
    cap = spec.limit_while_reads_active
    if not (reads_active and strict and cap is not None) or spec.read_protected:
        return False
    limit = spec.limit if spec.limit is not None else math.inf
    return max(spec.floor, cap * (1.0 - cap_headroom)) <= limit


def node_guard_multiplier(live: Iterable[NodeReport]) -> float:
    """The read-latency guard's multiplier for the paced lanes of every worker of the node: the smallest
    among the workers whose reads are active (a guard that sees no reads has nothing to say), 1 if none
    reads. A report without one (an older version's) does not cut."""
    got = [r.guard_multiplier for r in live if r.reads_active and r.guard_multiplier is not None]
    return min(got, default=1.0)


def _worker_demand(r: NodeReport, lane: str, capacity_bps: float) -> float:
    if r.node_lanes is None:
        return capacity_bps  # an older report: wants everything
    got = r.node_lanes.get(lane)
    return 0.0 if got is None else min(capacity_bps, got.demand_bps)


def _backlogged(r: NodeReport, lane: str) -> bool:
    got = None if r.node_lanes is None else r.node_lanes.get(lane)
    return got is not None and got.backlog_bytes > 0


def _split_lane(alloc_bps: float, wants: Sequence[float]) -> list[float]:
    """One lane's node allocation over the workers (step 2 of the module docstring)."""
    n = len(wants)
    floor = LANE_FLOOR * alloc_bps / n
    rest = alloc_bps - floor * n
    got = fair_share(rest, [max(0.0, w - floor) for w in wants])
    left = max(0.0, rest - math.fsum(got))
    total = math.fsum(wants)
    extra = [left * w / total for w in wants] if total > 0 else [left / n] * n
    return [floor + g + e for g, e in zip(got, extra, strict=True)]


def split_node_lanes(
    reports: Iterable[NodeReport],
    specs: Sequence[LaneSpec],
    *,
    now: float,
    ttl_s: float,
    strict: bool = True,
    cap_headroom: float = 0.0,
    scale_caps: bool = True,
    estimated: bool = False,
) -> NodeLaneSplit | None:
    """The node's allocation per lane and each live worker's part of it; None if no report is live.
    ``scale_caps``: the caps while reads are active follow a saturated store (:func:`node_cap_scale`; a
    configured capacity). ``estimated``: the reports' capacities are the workers' estimates
    (:func:`node_capacity_bps`); only the lanes with a cap in force get a part as their limit."""
    live = live_reports(reports, now, ttl_s)
    if not live:
        return None
    ids = [r.node_id for r in live]
    n = len(live)
    cap = node_capacity_bps(live, estimated=estimated)
    reads = any(r.reads_active for r in live)
    scale = node_cap_scale(live, cap) if scale_caps and not estimated else 1.0
    wants = {s.name: [_worker_demand(r, s.name, cap) for r in live] for s in specs}
    demand = {
        name: math.inf if any(_backlogged(r, name) for r in live) else math.fsum(w)
        for name, w in wants.items()
    }
    limits = [
        node_lane_limit(s, reads_active=reads, strict=strict, cap_headroom=cap_headroom, cap_scale=scale)
        * cap
        for s in specs
    ]
    first = allocate(
        cap,
        [
            LaneDemand(s.guaranteed * cap, s.weight, lim, demand[s.name])
            for s, lim in zip(specs, limits, strict=True)
        ],
    )
    # Work-conserving: what the demands left goes to the backlogged lanes (or, if none is, to the lanes that
    # want anything), by weight, within their limits. A lane that is not backlogged has its rate and more.
    growing = {name for name, d in demand.items() if math.isinf(d)} or {
        name for name, d in demand.items() if d > 0
    }
    alloc = allocate(
        cap,
        [
            LaneDemand(a, s.weight, lim, math.inf if s.name in growing else a)
            for s, lim, a in zip(specs, limits, first, strict=True)
        ],
    )
    per_lane = {s.name: _split_lane(a, wants[s.name]) for s, a in zip(specs, alloc, strict=True)}
    parts = {i: {name: per_lane[name][k] for name in per_lane} for k, i in enumerate(ids)}
    spare = max(0.0, cap - math.fsum(alloc)) / n
    if cap > 0:
        raw = {i: (math.fsum(parts[i].values()) + spare) / cap for i in ids}
    else:
        raw = dict.fromkeys(ids, 1.0 / n)
    shares = {i: min(1.0, max(MIN_SHARE, v)) for i, v in raw.items()}
    idle: dict[str, float | None] = {}  # the external limit of a lane nobody on the node uses
    for spec, lim in zip(specs, limits, strict=True):
        idle[spec.name] = LANE_FLOOR * lim / n if math.isfinite(lim) else None
    # An estimated capacity: a lane without a cap is paced by each worker's own estimate only (a part of a
    # node estimate that is low would hold the reads there, and the estimate with them).
    uncapped = {s.name for s, lim in zip(specs, limits, strict=True) if estimated and math.isinf(lim)}
    lane_limits = {
        i: {
            name: parts[i][name] if demand[name] > 0 and name not in uncapped else idle[name]
            for name in per_lane
        }
        for i in ids
    }
    # A worker's floors are fractions of its own capacity: its part of the node's, or its own estimate.
    own = {
        r.node_id: r.capacity_bps / cap if estimated and cap > 0 and r.capacity_bps > 0 else shares[r.node_id]
        for r in live
    }
    floors = {
        i: {
            s.name: _floor_part(s.floor, parts[i][s.name], alloc_bps, own[i])
            for s, alloc_bps in zip(specs, alloc, strict=True)
        }
        for i in ids
    }
    return NodeLaneSplit(
        capacity_bps=cap,
        reads_active=reads,
        lanes={s.name: a for s, a in zip(specs, alloc, strict=True)},
        parts=parts,
        shares=shares,
        limits=lane_limits,
        for_reads=frozenset(
            s.name
            for s in specs
            if capped_for_reads(s, reads_active=reads, strict=strict, cap_headroom=cap_headroom)
        ),
        guard_multiplier=node_guard_multiplier(live),
        floors=floors,
        cap_scale=scale,
    )


def _floor_part(floor: float, part_bps: float, lane_bps: float, share: float) -> float:
    """A worker's part of a lane's floor (a fraction of the node), as a fraction of the worker's part of the
    node: the floor is split as the lane's allocation is (its backlogged workers carry it), so a worker that
    has a lane's whole traffic keeps the node's floor for it, not the floor of its own part."""
    if floor <= 0.0 or lane_bps <= 0.0:
        return 0.0
    return min(1.0, floor * (part_bps / lane_bps) / share)


# -- when the board fails -----------------------------------------------------------------------------------


class NodeRulesMode(enum.Enum):
    STARTING = "starting"  # no split yet (and not ttl_s old): nothing applied, the worker runs alone
    NODE = "node"  # the split of a fresh board
    HELD = "held"  # no fresh split: the last one, for up to ttl_s
    SAFE = "safe"  # no fresh split for ttl_s: the safe local rule (safe_worker_rules)


@dataclass(frozen=True, slots=True)
class WorkerRules:
    """What one worker applies of the node's rules in one round (``s3lanes.runtime.cluster`` carries it
    out): its part of the node, the node's guard multiplier, each lane's external limit (None: its part of
    the node only), the lanes whose limits are parts of a cap for the reads' sake, and its part of each
    lane's floor (fractions of its own part of the node)."""

    mode: NodeRulesMode
    share: float
    guard_multiplier: float
    limits: Mapping[str, float | None]
    for_reads: frozenset[str]
    floors: Mapping[str, float]


def worker_rules(split: NodeLaneSplit, node_id: str, mode: NodeRulesMode) -> WorkerRules:
    """Worker ``node_id``'s part of ``split`` (it must be in it)."""
    return WorkerRules(
        mode=mode,
        share=split.shares[node_id],
        guard_multiplier=split.guard_multiplier,
        limits=dict(split.limits[node_id]),
        for_reads=split.for_reads,
        floors=dict((split.floors or {}).get(node_id, {})),
    )


def safe_worker_rules(
    specs: Sequence[LaneSpec], *, workers: int, capacity_bps: float, strict: bool, cap_headroom: float
) -> WorkerRules:
    """The safe local rule of a worker that has had no fresh split for a TTL: ``1 / workers`` of the node
    and of every lane's cap in force while reads are active (:func:`node_lane_limit`, reads assumed
    active), its own guard (multiplier 1: the node's does not cut), the configured floors."""
    n = max(1, workers)
    limits: dict[str, float | None] = {}
    for s in specs:
        f = node_lane_limit(s, reads_active=True, strict=strict, cap_headroom=cap_headroom)
        limits[s.name] = f * capacity_bps / n if math.isfinite(f) else None
    return WorkerRules(
        mode=NodeRulesMode.SAFE,
        share=1.0 / n,
        guard_multiplier=1.0,
        limits=limits,
        for_reads=frozenset(
            s.name
            for s in specs
            if limits[s.name] is not None
            and capped_for_reads(s, reads_active=True, strict=strict, cap_headroom=cap_headroom)
        ),
        floors={s.name: 0.0 for s in specs},
    )


class NodeRulesLease:
    """One worker's node rules, round after round: the fresh split, the last one held for ``ttl_s``, then
    the safe local rule (module docstring). ``now`` is the worker's monotonic clock."""

    def __init__(
        self,
        node_id: str,
        specs: Sequence[LaneSpec],
        *,
        ttl_s: float,
        workers: int,
        strict: bool,
        cap_headroom: float,
        now: float,
    ) -> None:
        self.node_id = node_id
        self.specs = tuple(specs)
        self.ttl_s = ttl_s
        self.workers = max(1, workers)
        self.strict = strict
        self.cap_headroom = cap_headroom
        self.mode = NodeRulesMode.STARTING
        self.fresh_at = now  # the last fresh split (or the start)
        self.last: NodeLaneSplit | None = None

    def decide(self, split: NodeLaneSplit | None, *, capacity_bps: float, now: float) -> WorkerRules | None:
        """This round's rules given this round's split (None: the board failed); None: apply nothing."""
        if split is not None and self.node_id in split.shares:
            self.fresh_at = now
            self.last = split
            self.workers = max(self.workers, len(split.shares))
            self.mode = NodeRulesMode.NODE
            return worker_rules(split, self.node_id, self.mode)
        if now - self.fresh_at < self.ttl_s:
            if self.last is None:
                return None
            self.mode = NodeRulesMode.HELD
            return worker_rules(self.last, self.node_id, self.mode)
        self.mode = NodeRulesMode.SAFE
        return safe_worker_rules(
            self.specs,
            workers=self.workers,
            capacity_bps=capacity_bps,
            strict=self.strict,
            cap_headroom=self.cap_headroom,
        )

    def board_age_s(self, now: float) -> float:
        """Seconds since the last fresh split (or the start)."""
        return max(0.0, now - self.fresh_at)


# -- the node's parts beside the cluster's allowances -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneLimit:
    """One lane's external limit as a worker applies it (``Scheduler.set_external_limit``)."""

    bps: float | None
    for_reads: bool = False
    headroom_taken: bool = False


def tighter_limits(
    allowances: Mapping[str, float],
    allowances_for_reads: frozenset[str],
    rules: WorkerRules | None,
    *,
    cap_headroom: float,
) -> dict[str, LaneLimit]:
    """Each lane's external limit for a worker that holds the cluster budget's ``allowances`` (those in
    ``allowances_for_reads`` shares of the reads' cap, paced less ``cap_headroom``) and, one of several
    workers, its part of the node (``rules``; None: none): whichever of the two paces the lane lower
    (:func:`~s3lanes.core.scheduler.external_paced_bps`). A lane the node leaves to the worker's part (a
    None limit) keeps its allowance, or no limit (a part set in an earlier round must not linger)."""
    out = {lane: LaneLimit(bps, for_reads=lane in allowances_for_reads) for lane, bps in allowances.items()}
    if rules is None:
        return out
    for lane, bps in rules.limits.items():
        if bps is None:
            out.setdefault(lane, LaneLimit(None))
            continue
        part_reads = lane in rules.for_reads
        paced = external_paced_bps(bps, for_reads=part_reads, headroom_taken=True, cap_headroom=cap_headroom)
        held = out.get(lane)
        if (
            held is None
            or held.bps is None
            or paced
            < external_paced_bps(
                held.bps, for_reads=held.for_reads, headroom_taken=False, cap_headroom=cap_headroom
            )
        ):
            out[lane] = LaneLimit(bps, for_reads=part_reads, headroom_taken=part_reads)
    return out
