"""The lane scheduler: which chunk of backend I/O goes next, and when.

Theory of operation
-------------------
Dataset reads and checkpoint writes share one backend. The scheduler is a *virtual server* of rate ``C``
(the backend's bandwidth, configured or estimated online) that hands out budget in chunks. Before moving
each ~1 MiB of a body to or from the backend, a request's coroutine :meth:`Scheduler.submit`\\ s a ticket
for that many bytes on its lane (the first ticket of a request also carries the per-request cost,
``SchedulerConfig.request_cost_bytes``, which the shell adds; a metadata op pays only that) and waits
until the ticket is granted. The shell keeps one timer: after every submit/complete/cancel, and when the
timer fires, it calls :meth:`Scheduler.pull` until the answer is not a :class:`Grant`, wakes the granted
tickets' waiters, and arms the timer for a :class:`WaitUntil`. :class:`Idle` means nothing can happen
before the next submit or complete. Like ceph/dmclock's ``pull_request(now)``; nothing here blocks, sleeps
or reads a clock: every method takes ``now``.

**Ordering** is two-phase mClock (Gulati et al., OSDI 2010; ceph/dmclock), charged in bytes, one FIFO per
lane and linear scans over at most a handful of lanes:

1. *Reservation phase.* Each lane's reservation ``R·C`` fills a byte bucket (depth ``burst_bytes``: a lane
   back from idle gets at most that much credit). A lane whose bucket holds its head's cost is
   reservation-eligible; the earliest such tag wins (EDF).
2. *Weight phase.* Otherwise, among lanes under their limit, the smallest virtual start tag wins
   (SFQ/WF2Q+: a lane that becomes backlogged starts at ``max(its last finish, V)``, ``V`` the smallest
   start among backlogged lanes, so a lane back from idle cannot jump ahead on stale tags, dmclock's
   idle-return anomaly). Every grant, in either phase, advances the lane's tag by ``cost / weight``
   (dmclock's tags count all service), so a reservation is a floor under the weighted share, not an extra:
   see :func:`s3lanes.core.sched_alloc.allocate` for the fluid allocation this realises. A weight-phase
   grant does not consume reservation budget (dmclock's ``reduce_reservation_tags``). A lane held back by
   its limit or its concurrency does not bank weight credit: its tag is pulled up to ``V``.

**Gates.** The virtual-server bucket (rate ``C``, depth ``burst_bytes``, debt allowed) is charged by every
grant, so the total granted rate is ``C``. A weight-phase winner waits for it (nobody overtakes a waiting
winner); a read-protected winner may borrow one bucket depth below zero, so a burst of reads goes at once
while sustained overload still follows the weights. Reservation-phase grants only charge it, never wait
for it: reservations sum to at most ``C``, and a lane within its reservation must not wait on the others
(reads are admitted at once and charged; the others yield). A read overdraft is repaid, never forgiven:
the debt is bounded (a weight-phase read needs the level at minus one depth, reservation grants come at
most at ``C``), and forgiving it would let concurrent readers take the store over ``C``. Every grant also
needs the lane's ceiling bucket (GCRA whose tau is what the ceiling rate fills in :data:`CEILING_DEPTH_S`, at
least one piece and at most ``burst_bytes``; while reads are active a lane at its cap
(``limit_while_reads_active``, ``strict`` mode) paces at :data:`SHARE_WINDOW_S` / (:data:`SHARE_WINDOW_S` +
:data:`CEILING_DEPTH_S`) of it less ``cap_headroom`` (never under its configured floor), so that no second,
even one that starts with a full bucket, goes over the cap, and the store's queue has room to release
the bytes unevenly; and a capped lane that is not read-protected keeps, of the credit it earned while
idle, only what its ceiling delivers in ``latency_target_s``, so a checkpoint lane back from idle starts
at its rate instead of with a burst in front of the reads). The ceiling is, as a fraction of ``C``: the
lane's ``limit``; an *external limit* (:meth:`Scheduler.set_external_limit`: this node's allowance of a
cluster-wide budget, or this worker's part of its node's lane, in force whatever the local read activity,
since the readers may be on another node or worker; one that is a share of the reads' cap is paced as that
cap is here while reads are active, its headroom taken off once);
in ``strict`` mode, while reads are active, also ``limit_while_reads_active``
(checkpoint and restore 0.30); for ``paced_by_guard`` lanes, while reads are active, times the latency
guard's multiplier ``m`` (one of several workers of a node: also the node's, the smallest among its
reading workers' guards, while it cuts, whatever the reads here: :meth:`Scheduler.set_node_guard`); times
a SlowDown cut; and never below ``floor``. A floor is also a guarantee: the reservation used is
``max(reservation, floor)``. ``work_conserving`` mode drops
``limit_while_reads_active``: writes take what reads leave, and the guard alone protects read latency.
With a configured capacity, the caps in force while reads are active (``limit_while_reads_active``, and
what a raised floor may reach) are shares of what the store *delivers* once it is saturated (it carries
at least 90 % of the configured capacity while readers keep it busy): a link
configured at 40 MB/s that carries 37.6 MB/s of payload would otherwise give writes 12 of 37.6 MB/s and
reads 0.68 of it (see :func:`saturation_scale` and :data:`SATURATED_AT`).
Reads are *active* once read-protected lanes asked for at least ``read_active_min_fraction·C`` within
``read_active_s``, and stay active until ``read_idle_s`` have passed with no read ticket queued, in flight
or submitted (hysteresis, like dmclock's anticipation timeout).

**In-flight window.** Granted-but-not-completed bytes and tickets are bounded (``inflight_*_max``; with an
estimated capacity and no configured byte window, ``max(4·burst, C·10 ms)``), so queueing happens here, where
the order is chosen, not inside the store. One of several workers of a node
(:meth:`Scheduler.set_capacity_share`) keeps its capacity share of the configured windows, at least one
piece and one request, so that the node's total in flight is what is configured. The window applies to the
winner only: a big head is never overtaken by smaller tickets squeezing into the remaining space.
Read-protected lanes may fill the whole window; a paced lane, while reads are active, only its ceiling's
share of it. A lane at its ``max_concurrency`` (scaled by ``m`` for paced lanes) is not eligible.

**Feedback** (:mod:`s3lanes.core.sched_control`), evaluated once per window ``Δ = window_s``: the latency
guard (io.latency's rules on read ``extra`` = gateway wait + TTFB over baseline), the capacity estimator
(iocost's ladder, only when ``capacity_bps`` is not configured), SlowDown cuts (x0.7 then CUBIC recovery),
and the per-lane statistics behind :meth:`Scheduler.snapshot`. Rates only change at those instants, at a
read-activity change, or on a 503; buckets are settled at the old rate first.

This module is *not* the async shell (``s3lanes.runtime.dispatcher`` owns futures and the timer) and does
not classify requests into lanes.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from s3lanes.core.sched_alloc import LaneDemand, allocate
from s3lanes.core.sched_control import (
    BASELINE_QUIET_FRACTION,
    EPSILON_S,
    GUARD_M_MIN,
    CapacityEstimator,
    LatencyGuard,
    SlowdownCut,
    TokenBucket,
)
from s3lanes.core.transitions import Transitions

WriteCapMode = Literal["strict", "work_conserving"]

# A read lane granted at least this fraction of its guarantee over the last second is "self-queueing":
# its gateway wait no longer counts towards the latency guard (see Scheduler.observe_read).
SELF_QUEUEING_FRACTION = 0.95
SHARE_HISTORY_WINDOWS = 10  # achieved shares and rates are reported over the last 10 windows (1 s)
_FAST_FORWARD_WINDOWS = 100
# Pieces of a paced body: at most what the backend moves in the read latency target, in steps of this size.
PIECE_STEP_BYTES = 64 * 1024
# The progress floor serves one round of a lane's queue this much faster than progress_interval_s asks:
# the round is measured at a window's start, the lane's buckets and the reads' reservation phase delay a
# piece by a little, and streams join during the round.
PROGRESS_HEADROOM = 1.25
# A configured store that delivered at least SATURATED_AT of its capacity over the last second, while reads
# were active and busy (READS_BUSY_FRACTION of the time with a read queued or in flight), is saturated at
# what it delivered: the caps while reads are active are shares of that. A shaped link carries 94-96 % of
# its rate as payload (headers), which is what this is for. Under SATURATED_FROM it is not taken for
# saturated: readers that wait on latency leave the store ~10 % idle (the simulation's model store
# delivers 86-90 % to busy readers plus a capped writer). In between, a blend, so the caps do not jump.
SATURATED_FROM = 0.90
SATURATED_AT = 0.93
READS_BUSY_FRACTION = 0.95
# Backend answers that say the store is struggling (capacity estimator); 501, 505 and the like do not.
BUSY_STATUSES = frozenset({500, 502, 503, 504})
# With an estimated capacity and no configured window, keep ~10 ms of capacity in flight (a bandwidth-delay
# product for a store with a few ms of TTFB): saturation then shows up as a full window, which is the
# estimator's main evidence. A much larger window would hide it (the clients' streams never fill it).
AUTO_WINDOW_S = 0.01
# A lane's ceiling bucket is as deep as its ceiling rate fills in this long (at least one piece, at most
# burst_bytes): closed-loop streams whose pieces wait in the store's queue leave the lane's rate unused, and
# the credit is spent as a lump when they come back; a 4 MiB bucket under a 10.7 MB/s ceiling let a
# checkpoint drain move 13.2 MB/s in a second. While reads are active a lane at its cap
# (limit_while_reads_active, strict mode) paces at cap x SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S),
# so that even a second that starts with a full bucket keeps to the cap: the reads' share holds in every
# second.
CEILING_DEPTH_S = 0.05
SHARE_WINDOW_S = 1.0
# While reads are active, a lane held at its cap (and a floor raised toward it) is paced this fraction under
# the cap: the store's queue (a FIFO link's, its sockets') lets evenly sent bytes leave it unevenly, by
# 1-2 MB from one second to the next on a 40 MB/s link whose readers keep it full, so a write share paced
# at the cap goes over it on the wire in about one second of five. SchedulerConfig.cap_headroom; 0 = at the
# cap.
DEFAULT_CAP_HEADROOM = 0.1
# after a longer silence, skip the empty windows instead of ticking each


# -- configuration ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneSpec:
    """One lane's QoS parameters, as configured (``[lanes.<name>]``) and as the scheduler takes them.
    Fractions are of the backend capacity ``C``; None means "no limit".

    The defaults are those of a lane added in config: no guarantee, weight 1, paced by the read-latency
    guard (a new lane must not be able to hurt the protected reads unless its config says so). The lanes
    that ship are :func:`s3lanes.core.lanes_config.default_lanes`.

    Each value is checked on its own here (a ValueError); whether the values fit together is
    :meth:`problems`, which :class:`SchedulerConfig` enforces and the config loader reports."""

    name: str
    reservation: float = 0.0  # guaranteed when backlogged (dataset 0.70)
    weight: float = 1.0  # share of the rest among lanes under their limit
    limit: float | None = None  # always in force
    limit_while_reads_active: float | None = None  # only while a read-protected lane is active (strict mode)
    read_protected: bool = False  # its activity triggers the caps; its latency is what the guard protects
    paced_by_guard: bool = True  # the latency guard's multiplier applies
    floor: float = 0.0  # never below this: the ceiling's lower bound and a guarantee (writes must not starve)
    max_concurrency: int | None = None  # tickets granted but not completed at once

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a lane needs a name")
        for label, v in (("reservation", self.reservation), ("floor", self.floor)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"lane {self.name!r}: {label} must be within [0, 1], got {v}")
        for label, lim in (
            ("limit", self.limit),
            ("limit_while_reads_active", self.limit_while_reads_active),
        ):
            if lim is not None and not 0.0 < lim <= 1.0:
                raise ValueError(f"lane {self.name!r}: {label} must be within (0, 1], got {lim}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"lane {self.name!r}: weight must be > 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"lane {self.name!r}: max_concurrency must be >= 1")

    @property
    def guaranteed(self) -> float:
        """The share this lane is promised when backlogged: its reservation, or its floor if larger (a floor
        is a guarantee too)."""
        return max(self.reservation, self.floor)

    def problems(self) -> list[str]:
        """What does not fit together in this lane's values (empty if nothing)."""
        out: list[str] = []
        caps = (("limit", self.limit), ("limit_while_reads_active", self.limit_while_reads_active))
        for cap_name, cap in caps:
            if cap is None:
                continue
            for low_name, low in (("reservation", self.reservation), ("floor", self.floor)):
                if low > cap:
                    out.append(f"{low_name} {low:g} is above {cap_name} {cap:g}")
        if self.read_protected and self.paced_by_guard:
            out.append(
                "the read-protected lane cannot be paced by the guard that protects it"
                " (set paced_by_guard = false)"
            )
        return out


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    lanes: tuple[LaneSpec, ...]
    capacity_bps: float | None  # configured backend bandwidth; None = estimate online
    initial_capacity_bps: float = 1e9  # starting estimate when not configured
    write_cap_mode: WriteCapMode = "strict"
    request_cost_bytes: int = 64 * 1024  # charged once per request by the shell (metadata ops: only this)
    burst_bytes: int = 4 * 1024 * 1024  # depth of the virtual server's bucket and of every lane's buckets
    window_s: float = 0.1  # Δ: allocation / guard / estimator period
    read_active_s: float = 1.0  # reads become active after this much recent demand ...
    read_idle_s: float = 2.0  # ... and the caps lift after this long without reads
    read_active_min_fraction: float = (
        0.01  # ... "demand" meaning at least this fraction of C over read_active_s
    )
    latency_target_s: float = 0.005  # extra read latency (p99) over the idle baseline
    inflight_bytes_max: int | None = None  # backend in-flight window (granted, not completed)
    inflight_requests_max: int | None = None
    # Progress: a lane that is not read-protected is never paced so low that one round of its queue (every
    # stream's next piece: each stream waits with one ticket at a time, served first in, first out) takes
    # longer than this. None: no such floor (the configured floor alone).
    progress_interval_s: float | None = 2.0
    # While reads are active, the caps (limit_while_reads_active in strict mode, and what a raised floor may
    # reach) are paced at cap x (1 - cap_headroom): headroom for the store's queue releasing evenly sent
    # bytes unevenly. 0: at the cap.
    cap_headroom: float = DEFAULT_CAP_HEADROOM

    def __post_init__(self) -> None:
        if not self.lanes:
            raise ValueError("at least one lane")
        names = [lane.name for lane in self.lanes]
        if len(set(names)) != len(names):
            raise ValueError(f"lane names must be unique: {names}")
        for lane in self.lanes:
            for problem in lane.problems():
                raise ValueError(f"lane {lane.name!r}: {problem}")
        if math.fsum(lane.guaranteed for lane in self.lanes) > 1.0 + 1e-9:
            raise ValueError("the lanes' reservations (or floors, where larger) must sum to at most 1")
        if self.capacity_bps is not None and not self.capacity_bps > 0:
            raise ValueError("capacity_bps must be > 0 (or None to estimate it)")
        if not self.initial_capacity_bps > 0:
            raise ValueError("initial_capacity_bps must be > 0")
        if self.write_cap_mode not in ("strict", "work_conserving"):
            raise ValueError(f"write_cap_mode must be strict or work_conserving, got {self.write_cap_mode!r}")
        if self.request_cost_bytes < 0 or self.burst_bytes <= 0:
            raise ValueError("request_cost_bytes must be >= 0 and burst_bytes > 0")
        if not (self.window_s > 0 and self.read_active_s > 0 and self.read_idle_s >= 0):
            raise ValueError("window_s and read_active_s must be > 0, read_idle_s >= 0")
        if not 0.0 <= self.read_active_min_fraction < 1.0 or not self.latency_target_s > 0:
            raise ValueError("read_active_min_fraction must be within [0, 1), latency_target_s > 0")
        for label, v in (
            ("inflight_bytes_max", self.inflight_bytes_max),
            ("inflight_requests_max", self.inflight_requests_max),
        ):
            if v is not None and v < 1:
                raise ValueError(f"{label} must be >= 1 (or None)")
        if self.progress_interval_s is not None and not self.progress_interval_s > 0:
            raise ValueError("progress_interval_s must be > 0 (or None)")
        if not 0.0 <= self.cap_headroom < 1.0:
            raise ValueError("cap_headroom must be within [0, 1)")


def saturation_scale(delivered_fraction: float) -> float:
    """What the caps in force while reads are active are scaled by, given what the store delivered over the
    last second as a fraction of its configured capacity: that fraction from :data:`SATURATED_AT` up to 1
    (a saturated store: the caps follow what it really carries), 1 up to :data:`SATURATED_FROM` (not
    saturated: nothing says the configured capacity is wrong) and at or above 1, linear in between."""
    x = delivered_fraction
    if x <= SATURATED_FROM or x >= 1.0:
        return 1.0
    if x >= SATURATED_AT:
        return x
    return 1.0 - (x - SATURATED_FROM) * (1.0 - SATURATED_AT) / (SATURATED_AT - SATURATED_FROM)


def external_paced_bps(bps: float, *, for_reads: bool, headroom_taken: bool, cap_headroom: float) -> float:
    """What a lane that is not read-protected is paced at under an external limit of ``bps`` alone (before
    its floor and its other caps), as :meth:`Scheduler.set_external_limit` takes it: a share of the reads'
    cap less ``cap_headroom`` (unless taken off already) and at :data:`SHARE_WINDOW_S` /
    (:data:`SHARE_WINDOW_S` + :data:`CEILING_DEPTH_S`) of that; any other limit at ``bps``. Lets a caller
    holding two limits for one lane tell which one paces it lower."""
    if not for_reads:
        return bps
    net = bps if headroom_taken else bps * (1.0 - cap_headroom)
    return net * SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)


# -- decisions -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """Ticket ``ticket`` may move ``cost_bytes`` now; the shell must later complete (or cancel) it."""

    ticket: int
    lane: str
    cost_bytes: int


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Nothing can be granted before ``at`` (unless a submit/complete/cancel happens first)."""

    at: float


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing is grantable and no time-based event is pending: wait for the next submit or complete."""


Decision = Grant | WaitUntil | Idle


@dataclass(frozen=True, slots=True)
class LaneSnapshot:
    name: str
    queued_tickets: int
    queued_bytes: int
    inflight_tickets: int
    inflight_bytes: int
    granted_tickets_total: int
    granted_bytes_total: int  # cost charged at grant
    done_bytes_total: int  # what complete() reported as used (the rest was refunded)
    delivered_bytes_total: int  # observe_delivered
    reservation_bps: float
    allocation_bps: float  # the fluid allocation for the current demand (sched_alloc.allocate)
    granted_rate_bps: float  # over the last second
    limit_bps: float | None  # the ceiling in force (None: no limit)
    guard_multiplier: float  # 1.0 unless the guard is pacing this lane right now
    slowdown_fraction: float | None  # the SlowDown ceiling (fraction of C) while recovering from a 503
    achieved_share: float  # of the bytes delivered over the last second (granted, if none delivered)
    external_limit_bps: float | None = None  # set_external_limit (a cluster allowance); None = none
    external_for_reads: bool = False  # that limit is a share of the reads' cap: paced less cap_headroom
    # ... which the limit has already taken off (a node's part of a lane: core.node_lanes)
    external_headroom_taken: bool = False
    floor_fraction: float = 0.0  # the floor in force: configured, progress or set_floor, within the cap


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    at: float
    capacity_bps: float
    capacity_configured: bool
    capacity_busy_level: int
    reads_active: bool
    write_cap_mode: WriteCapMode
    inflight_bytes: int
    inflight_tickets: int
    inflight_bytes_max: int | None
    guard_multiplier: float
    read_baseline_ttfb_s: float | None
    lanes: tuple[LaneSnapshot, ...]
    # The caps while reads are active are shares of capacity_bps times this (saturation_scale): 1 unless a
    # configured store is saturated below its configured capacity.
    cap_scale: float = 1.0
    inflight_requests_max: int | None = None  # the request window in force (several workers: a share)
    # Several workers of one node: the node's guard multiplier applied to the paced lanes (set_node_guard)
    # on top of this scheduler's own (guard_multiplier, which is what this worker publishes); 1 otherwise.
    node_guard_multiplier: float = 1.0

    def lane(self, name: str) -> LaneSnapshot:
        for ln in self.lanes:
            if ln.name == name:
                return ln
        raise KeyError(name)


# -- internal state --------------------------------------------------------------------------------------


def _fraction(what: str, value: float, *, zero: bool = False) -> float:
    """``value`` if it is within (0, 1] (``zero``: [0, 1]); else ``ValueError`` naming ``what``."""
    low_ok = value >= 0.0 if zero else value > 0.0
    if not low_ok or value > 1.0:
        raise ValueError(f"{what} must be within {'[' if zero else '('}0, 1], got {value}")
    return value


class _TicketState(enum.Enum):
    WAITING = "queued in its lane"
    GRANTED = "granted, not yet completed"
    FINISHED = "completed or cancelled"


_MOVES = Transitions(
    {
        _TicketState.WAITING: {_TicketState.GRANTED, _TicketState.FINISHED},
        _TicketState.GRANTED: {_TicketState.FINISHED},
        _TicketState.FINISHED: (),
    }
)


class _Ticket:
    __slots__ = ("cost", "id", "lane", "reserved", "state")

    def __init__(self, ticket_id: int, lane: _Lane, cost: int) -> None:
        self.id = ticket_id
        self.lane = lane
        self.cost = cost
        self.state = _TicketState.WAITING
        self.reserved = False  # granted in the reservation phase (its unused part goes back to that bucket)

    def to(self, new: _TicketState) -> None:
        _MOVES.check(self.state, new, "ticket", self.id)
        self.state = new


class _Lane:
    __slots__ = (
        "allocation_bps",
        "ceiling",
        "delivered_total",
        "done_total",
        "external_bps",
        "external_for_reads",
        "external_headroom_taken",
        "floor_node",
        "floor_now",
        "floor_set",
        "granted_bytes_total",
        "granted_tickets_total",
        "hist_delivered",
        "hist_granted",
        "idle_credit",
        "index",
        "inflight_bytes",
        "inflight_tickets",
        "limit_bucket",
        "queue",
        "queued_bytes",
        "queued_tickets",
        "res_bucket",
        "slowdown",
        "spec",
        "vfinish",
        "vstart",
        "weight_norm",
        "win_delivered",
        "win_granted",
        "win_submitted",
    )

    def __init__(self, spec: LaneSpec, index: int, weight_norm: float, burst: float, now: float) -> None:
        self.spec = spec
        self.index = index
        self.weight_norm = weight_norm
        self.queue: deque[_Ticket] = deque()
        self.queued_tickets = 0
        self.queued_bytes = 0
        self.inflight_tickets = 0
        self.inflight_bytes = 0
        self.granted_tickets_total = 0
        self.granted_bytes_total = 0
        self.done_total = 0
        self.delivered_total = 0
        self.res_bucket = TokenBucket(0.0, burst, now)
        self.limit_bucket = TokenBucket(math.inf, burst, now)
        # The ceiling bucket's level when the lane last went idle (nothing queued or in flight); None while
        # busy. See Scheduler._back_from_idle.
        self.idle_credit: float | None = 0.0
        self.ceiling = math.inf  # fraction of C
        self.external_bps: float | None = None  # set_external_limit
        self.external_for_reads = False  # set_external_limit(for_reads=...): a share of the reads' cap
        self.external_headroom_taken = False  # set_external_limit(headroom_taken=...): cap_headroom is off
        self.floor_set = 0.0  # set_floor (the spool's durability deadline), fraction of C
        self.floor_node = 0.0  # set_node_floor (this worker's part of the node's floor), fraction of C
        self.floor_now = spec.floor  # the floor in force (see Scheduler._floor), updated with the rates
        self.vstart = 0.0  # virtual start tag of the head (valid while backlogged)
        self.vfinish = 0.0  # virtual finish tag of the last grant
        self.slowdown = SlowdownCut()
        self.win_granted = 0
        self.win_delivered = 0
        self.win_submitted = 0
        self.hist_granted: deque[int] = deque(maxlen=SHARE_HISTORY_WINDOWS)
        self.hist_delivered: deque[int] = deque(maxlen=SHARE_HISTORY_WINDOWS)
        self.allocation_bps = 0.0


@dataclass(slots=True)
class _WindowStats:
    """What the current window has seen, for the capacity estimator and the reads' busy history. The
    scheduler starts a fresh one at every window's end."""

    window_wait_s: float = 0.0  # time with work held back by the in-flight window
    throttled_s: float = 0.0  # time with work held back by the server bucket
    reads_idle_s: float = 0.0  # time with no read ticket queued or in flight
    errors: int = 0  # busy answers from the store (BUSY_STATUSES)
    requests: int = 0  # grants
    done_bytes: int = 0  # bytes the completed tickets used


class Scheduler:
    """mClock-ordered, capacity-paced grants of backend budget to lanes. Not thread-safe; see the module
    docstring. Methods never block; times are the caller's monotonic clock, in seconds."""

    def __init__(self, cfg: SchedulerConfig, now: float) -> None:
        self._cfg = cfg
        self._share = 1.0  # of a configured capacity, this process's (several workers: set_capacity_share)
        self._node_caps = False  # the caps while reads are active are the node's (set_node_caps)
        self._node_guard = 1.0  # the node's read-latency guard multiplier (set_node_guard)
        total_w = math.fsum(s.weight for s in cfg.lanes)
        burst = float(cfg.burst_bytes)
        self._lanes = tuple(_Lane(s, i, s.weight / total_w, burst, now) for i, s in enumerate(cfg.lanes))
        self._by_name = {ln.spec.name: ln for ln in self._lanes}
        self._read_lanes = tuple(ln for ln in self._lanes if ln.spec.read_protected)
        self._estimator = (
            CapacityEstimator(cfg.initial_capacity_bps, cfg.window_s) if cfg.capacity_bps is None else None
        )
        self._server = TokenBucket(self._capacity(), burst, now)
        self._guard = LatencyGuard(cfg.latency_target_s, cfg.window_s, now)
        self._tickets: dict[int, _Ticket] = {}
        self._next_ticket = 1
        self._queued_total = 0
        self._inflight_tickets = 0
        self._inflight_bytes = 0
        self._vclock = 0.0
        # read activity
        self._reads_active = False
        self._last_read_at = -math.inf
        self._read_demand: deque[tuple[float, int]] = deque()
        self._read_demand_bytes = 0
        # windows and time accounting
        self._now = now
        self._window_start = now
        self._next_tick = now + cfg.window_s
        self._acct_at = now
        self._blocked_window = False
        self._blocked_server = False
        self._win = _WindowStats()
        self._delivered_seen = False
        self._cap_scale = 1.0  # saturation_scale of the last second (configured capacity only)
        self._hist_reads_busy: deque[float] = deque(maxlen=SHARE_HISTORY_WINDOWS)  # busy fraction per window
        self._apply_rates(now)

    # -- public API ---------------------------------------------------------------------------------------

    def submit(self, lane: str, cost_bytes: int, now: float) -> int:
        """Queue a ticket for ``cost_bytes`` of ``lane``'s budget; returns its id. Never blocks.

        Raises ``KeyError`` for an unknown lane, ``ValueError`` for a negative cost."""
        ln = self._by_name[lane]
        if cost_bytes < 0:
            raise ValueError("cost_bytes must be >= 0")
        now = self._advance(now)
        t = _Ticket(self._next_ticket, ln, cost_bytes)
        self._next_ticket += 1
        self._tickets[t.id] = t
        if ln.idle_credit is not None:
            self._back_from_idle(ln, now)
        if ln.queued_tickets == 0:
            backlogged = [x.vstart for x in self._lanes if x.queued_tickets > 0]
            v = min(backlogged) if backlogged else self._vclock
            ln.vstart = max(ln.vfinish, v)
        ln.queue.append(t)
        ln.queued_tickets += 1
        ln.queued_bytes += cost_bytes
        ln.win_submitted += cost_bytes
        self._queued_total += 1
        if ln.spec.read_protected:
            self._note_read_demand(cost_bytes, now)
        return t.id

    def submit_fast(self, lane: str, cost_bytes: int, now: float) -> tuple[int, bool]:
        """:meth:`submit`, and the grant an uncontended scheduler's next :meth:`pull` would make, in one
        step: returns ``(ticket, True)`` when the ticket is granted already, ``(ticket, False)`` when it is
        queued as submit() leaves it (the caller pulls as usual; nothing else has changed).

        The fast path is taken only when this ticket is the only one queued in any lane (it overtakes
        nobody) and its lane passes every gate pull() applies to a lone candidate: concurrency and window
        share, ceiling bucket, reservation bucket or else the capacity bucket, in-flight window. The grant is
        the one pull() would make (same tags, same bucket charges), so the lanes' guarantees are those of
        the slow path; what is saved is the second call, the candidate lists and, in the shell, a future.

        Raises ``KeyError`` for an unknown lane, ``ValueError`` for a negative cost."""
        ticket = self.submit(lane, cost_bytes, now)
        if self._queued_total != 1:
            return ticket, False
        now = self._now  # submit() advanced to it
        t = self._tickets[ticket]
        ln = t.lane
        mc = self._max_concurrency(ln)
        if mc is not None and ln.inflight_tickets >= mc:
            return ticket, False
        if ln.inflight_tickets > 0:
            share_max = self._window_share_bytes(ln)
            if share_max is not None and ln.inflight_bytes + cost_bytes > share_max:
                return ticket, False
        if ln.limit_bucket.ready_at(0.0, now) > now + EPSILON_S:
            return ticket, False
        res = ln.res_bucket
        reserved = res.rate_bps > 0 and (
            res.ready_at(min(float(cost_bytes), res.depth_bytes), now) <= now + EPSILON_S
        )
        if not reserved:
            need = -self._server.depth_bytes if ln.spec.read_protected else 0.0
            if self._server.ready_at(need, now) > now + EPSILON_S:
                return ticket, False
        if self._inflight_tickets > 0:
            win_bytes = self._window_bytes()
            win_reqs = self._window_requests()
            if (win_bytes is not None and self._inflight_bytes + cost_bytes > win_bytes) or (
                win_reqs is not None and self._inflight_tickets >= win_reqs
            ):
                return ticket, False
        self._blocked_window = self._blocked_server = False
        self._head(ln)  # drops tickets cancelled while waiting from the front of the lane's queue
        self._dispatch(ln, t, now, reserved=reserved)
        return ticket, True

    def pull(self, now: float) -> Grant | WaitUntil | Idle:
        """At most one grant per call; call again until the answer is not a :class:`Grant`."""
        now = self._advance(now)
        self._blocked_window = self._blocked_server = False
        if self._queued_total == 0:
            return Idle()
        wake = math.inf
        candidates: list[_Lane] = []
        held: list[_Lane] = []  # backlogged but held back by their own limit, concurrency or window share
        for ln in self._lanes:
            if ln.queued_tickets == 0:
                continue
            head = self._head(ln)
            mc = self._max_concurrency(ln)
            if mc is not None and ln.inflight_tickets >= mc:
                held.append(ln)
                continue
            share_max = self._window_share_bytes(ln)
            if (
                share_max is not None
                and ln.inflight_tickets > 0
                and ln.inflight_bytes + head.cost > share_max
            ):
                held.append(ln)
                continue
            ready = ln.limit_bucket.ready_at(0.0, now)
            if ready > now + EPSILON_S:
                wake = min(wake, ready)
                held.append(ln)
                continue
            candidates.append(ln)
        if not candidates:
            if held:
                # Held lanes can also be released by time alone (reads going idle lifts the caps and the
                # window share; the guard's next window changes the multiplier), not only by a complete():
                # wake at the earliest of those instead of sleeping until an unrelated submit.
                return WaitUntil(self._wake(wake))
            # Unreachable: with tickets queued (checked above) every lane holding them is a candidate or held.
            return WaitUntil(self._wake(wake)) if math.isfinite(wake) else Idle()  # pragma: no cover
        chosen = self._reservation_winner(candidates, now)
        reserved = chosen is not None
        if chosen is None:
            # Weight phase: the smallest virtual start wins, and needs the capacity bucket (nobody overtakes
            # it while it waits). Reservation-phase grants only charge that bucket: the reservations sum to
            # at most C, and a lane within its reservation must not wait on others. A read-protected winner
            # may borrow one bucket depth, so a burst of reads is admitted at once while sustained overload
            # still follows the weights.
            chosen = min(candidates, key=lambda x: x.vstart)
            need = -self._server.depth_bytes if chosen.spec.read_protected else 0.0
            server_ready = self._server.ready_at(need, now)
            if server_ready > now + EPSILON_S:
                self._blocked_server = True
                for ln in candidates:
                    if ln.res_bucket.rate_bps > 0:
                        wake = min(wake, ln.res_bucket.ready_at(self._reservation_need(ln), now))
                return WaitUntil(self._wake(min(wake, server_ready)))
        head = self._head(chosen)
        if self._inflight_tickets > 0:
            win_bytes = self._window_bytes()
            win_reqs = self._window_requests()
            if (win_bytes is not None and self._inflight_bytes + head.cost > win_bytes) or (
                win_reqs is not None and self._inflight_tickets >= win_reqs
            ):
                # The winner waits for room; nobody overtakes it (a completion will pull again).
                self._blocked_window = True
                return Idle()
        if not reserved:
            for ln in held:
                ln.vstart = max(ln.vstart, chosen.vstart)
        return self._dispatch(chosen, head, now, reserved=reserved)

    def cancel(self, ticket: int, now: float) -> None:
        """A waiting ticket is removed; a granted one counts as completed with 0 bytes (everything it held is
        released and its budget refunded). Unknown or finished tickets: no-op."""
        now = self._advance(now)
        t = self._tickets.get(ticket)
        if t is None:
            return
        if t.state is _TicketState.WAITING:
            ln = self._retire(t)
            ln.queued_tickets -= 1
            ln.queued_bytes -= t.cost
            self._queued_total -= 1
            if ln.queued_tickets == 0:
                ln.vfinish = ln.vstart  # unserved: keep its place, never more
                ln.queue.clear()
            self._note_idle(ln, now)
        else:
            self._finish(t, 0, now)

    def complete(self, ticket: int, now: float, *, bytes_done: int | None = None) -> None:
        """The granted chunk finished on the backend. ``bytes_done`` (default: the ticket's whole cost) is
        how much of the grant was used; the rest is refunded to the lane's and the server's buckets.

        Unknown or finished tickets: no-op. Completing a ticket that was never granted is a bug: raises."""
        now = self._advance(now)
        t = self._tickets.get(ticket)
        if t is None:
            return
        if t.state is not _TicketState.GRANTED:
            raise RuntimeError(f"ticket {ticket} was never granted; cancel() it instead")
        self._finish(t, t.cost if bytes_done is None else max(0, bytes_done), now)

    def observe_read(self, lane: str, wait_s: float, ttfb_s: float, now: float) -> None:
        """One read request's gateway wait (submit to grant of its first ticket) and backend time to first
        byte. Feeds the latency guard and its baseline; ignored for lanes that are not read-protected."""
        ln = self._by_name[lane]
        now = self._advance(now)
        if ln.spec.read_protected:
            if self._granted_fraction_last_s(ln, now) >= SELF_QUEUEING_FRACTION * ln.spec.guaranteed:
                # Reads already get their guarantee: time they wait now is reads queueing behind reads
                # (demand above their share), not the other lanes' doing. Cutting the paced lanes for it
                # would hand reads more than their guarantee and starve writes to their floor under any
                # saturating reader; only the backend's latency inflation counts then.
                wait_s = 0.0
            self._guard.observe(wait_s, ttfb_s, now)

    def observe_backend(self, lane: str, status: int, now: float) -> None:
        """A backend response status on ``lane``. 503 cuts the lane's rate to 0.7 x (at most once per window),
        then it recovers along a cubic; the statuses of a struggling store (:data:`BUSY_STATUSES`: 500, 502,
        503, 504) count as "busy" for the capacity estimator. Other 5xx answers are about the request, not
        the load: a 501 NotImplemented for an operation the store lacks is no reason to think it slower."""
        ln = self._by_name[lane]
        now = self._advance(now)
        if status in BUSY_STATUSES:
            self._win.errors += 1
        if status == 503:
            current = ln.ceiling if math.isfinite(ln.ceiling) else self._achieved_fraction(ln, now)
            current = max(current, ln.spec.floor)
            if ln.slowdown.cut(current, ln.spec.floor, now, self._cfg.window_s):
                self._apply_rates(now)

    def observe_delivered(self, lane: str, nbytes: int, now: float) -> None:
        """Bytes actually moved to or from the backend on ``lane`` (capacity estimate, achieved shares)."""
        ln = self._by_name[lane]
        now = self._advance(now)
        ln.win_delivered += nbytes
        ln.delivered_total += nbytes
        self._delivered_seen = True

    def set_external_limit(
        self,
        lane: str,
        bps: float | None,
        now: float,
        *,
        for_reads: bool = False,
        headroom_taken: bool = False,
    ) -> None:
        """Cap ``lane`` at ``bps`` from ``now`` on (``None`` lifts the cap), whether or not reads are active
        here: the cluster budget (``s3lanes.runtime.cluster``) hands each node its allowance this way, and the
        readers it protects may be on another node. The lane's floor still holds. ``for_reads``: the
        allowance is a share of a cap that protects reads (``limit_while_reads_active`` while some node
        reads): the lane is then paced under it as under its own cap while reads are active here, by
        ``cap_headroom`` and at :data:`SHARE_WINDOW_S` / (:data:`SHARE_WINDOW_S` + :data:`CEILING_DEPTH_S`)
        of it, since the store's queue releases the cluster's writes as unevenly as one node's.
        ``headroom_taken`` (with ``for_reads``): ``bps`` has ``cap_headroom`` taken off already (a worker's
        part of a lane the node caps for its reads, :mod:`s3lanes.core.node_lanes`): it is paced at
        :data:`SHARE_WINDOW_S` / (:data:`SHARE_WINDOW_S` + :data:`CEILING_DEPTH_S`) of ``bps``, exactly as
        the same cap would be here, and not under the headroom twice. Raises ``KeyError`` for an unknown
        lane, ``ValueError`` for a negative or NaN rate."""
        ln = self._by_name[lane]
        if bps is not None and not bps >= 0:
            raise ValueError(f"an external limit must be >= 0 bytes/s, got {bps}")
        now = self._advance(now)
        for_reads = for_reads and bps is not None
        taken = headroom_taken and for_reads
        held = (ln.external_bps, ln.external_for_reads, ln.external_headroom_taken)
        if (bps, for_reads, taken) != held:
            ln.external_bps = bps
            ln.external_for_reads = for_reads
            ln.external_headroom_taken = taken
            self._apply_rates(now)

    def set_capacity_share(self, fraction: float, now: float) -> None:
        """Pace to ``fraction`` of the configured capacity from ``now`` on: one of several workers of a node
        in front of one store (``s3lanes.runtime.cluster`` apportions the node's capacity among them by
        demand). Every lane's share, cap and reservation then applies to that part, so the node as a whole
        keeps to them, and so do the configured in-flight windows (``inflight_bytes_max``,
        ``inflight_requests_max``: ``fraction`` of each, at least one piece and one request). No effect on an
        estimated capacity (each worker's estimate is its own view already).
        Raises ``ValueError`` for a fraction outside (0, 1]."""
        fraction = _fraction("a capacity share", fraction)
        now = self._advance(now)
        if fraction != self._share:
            self._share = fraction
            self._apply_rates(now)

    def set_node_caps(self, enabled: bool, now: float) -> None:
        """``True``: the lanes' caps while reads are active (``limit_while_reads_active``) are applied to the
        whole node, not here: one of several workers whose node splits its bandwidth per lane
        (:mod:`s3lanes.core.node_lanes`) and hands this worker each lane's part as an external limit, with
        the node's caps applied. Its scheduler then does not cap those lanes again within its part (a worker
        whose readers are all on another worker may give its whole part to its writes). Everything else
        (reservations, weights, the latency guard, floors) still applies within the part."""
        now = self._advance(now)
        if enabled != self._node_caps:
            self._node_caps = enabled
            self._apply_rates(now)

    def set_node_guard(self, multiplier: float, now: float) -> None:
        """Pace the lanes the guard paces (``paced_by_guard``) by ``multiplier`` from ``now`` on, whether or
        not reads are active here: one of several workers of a node, whose readers may be on another worker
        (:func:`s3lanes.core.node_lanes.node_guard_multiplier`: the smallest guard multiplier among the
        node's workers with reads active, 1 when none reads). This scheduler's own guard still applies
        while it has reads; the lower of the two wins. As with its own multiplier, a lane is never paced
        under its floor, and the progress floor keeps its queue moving. Raises ``ValueError`` for a
        multiplier outside (0, 1]."""
        multiplier = _fraction("a guard multiplier", multiplier)
        now = self._advance(now)
        if multiplier != self._node_guard:
            self._node_guard = multiplier
            self._apply_rates(now)

    def set_node_floor(self, lane: str, fraction: float, now: float) -> None:
        """Raise ``lane``'s floor to ``fraction`` of ``C`` from ``now`` on, as this worker's part of the
        node's floor for the lane (:attr:`s3lanes.core.node_lanes.NodeLaneSplit.floors`; 0: the configured
        floor alone). It acts as :meth:`set_floor` does, and the higher of the two is in force. Raises
        ``KeyError`` for an unknown lane, ``ValueError`` for a fraction outside [0, 1]."""
        self._raise_floor(lane, fraction, now, node=True)

    def node_capacity_bps(self) -> float:
        """The capacity ``C`` of the store (configured, or the current estimate), before any share."""
        if self._estimator is not None:
            return self._estimator.capacity_bps
        assert self._cfg.capacity_bps is not None
        return self._cfg.capacity_bps

    def delivered_last_s(self, now: float) -> tuple[float, float]:
        """What the store delivered over the last full second (bytes/s, all lanes; 0 before a full second
        of history or any :meth:`observe_delivered`), and the fraction of that second with a read queued or
        in flight here: what one of several workers publishes, so that the node's caps while reads are
        active follow a saturated store as one scheduler's do (:func:`saturation_scale`;
        :func:`s3lanes.core.node_lanes.node_cap_scale`)."""
        self._advance(now)
        busy = self._hist_reads_busy
        if not self._delivered_seen or len(busy) < SHARE_HISTORY_WINDOWS:
            return 0.0, 0.0
        windows = len(self._lanes[0].hist_delivered)
        delivered = sum(sum(ln.hist_delivered) for ln in self._lanes)
        return delivered / (windows * self._cfg.window_s), sum(busy) / len(busy)

    def store_saturated(self, now: float) -> bool:
        """With an estimated capacity: whether the in-flight window was full in a window of the last second
        (the store was the bottleneck, so what it delivered was all it could carry); False with a configured
        one. One of several workers publishes it for the node's estimate
        (:func:`s3lanes.core.node_lanes.node_capacity_bps`)."""
        self._advance(now)
        since = now - SHARE_HISTORY_WINDOWS * self._cfg.window_s
        return self._estimator is not None and self._estimator.saturated_since(since)

    def set_floor(self, lane: str, fraction: float, now: float) -> None:
        """Raise ``lane``'s floor to ``fraction`` of ``C`` from ``now`` on (0 returns it to the configured
        ``floor``). Like the configured floor it bounds the lane's ceiling from below (the latency guard and
        a SlowDown cut pace the lane no lower) and is a guarantee while the lane is backlogged, but it never
        goes above the lane's cap while reads are active (``limit_while_reads_active``, ``limit``) nor into
        the read-protected lanes' reservations. The spool's durability deadline
        (:mod:`s3lanes.core.spool_deadline`) sets it. Raises ``KeyError`` for an unknown lane,
        ``ValueError`` for a fraction outside [0, 1]."""
        self._raise_floor(lane, fraction, now, node=False)

    def _raise_floor(self, lane: str, fraction: float, now: float, *, node: bool) -> None:
        """:meth:`set_floor` (``node=False``) and :meth:`set_node_floor` (``node=True``)."""
        ln = self._by_name[lane]
        fraction = _fraction("a floor", fraction, zero=True)
        now = self._advance(now)
        if fraction != (ln.floor_node if node else ln.floor_set):
            if node:
                ln.floor_node = fraction
            else:
                ln.floor_set = fraction
            self._apply_rates(now)

    def capped_for_reads(self, lane: str) -> bool:
        """Whether ``lane`` is paced under a cap for the reads' sake now: its ``limit_while_reads_active``
        while reads are active (``strict`` mode), or an external limit that is a share of the reads' cap
        (:meth:`set_external_limit` with ``for_reads``). Its bodies' bytes should then leave the gateway's
        sockets as they are granted (the shell bounds what the kernel holds unsent). As of the last call
        that brought the scheduler up to date. Raises ``KeyError`` for an unknown lane."""
        return self._share_cap(self._by_name[lane]) is not None

    def piece_bytes(self, lane: str, chunk_bytes: int) -> int:
        """How much of a body on ``lane`` to ask for (and move) at a time: ``chunk_bytes``, except on a lane
        that is not read-protected, where a piece is at most what the backend moves within the read latency
        target (in steps of :data:`PIECE_STEP_BYTES`, at least one step). A granted piece goes to the store
        at line rate, so a read that arrives behind it waits for all of it: on a 40 MB/s store a 1 MiB
        piece of a checkpoint drain is 26 ms of queue, a 192 KiB one 5 ms. Fast stores keep whole chunks.
        Raises ``KeyError`` for an unknown lane."""
        if self._by_name[lane].spec.read_protected:
            return chunk_bytes
        return min(chunk_bytes, self._piece_fit())

    def snapshot(self, now: float) -> SchedulerSnapshot:
        now = self._advance(now)
        cap = self._capacity()
        delivered = [sum(ln.hist_delivered) for ln in self._lanes]
        basis = delivered if sum(delivered) > 0 else [sum(ln.hist_granted) for ln in self._lanes]
        total = sum(basis)
        span_s = max(self._cfg.window_s, len(self._lanes[0].hist_granted) * self._cfg.window_s)
        lanes = []
        for ln, b in zip(self._lanes, basis, strict=True):
            paced = self._guarding(ln)
            lanes.append(
                LaneSnapshot(
                    name=ln.spec.name,
                    queued_tickets=ln.queued_tickets,
                    queued_bytes=ln.queued_bytes,
                    inflight_tickets=ln.inflight_tickets,
                    inflight_bytes=ln.inflight_bytes,
                    granted_tickets_total=ln.granted_tickets_total,
                    granted_bytes_total=ln.granted_bytes_total,
                    done_bytes_total=ln.done_total,
                    delivered_bytes_total=ln.delivered_total,
                    reservation_bps=ln.res_bucket.rate_bps,
                    allocation_bps=ln.allocation_bps,
                    granted_rate_bps=sum(ln.hist_granted) / span_s,
                    limit_bps=ln.ceiling * cap if math.isfinite(ln.ceiling) else None,
                    guard_multiplier=self._multiplier() if paced else 1.0,
                    slowdown_fraction=ln.slowdown.fraction(now),
                    achieved_share=b / total if total > 0 else 0.0,
                    external_limit_bps=ln.external_bps,
                    external_for_reads=ln.external_for_reads,
                    external_headroom_taken=ln.external_headroom_taken,
                    floor_fraction=ln.floor_now,
                )
            )
        return SchedulerSnapshot(
            at=now,
            capacity_bps=cap,
            capacity_configured=self._estimator is None,
            capacity_busy_level=self._estimator.busy_level if self._estimator is not None else 0,
            reads_active=self._reads_active,
            write_cap_mode=self._cfg.write_cap_mode,
            inflight_bytes=self._inflight_bytes,
            inflight_tickets=self._inflight_tickets,
            inflight_bytes_max=self._window_bytes(),
            inflight_requests_max=self._window_requests(),
            guard_multiplier=self._guard.multiplier,
            node_guard_multiplier=self._node_guard,
            read_baseline_ttfb_s=self._guard.baseline_s,
            lanes=tuple(lanes),
            cap_scale=self._cap_scale,
        )

    @property
    def config(self) -> SchedulerConfig:
        return self._cfg

    def delivered_bytes(self, lane: str) -> int:
        """Bytes :meth:`observe_delivered` reported on ``lane`` so far. ``KeyError`` for an unknown lane."""
        return self._by_name[lane].delivered_total

    @property
    def reads_active(self) -> bool:
        """Whether the read-protected lanes are active (their caps in force) as of the last call."""
        return self._reads_active

    @property
    def capacity_bps(self) -> float:
        """The capacity ``C`` in force (configured, or the current estimate)."""
        return self._capacity()

    # -- ordering -----------------------------------------------------------------------------------------

    def _head(self, ln: _Lane) -> _Ticket:
        q = ln.queue
        while q[0].state is not _TicketState.WAITING:
            q.popleft()  # cancelled while waiting (lazy removal)
        return q[0]

    def _reservation_need(self, ln: _Lane) -> float:
        return min(float(self._head(ln).cost), ln.res_bucket.depth_bytes)

    def _reservation_winner(self, candidates: Iterable[_Lane], now: float) -> _Lane | None:
        """Reservation phase: the lane with the earliest reservation tag among those whose reservation
        bucket holds their head's cost (EDF), or None."""
        best: _Lane | None = None
        best_tag = math.inf
        for ln in candidates:
            rate = ln.res_bucket.rate_bps
            if rate <= 0:
                continue
            need = self._reservation_need(ln)
            if ln.res_bucket.ready_at(need, now) <= now + EPSILON_S:
                tag = now - (ln.res_bucket.level_bytes - need) / rate
                if tag < best_tag:
                    best, best_tag = ln, tag
        return best

    def _dispatch(self, ln: _Lane, t: _Ticket, now: float, *, reserved: bool) -> Grant:
        ln.queue.popleft()
        t.to(_TicketState.GRANTED)
        t.reserved = reserved
        c = t.cost
        ln.queued_tickets -= 1
        ln.queued_bytes -= c
        self._queued_total -= 1
        ln.inflight_tickets += 1
        ln.inflight_bytes += c
        self._inflight_tickets += 1
        self._inflight_bytes += c
        # Every grant is charged, reads' included: an overdraft is repaid by the lanes that wait for the
        # bucket, never forgiven, so the total granted over any stretch is C plus at most a few bucket
        # depths (forgiving it let concurrent readers' weight-phase grants run the store 10-30 % over C).
        self._server.take(c, now)
        ln.limit_bucket.take(c, now)
        if reserved:
            ln.res_bucket.take(c, now)
        ln.vfinish = ln.vstart + c / ln.weight_norm
        self._vclock = max(self._vclock, ln.vstart)
        if ln.queued_tickets > 0:
            ln.vstart = ln.vfinish
        ln.granted_tickets_total += 1
        ln.granted_bytes_total += c
        ln.win_granted += c
        self._win.requests += 1
        return Grant(ticket=t.id, lane=ln.spec.name, cost_bytes=c)

    def _retire(self, t: _Ticket) -> _Lane:
        """Take ``t`` off the books, finished (completed or cancelled); its lane's counts are the caller's."""
        t.to(_TicketState.FINISHED)
        del self._tickets[t.id]
        return t.lane

    def _finish(self, t: _Ticket, used: int, now: float) -> None:
        ln = self._retire(t)
        ln.inflight_tickets -= 1
        ln.inflight_bytes -= t.cost
        self._inflight_tickets -= 1
        self._inflight_bytes -= t.cost
        ln.done_total += used
        self._win.done_bytes += used
        unused = t.cost - used
        if unused > 0:
            self._server.give(unused, now)
            ln.limit_bucket.give(unused, now)
            if t.reserved:
                ln.res_bucket.give(unused, now)
        if ln.spec.read_protected:
            self._last_read_at = max(self._last_read_at, now)
        self._note_idle(ln, now)

    def _note_idle(self, ln: _Lane, now: float) -> None:
        if ln.queued_tickets == 0 and ln.inflight_tickets == 0:
            ln.limit_bucket.settle(now)
            ln.idle_credit = ln.limit_bucket.level_bytes

    def _paced_while_reads_active(self, ln: _Lane) -> bool:
        return self._reads_active and not ln.spec.read_protected and math.isfinite(ln.limit_bucket.rate_bps)

    def _back_from_idle(self, ln: _Lane, now: float) -> None:
        """A lane capped for the reads' sake keeps, of the ceiling credit it earned while idle, only what its
        ceiling delivers within the read latency target: a checkpoint lane back from seconds of idle would
        otherwise put a whole ``burst_bytes`` (plus its head ticket) into the backend's queue at once, in
        front of the reads it is capped to protect (on a 40 MB/s store, 4 MiB is 100 ms of queue). Credit
        it banked while backlogged (waiting for its turn behind the reads) is kept, and so is its rate."""
        assert ln.idle_credit is not None
        if self._paced_while_reads_active(ln):
            earned = ln.limit_bucket.rate_bps * self._cfg.latency_target_s
            ln.limit_bucket.clip(max(0.0, ln.idle_credit) + earned, now)
        ln.idle_credit = None

    # -- gates --------------------------------------------------------------------------------------------

    def _capacity(self) -> float:
        if self._estimator is not None:
            return self._estimator.capacity_bps
        assert self._cfg.capacity_bps is not None
        return self._cfg.capacity_bps * self._share

    def _window_bytes(self) -> int | None:
        cfg = self._cfg
        if cfg.inflight_bytes_max is not None:
            # One of several workers: its share of the node's window (the node's total is what is
            # configured), but room for one piece (never more than configured).
            part = int(cfg.inflight_bytes_max * self._window_share() + 1e-9)
            return min(cfg.inflight_bytes_max, max(part, self._piece_fit()))
        if self._estimator is None:
            return None
        return int(max(4 * cfg.burst_bytes, self._capacity() * AUTO_WINDOW_S))

    def _window_requests(self) -> int | None:
        """The in-flight request window: ``inflight_requests_max``, or this worker's share of it (at least
        one request) when it is one of several (:meth:`set_capacity_share`)."""
        most = self._cfg.inflight_requests_max
        if most is None:
            return None
        return max(1, int(most * self._window_share() + 1e-9))

    def _window_share(self) -> float:
        """This process's part of the node's in-flight windows: its capacity share (1 with an estimated
        capacity, which set_capacity_share does not touch)."""
        return self._share if self._estimator is None else 1.0

    def _guarding(self, ln: _Lane) -> bool:
        """Whether the guard paces ``ln`` now: its own while reads are active here, or the node's while it
        cuts (some worker of the node reads: :meth:`set_node_guard`)."""
        return ln.spec.paced_by_guard and (self._reads_active or self._node_guard < 1.0)

    def _multiplier(self) -> float:
        """The guard's multiplier for the paced lanes: this scheduler's own while reads are active here, and
        the node's (:meth:`set_node_guard`), whichever is lower."""
        own = self._guard.multiplier if self._reads_active else 1.0
        return min(own, self._node_guard)

    def _max_concurrency(self, ln: _Lane) -> int | None:
        mc = ln.spec.max_concurrency
        if mc is None or not self._guarding(ln):
            return mc
        return max(1, int(mc * self._multiplier()))

    def _window_share_bytes(self, ln: _Lane) -> float | None:
        """While reads are active a paced lane may hold only its ceiling's share of the window."""
        if not self._guarding(ln):
            return None
        win = self._window_bytes()
        if win is None:
            return None
        return min(1.0, ln.ceiling) * win

    def _ceiling_fraction(self, ln: _Lane, now: float, *, slowdown: bool = True) -> float:
        s = ln.spec
        f = s.limit if s.limit is not None else math.inf
        external = self._external_fraction(ln)
        if external is not None:
            f = min(f, external)
        if self._reads_active and self._local_caps() and s.limit_while_reads_active is not None:
            f = min(f, s.limit_while_reads_active * self._cap_scale)
        m = self._multiplier()
        if s.paced_by_guard and m < 1.0:
            f = min(f, 1.0) * m
        sd = ln.slowdown.fraction(now) if slowdown else None
        if sd is not None:
            f = min(f, sd)
        if math.isfinite(f):
            f = max(f, ln.floor_now)
        return f

    def _floor(self, ln: _Lane, *, progress: bool = True) -> float:
        """The floor in force, a fraction of ``C``: the configured ``floor``, raised (never above the lane's
        cap while reads are active, its external limit, nor into the read-protected lanes' reservations) to

        - while reads are active (when the lanes are paced for them), the *progress floor*: one round of the
          lane's queue within ``progress_interval_s``. Each stream waits with one ticket at a time and a lane
          serves its tickets first in, first out, so every stream of the lane gets its next piece within one
          round: what is queued and in flight (times :data:`PROGRESS_HEADROOM`). A latency guard that held
          the lane at its 2 % floor gave 16 writers on a 40 MB/s store one 192 KiB piece each every 4 s,
          and clients with a 10 s socket timeout gave up on part uploads mid-body;
        - the floor set at run time (:meth:`Scheduler.set_floor`: the spool's durability deadline);
        - one of several workers: its part of the node's floor (:meth:`Scheduler.set_node_floor`).

        ``progress=False``: without the progress floor (what the lane's guarantee is raised to; see
        :meth:`_reservations`)."""
        s = ln.spec
        want = max(ln.floor_set, ln.floor_node)
        interval = self._cfg.progress_interval_s
        paced_for_reads = self._reads_active or self._node_guard < 1.0  # reads here, or the node's guard cuts
        if progress and interval is not None and paced_for_reads and not s.read_protected:
            round_bytes = (ln.queued_bytes + ln.inflight_bytes) * PROGRESS_HEADROOM
            want = max(want, round_bytes / interval / self._capacity())
        if want <= s.floor:
            return s.floor
        cap = s.limit if s.limit is not None else 1.0
        external = self._external_fraction(ln)
        if external is not None:
            # A cluster allowance bounds what this node may raise its floor to: every node raising it to the
            # lane's cap would take the cluster's readers' share.
            cap = min(cap, external)
        if self._reads_active:
            # The reads' caps, with room for the store's queue releasing evenly sent bytes unevenly.
            headroom = 1.0 - self._cfg.cap_headroom
            if s.limit_while_reads_active is not None and not self._node_caps:
                cap = min(cap, s.limit_while_reads_active * headroom)
            cap = min(cap, (1.0 - math.fsum(r.spec.guaranteed for r in self._read_lanes)) * headroom)
            cap *= self._cap_scale  # shares of what a saturated store really carries
        return max(s.floor, min(want, cap))

    def _reservations(self) -> list[float]:
        """Each lane's guarantee in force (fractions of ``C``): ``max(reservation, floor)``, where a floor set
        at run time adds to it only as far as the configured guarantees leave room (they sum to at most 1,
        scaled down together when several raised floors would not fit). The progress floor only bounds the
        ceiling: the lane's weight already gives it its share up to there, and it moves with every queue."""
        base = [ln.spec.guaranteed for ln in self._lanes]
        extra = [
            max(0.0, self._floor(ln, progress=False) - b) for ln, b in zip(self._lanes, base, strict=True)
        ]
        total = math.fsum(extra)
        if total <= 0:
            return base
        k = min(1.0, max(0.0, 1.0 - math.fsum(base)) / total)
        return [b + e * k for b, e in zip(base, extra, strict=True)]

    def _apply_rates(self, now: float, *, reads_arrived: bool = False) -> None:
        cap = self._capacity()
        self._server.set_rate(cap, now)
        for ln in self._lanes:
            ln.floor_now = self._floor(ln)
        for ln, res in zip(self._lanes, self._reservations(), strict=True):
            ln.res_bucket.set_rate(res * cap, now)
            ln.ceiling = self._ceiling_fraction(ln, now)
            rate = ln.ceiling * cap if math.isfinite(ln.ceiling) else math.inf
            share_cap = self._share_cap(ln)
            if share_cap is not None:
                paced = share_cap * cap * SHARE_WINDOW_S / (SHARE_WINDOW_S + CEILING_DEPTH_S)
                rate = min(rate, max(paced, ln.spec.floor * cap))  # never under the configured floor
            ln.limit_bucket.set_rate(rate, now)
            ln.limit_bucket.set_depth(self._ceiling_depth(rate), now)
            if reads_arrived and self._paced_while_reads_active(ln):
                # Capped for the reads from now on: credit from before they came is not spent on them.
                ln.limit_bucket.clip(ln.limit_bucket.rate_bps * self._cfg.latency_target_s, now)
                if ln.idle_credit is not None:
                    ln.idle_credit = min(ln.idle_credit, 0.0)

    def _local_caps(self) -> bool:
        """Whether this scheduler applies the caps while reads are active itself (strict mode, not left to
        the node: set_node_caps)."""
        return self._cfg.write_cap_mode == "strict" and not self._node_caps

    def _external_fraction(self, ln: _Lane) -> float | None:
        """The lane's external limit as a fraction of ``C`` (None: none), less ``cap_headroom`` when it is a
        share of the reads' cap (``set_external_limit(for_reads=True)``) that has not taken it off yet."""
        if ln.external_bps is None:
            return None
        f = ln.external_bps / self._capacity()
        if ln.external_for_reads and not ln.external_headroom_taken:
            f *= 1.0 - self._cfg.cap_headroom
        return f

    def _share_cap(self, ln: _Lane) -> float | None:
        """The lane's cap for the reads' sake, less its headroom (a fraction of ``C``), or None: while reads
        are active, ``limit_while_reads_active`` in ``strict`` mode; and an external limit that is a share
        of the reads' cap (``for_reads``), wherever the readers are. The share the reads keep in every second
        depends on it."""
        s = ln.spec
        caps: list[float] = []
        if ln.external_for_reads and not s.read_protected:
            external = self._external_fraction(ln)
            assert external is not None
            caps.append(external)
        if (
            self._reads_active
            and not s.read_protected
            and s.limit_while_reads_active is not None
            and self._local_caps()
        ):
            caps.append(s.limit_while_reads_active * self._cap_scale * (1.0 - self._cfg.cap_headroom))
        return min(caps) if caps else None

    def _piece_fit(self) -> int:
        """The largest piece a paced lane moves at a time (:meth:`piece_bytes`), before the chunk bound."""
        fit = int(self._capacity() * self._cfg.latency_target_s) // PIECE_STEP_BYTES * PIECE_STEP_BYTES
        return max(PIECE_STEP_BYTES, fit)

    def _ceiling_depth(self, rate_bps: float) -> float:
        """A ceiling bucket's depth: what ``rate_bps`` fills in :data:`CEILING_DEPTH_S`, at least one piece,
        at most ``burst_bytes`` (no ceiling: ``burst_bytes``)."""
        burst = float(self._cfg.burst_bytes)
        if math.isinf(rate_bps):
            return burst
        return min(burst, max(float(self._piece_fit()), rate_bps * CEILING_DEPTH_S))

    def _wake(self, at: float) -> float:
        """The earliest of ``at``, the next window tick (rates may change) and the end of read activity."""
        return min(at, self._next_tick, self._deactivation_time())

    # -- time ---------------------------------------------------------------------------------------------

    def _advance(self, now: float) -> float:
        """Bring windows and read activity up to ``now`` (a clock that steps back is held where it was)."""
        now = max(now, self._now)
        while True:
            deact = self._deactivation_time()
            if min(deact, self._next_tick) > now:
                break
            if deact <= self._next_tick:
                self._account(deact)
                self._set_reads_active(False, deact)
                continue
            tick_at = self._next_tick
            self._account(tick_at)
            self._tick(tick_at)
            behind = int((now - self._next_tick) / self._cfg.window_s)
            if behind > _FAST_FORWARD_WINDOWS:
                # A long silence: the windows in between are empty; skip them.
                self._next_tick += behind * self._cfg.window_s
                self._window_start = self._next_tick - self._cfg.window_s
                self._acct_at = max(self._acct_at, self._window_start)
                for ln in self._lanes:
                    ln.hist_granted.clear()
                    ln.hist_delivered.clear()
                self._hist_reads_busy.clear()
        self._account(now)
        self._now = now
        return now

    def _account(self, t: float) -> None:
        dt = t - self._acct_at
        if dt > 0:
            if self._blocked_window:
                self._win.window_wait_s += dt
            if self._blocked_server:
                self._win.throttled_s += dt
            if not any(ln.queued_tickets or ln.inflight_tickets for ln in self._read_lanes):
                self._win.reads_idle_s += dt
            self._acct_at = t

    def _deactivation_time(self) -> float:
        if not self._reads_active:
            return math.inf
        for ln in self._read_lanes:  # a loop, not any(genexpr): this runs several times per request
            if ln.queued_tickets or ln.inflight_tickets:
                return math.inf
        return self._last_read_at + self._cfg.read_idle_s

    def _note_read_demand(self, cost: int, now: float) -> None:
        self._last_read_at = now
        cfg = self._cfg
        q = self._read_demand
        q.append((now, cost))
        self._read_demand_bytes += cost
        while q and q[0][0] < now - cfg.read_active_s:
            self._read_demand_bytes -= q.popleft()[1]
        threshold = cfg.read_active_min_fraction * self._capacity() * cfg.read_active_s
        if not self._reads_active and self._read_demand_bytes >= threshold:
            self._set_reads_active(True, now)

    def _set_reads_active(self, active: bool, now: float) -> None:
        # Both callers change the state (deactivation is timed only while active): kept as a guard.
        if active != self._reads_active:  # pragma: no branch
            self._reads_active = active
            self._apply_rates(now, reads_arrived=active)

    def _granted_fraction_last_s(self, ln: _Lane, now: float) -> float:
        """Like :meth:`_achieved_fraction`, but over a full second even just after start (never inflated
        by a short history), so a lane is not taken for saturated on its first few grants."""
        span = len(ln.hist_granted) * self._cfg.window_s + (now - self._window_start)
        granted = sum(ln.hist_granted) + ln.win_granted
        return granted / max(span, 1.0) / self._capacity()

    def _achieved_fraction(self, ln: _Lane, now: float) -> float:
        """The lane's granted rate over the last second, as a fraction of capacity."""
        span = len(ln.hist_granted) * self._cfg.window_s + (now - self._window_start)
        if span <= 0:
            return 1.0
        return min(1.0, (sum(ln.hist_granted) + ln.win_granted) / span / self._capacity())

    def _measured_cap_scale(self) -> float:
        """:func:`saturation_scale` of what the store delivered over the last full second, while reads are
        active and kept busy (a read ticket queued or in flight for :data:`READS_BUSY_FRACTION` of that
        second: readers that always wait on the store take whatever it has left, so what it delivered is
        what it can carry; readers with idle gaps leave it merely not full, and the caps stay shares of the
        configured capacity), with a configured capacity (an estimated one follows the store already);
        else 1."""
        if self._estimator is not None or not self._reads_active or not self._delivered_seen:
            return 1.0
        busy = self._hist_reads_busy
        if len(busy) < SHARE_HISTORY_WINDOWS or sum(busy) / len(busy) < READS_BUSY_FRACTION:
            return 1.0
        windows = len(self._lanes[0].hist_delivered)
        # Unreachable: hist_delivered is appended and cleared with _hist_reads_busy, so it is as long.
        if windows < SHARE_HISTORY_WINDOWS:  # pragma: no cover
            return 1.0
        delivered = sum(sum(ln.hist_delivered) for ln in self._lanes)
        return saturation_scale(delivered / (windows * self._cfg.window_s) / self._capacity())

    def _tick(self, t: float) -> None:
        """End of a window: feedback loops, rates, allocation, statistics."""
        cfg = self._cfg
        cap = self._capacity()
        for ln in self._lanes:
            ln.hist_granted.append(ln.win_granted)
            ln.hist_delivered.append(ln.win_delivered)
        paced_bytes = sum(ln.win_granted for ln in self._lanes if ln.spec.paced_by_guard)
        paced_work = paced_bytes > 0 or any(
            ln.queued_tickets or ln.inflight_tickets for ln in self._lanes if ln.spec.paced_by_guard
        )
        quiet = paced_bytes < BASELINE_QUIET_FRACTION * cap * cfg.window_s
        all_bytes = sum(sum(ln.hist_granted) for ln in self._lanes)
        read_bytes = sum(sum(ln.hist_granted) for ln in self._read_lanes)
        read_share = read_bytes / all_bytes if all_bytes > 0 else 0.0
        verdict = self._guard.tick(t, quiet=quiet, read_share=read_share, can_cut=self._reads_active)
        if self._estimator is not None:
            delivered = (
                sum(ln.win_delivered for ln in self._lanes) if self._delivered_seen else self._win.done_bytes
            )
            self._estimator.tick(
                t,
                delivered_bytes=delivered,
                window_wait_s=self._win.window_wait_s,
                throttled_s=self._win.throttled_s,
                errors=self._win.errors,
                requests=self._win.requests,
                # A miss is a capacity signal only once the guard has nothing left to cut, and only while a
                # paced lane has work: with none, reads missing their target are reads queueing behind reads
                # (or a busy host), and a lower estimate would only throttle those reads against nobody (one
                # such window at the start of a read burst, delivering little, capped the estimate at twice
                # that for ten seconds: large GETs alone ran at half speed).
                # And only the backend's share of it (TTFB over the baseline): reads waiting here, behind a
                # low estimate, would otherwise lower it further (fuzz runs sank to 1 MiB/s that way).
                guard_missed=verdict.backend_missed and self._guard.multiplier <= GUARD_M_MIN and paced_work,
            )
        self._hist_reads_busy.append(max(0.0, 1.0 - self._win.reads_idle_s / cfg.window_s))
        self._cap_scale = self._measured_cap_scale()
        for ln in self._lanes:
            ln.slowdown.recover(t, self._ceiling_fraction(ln, t, slowdown=False))
        self._apply_rates(t)
        cap = self._capacity()
        demands = [
            LaneDemand(
                reservation_bps=ln.res_bucket.rate_bps,
                weight=ln.spec.weight,
                limit_bps=ln.ceiling * cap if math.isfinite(ln.ceiling) else math.inf,
                demand_bps=(ln.win_submitted + ln.queued_bytes) / cfg.window_s,
            )
            for ln in self._lanes
        ]
        for ln, a in zip(self._lanes, allocate(cap, demands), strict=True):
            ln.allocation_bps = a
            ln.win_granted = ln.win_delivered = ln.win_submitted = 0
        self._win = _WindowStats()
        self._window_start = t
        self._next_tick = t + cfg.window_s
