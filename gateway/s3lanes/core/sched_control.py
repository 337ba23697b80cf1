"""The lane scheduler's feedback loops: byte buckets, read-latency guard, capacity estimator, SlowDown.

Theory of operation
-------------------
Each piece is a small synchronous state machine fed with explicit times; :mod:`s3lanes.core.scheduler` owns
one of each (a guard and an estimator per scheduler, a bucket per lane and phase, a SlowDown cut per lane)
and calls their ``tick`` once per window ``Δ`` (100 ms by default).

- :class:`TokenBucket` is GCRA in byte form: a level that refills at ``rate_bps`` up to ``depth_bytes`` and
  may go negative (debt, iocost-style), so a chunk larger than the depth is still granted, and the next one
  waits the debt out. Keeping the level in bytes (not a theoretical arrival time) makes rate changes exact:
  the bucket is settled at the old rate up to the instant of the change.
- :class:`LatencyGuard` follows io.latency (block/blk-iolatency.c), adapted: every read request contributes
  ``extra = gateway wait + max(0, TTFB - baseline)``; a window *misses* when more than 1% of its samples
  (at least one) exceed the target, which halves the multiplier ``m`` applied to the paced lanes (at most
  once per ``Δ``, down to ``m_min``); a window whose p99 is under 75% of the target (iocost's hysteresis)
  with at least 5 samples grows ``m`` by 1/16, at most once per ``2Δ``. After five seconds without reads
  ``m`` returns to 1. The baseline is the p5 TTFB of recent quiet windows (paced lanes under 5% of
  capacity), else the minimum over the last 60 s: passive, never pinned.
- :class:`CapacityEstimator` is iocost's vrate ladder: a busy window (the in-flight window was full more
  than 5% of the time, a 5xx/SlowDown rate over 0.1%, or a guard miss on the backend's own latency while
  the guard has nothing left to cut) pushes ``busy_level`` up, an unbusy one (none of those above 75% of
  their thresholds, and the capacity bucket itself was throttling) pushes it down, anything else resets it
  (coast: nobody throttled means the capacity is unknown, do not drift). The estimate moves by the iocost
  step for ``|busy_level|`` (0% for the first three windows, then 1%, 2%, 4%, 8%, 16%), never below what
  the backend delivered in the *saturated* windows (in-flight window full) of the last second (demand was
  above what the backend moved, so that is a measurement; when it holds the estimate the ladder stops
  escalating), and stays within [0.5, 2] x the throughput delivered in the saturated windows of the last
  10 s. A window busy only for an error or a slow read measures nothing: it may have carried a trickle.
  The latency signal is the backend's (TTFB over its baseline), never the reads' wait in the gateway: a
  lower estimate makes reads wait longer here, which must not lower it further. Saturation must be
  observable: with an estimated capacity the in-flight window should be about a bandwidth-delay product,
  which is what the scheduler picks when none is configured.
- :class:`SlowdownCut` is botocore's CUBIC response to a 503: the lane's rate is cut to 0.7 x (at most once
  per window), grows back along a concave cubic that regains the pre-cut rate after 2 s, then probes beyond
  it along a convex one (``0.4 * t^3``, in fractions of capacity), so a lane cut to its floor by a storm is
  back at its cap within about 3 s of the last 503.

None of these does I/O or reads a clock.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

EPSILON_S = 1e-9  # "ready now" tolerance, so float rounding never produces a WaitUntil(now + 1e-15) loop


class TokenBucket:
    """A byte bucket with debt. ``rate_bps = inf``: unlimited (always full); ``0``: never refills."""

    __slots__ = ("at", "depth_bytes", "level_bytes", "rate_bps")

    def __init__(self, rate_bps: float, depth_bytes: float, now: float, *, full: bool = True) -> None:
        self.rate_bps = rate_bps
        self.depth_bytes = depth_bytes
        self.level_bytes = depth_bytes if full else 0.0
        self.at = now

    def settle(self, now: float) -> None:
        if now > self.at:
            if math.isinf(self.rate_bps):
                self.level_bytes = self.depth_bytes
            elif self.rate_bps > 0:
                self.level_bytes = min(self.depth_bytes, self.level_bytes + self.rate_bps * (now - self.at))
            self.at = now

    def set_rate(self, rate_bps: float, now: float) -> None:
        """Change the rate from ``now`` on (the time before ``now`` is accounted at the old rate)."""
        self.settle(now)
        self.rate_bps = rate_bps
        if math.isinf(rate_bps):
            self.level_bytes = self.depth_bytes

    def set_depth(self, depth_bytes: float, now: float) -> None:
        """Change the depth from ``now`` on; credit above a smaller depth is forfeited (debt stays)."""
        self.settle(now)
        self.depth_bytes = depth_bytes
        self.level_bytes = depth_bytes if math.isinf(self.rate_bps) else min(self.level_bytes, depth_bytes)

    def clip(self, max_level_bytes: float, now: float) -> None:
        """Forfeit credit above ``max_level_bytes`` (debt stays)."""
        self.settle(now)
        self.level_bytes = min(self.level_bytes, max_level_bytes)

    def ready_at(self, need_bytes: float, now: float) -> float:
        """When the level reaches ``need_bytes`` (``now`` if it already has; ``inf`` if it never will)."""
        self.settle(now)
        missing = need_bytes - self.level_bytes
        if missing <= 0 or math.isinf(self.rate_bps):
            return now
        if self.rate_bps <= 0:
            return math.inf
        return now + missing / self.rate_bps

    def take(self, nbytes: float, now: float) -> None:
        self.settle(now)
        if not math.isinf(self.rate_bps):
            self.level_bytes -= nbytes

    def give(self, nbytes: float, now: float) -> None:
        """Refund unused budget (never above the depth)."""
        self.settle(now)
        self.level_bytes = min(self.depth_bytes, self.level_bytes + nbytes)


# -- read-latency guard ----------------------------------------------------------------------------------

GUARD_M_MIN = 1.0 / 32
GUARD_STEP_UP = 1.0 / 16
GUARD_OK_FRACTION = 0.75  # iocost's hysteresis: grow only when p99 is under 75% of the target
GUARD_MIN_GOOD_SAMPLES = 5  # io.latency's MIN_SAMPLES for a "good" window
GUARD_AGGREGATE_S = 1.0  # with few samples, aggregate up to 1 s before judging a window good
GUARD_RESET_AFTER_IDLE_S = 5.0  # io.latency clears its scaling after 5 s without the protected group
GUARD_MIN_READ_SHARE = 0.05  # io.latency's 5% rule: a trickle of reads does not throttle the rest
BASELINE_HISTORY_S = 60.0
BASELINE_QUIET_FRACTION = 0.05  # a window is "quiet" when paced lanes used < 5% of capacity
_BASELINE_MAX_SAMPLES = 1024  # per window, for the p5


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """What one guard tick decided; ``missed`` also feeds the capacity estimator."""

    missed: bool
    changed: bool
    multiplier: float
    # The miss holds on the backend's share alone (TTFB over the baseline, without the gateway wait): the
    # store itself is slower, which is what the capacity estimator may act on.
    backend_missed: bool = False


class LatencyGuard:
    """Windowed p99 of read ``extra`` latency against a target; drives the paced lanes' multiplier."""

    def __init__(self, target_s: float, window_s: float, now: float) -> None:
        self.target_s = target_s
        self.window_s = window_s
        self.multiplier = 1.0
        self.baseline_s: float | None = None
        self.last_change_at = -math.inf
        self.last_read_at = -math.inf
        self.last_p99_s: float | None = None  # of the last judged aggregate, for the snapshot
        self._reset(now)  # the aggregate being gathered: _since, _n, _missed, _backend_missed, _high ...
        self._window_ttfb: list[float] = []
        self._min_ttfb_s = math.inf
        self._history: deque[tuple[float, float, bool]] = deque()  # (window end, p5 TTFB, quiet)
        # Reads queue behind reads too (a loader's batch on a slow link): the p99 of their extra latency in
        # quiet windows (paced lanes idle) is what reads cost themselves. The guard protects reads from
        # latency the *paced* lanes add, so its threshold is the target on top of that.
        self._window_extra: list[float] = []
        self._quiet_p99: deque[tuple[float, float]] = deque()  # (window end, p99 extra) of quiet windows
        self.self_p99_s = 0.0

    def _reset(self, now: float) -> None:
        """Start a new aggregate of read samples (at construction, and whenever a tick closes one)."""
        self._since = now
        self._n = self._missed = self._backend_missed = self._high = 0
        self._max_extra_s = 0.0

    def observe(self, wait_s: float, ttfb_s: float, now: float) -> None:
        wait_s = max(0.0, wait_s)
        ttfb_s = max(0.0, ttfb_s)
        self.last_read_at = now
        if len(self._window_ttfb) < _BASELINE_MAX_SAMPLES:
            self._window_ttfb.append(ttfb_s)
        self._min_ttfb_s = min(self._min_ttfb_s, ttfb_s)
        base = self.baseline_s if self.baseline_s is not None else self._min_ttfb_s
        inflation = max(0.0, ttfb_s - base)
        extra = wait_s + inflation
        self._n += 1
        if extra > self.self_p99_s + self.target_s:
            self._missed += 1
            if inflation > self.self_p99_s + self.target_s:
                self._backend_missed += 1
        if extra >= self.self_p99_s + GUARD_OK_FRACTION * self.target_s:
            self._high += 1
        self._max_extra_s = max(self._max_extra_s, extra)
        if len(self._window_extra) < _BASELINE_MAX_SAMPLES:
            self._window_extra.append(extra)

    def _update_self_p99(self, now: float, quiet: bool) -> None:
        extras, self._window_extra = self._window_extra, []
        if quiet and len(extras) >= GUARD_MIN_GOOD_SAMPLES:
            xs = sorted(extras)
            self._quiet_p99.append((now, xs[min(len(xs) - 1, int(0.99 * len(xs)))]))
        while self._quiet_p99 and self._quiet_p99[0][0] < now - BASELINE_HISTORY_S:
            self._quiet_p99.popleft()
        if self._quiet_p99:
            # Only once reads alone cannot meet the target does it move: then the guard holds paced
            # lanes to what they add on top of the reads' own queueing, instead of to an impossible target.
            own = statistics.median(p for _, p in self._quiet_p99)
            self.self_p99_s = own if own > self.target_s else 0.0

    def _update_baseline(self, now: float, quiet: bool) -> None:
        if self._window_ttfb:
            xs = sorted(self._window_ttfb)
            p5 = xs[min(len(xs) - 1, int(0.05 * len(xs)))]
            self._history.append((now, p5, quiet))
            self._window_ttfb.clear()
        while self._history and self._history[0][0] < now - BASELINE_HISTORY_S:
            self._history.popleft()
        if self._history:
            quiet_p5 = [p for _, p, q in self._history if q]
            self.baseline_s = min(quiet_p5) if quiet_p5 else min(p for _, p, _q in self._history)

    def tick(self, now: float, *, quiet: bool, read_share: float, can_cut: bool) -> GuardVerdict:
        """Judge the samples gathered since the last decision. ``can_cut``: some paced lane is above its
        floor (and reads are active), so halving would change something."""
        self._update_baseline(now, quiet)
        self._update_self_p99(now, quiet)
        if now - self.last_read_at >= GUARD_RESET_AFTER_IDLE_S:
            changed = self.multiplier != 1.0
            self.multiplier = 1.0
            self._reset(now)
            return GuardVerdict(missed=False, changed=changed, multiplier=1.0)
        n, missed = self._n, self._missed
        if n == 0:
            if now - self._since >= GUARD_AGGREGATE_S:
                self._reset(now)
            return GuardVerdict(missed=False, changed=False, multiplier=self.multiplier)
        p99_over = missed >= max(n / 100.0, 1.0)
        if p99_over:
            backend_missed = self._backend_missed >= max(n / 100.0, 1.0)
            self.last_p99_s = self._max_extra_s if n < 100 else None
            if read_share < GUARD_MIN_READ_SHARE:
                self._reset(now)
                return GuardVerdict(missed=False, changed=False, multiplier=self.multiplier)
            changed = False
            if can_cut and now - self.last_change_at >= self.window_s - EPSILON_S:
                new = max(self.multiplier / 2.0, GUARD_M_MIN)
                changed = new != self.multiplier
                self.multiplier = new
                self.last_change_at = now
            self._reset(now)
            return GuardVerdict(
                missed=True, changed=changed, multiplier=self.multiplier, backend_missed=backend_missed
            )
        good = n >= GUARD_MIN_GOOD_SAMPLES and self._high <= n / 100.0
        if good and now - self.last_change_at >= 2 * self.window_s - EPSILON_S:
            changed = self.multiplier < 1.0
            self.multiplier = min(1.0, self.multiplier + GUARD_STEP_UP)
            if changed:
                self.last_change_at = now
            self._reset(now)
            return GuardVerdict(missed=False, changed=changed, multiplier=self.multiplier)
        if now - self._since >= GUARD_AGGREGATE_S:
            self._reset(now)
        return GuardVerdict(missed=False, changed=False, multiplier=self.multiplier)


# -- capacity estimator ----------------------------------------------------------------------------------

# iocost's vrate_adj_pct ladder: index = |busy_level|.
_LADDER_PCT: tuple[float, ...] = (0, 0, 0, 0) + (1,) * 16 + (2,) * 16 + (4,) * 8 + (8,) * 8 + (16,)
ESTIMATOR_WINDOW_WAIT_BUSY = 0.05  # the in-flight window was full > 5% of the time
ESTIMATOR_ERROR_RATE_BUSY = 0.001  # > 0.1% of requests answered 503/5xx
ESTIMATOR_UNBUSY_FRACTION = 0.75
ESTIMATOR_THROTTLED = 0.05  # the capacity bucket held work back > 5% of the time
ESTIMATOR_CLAMP_LOW = 0.5
ESTIMATOR_CLAMP_HIGH = 2.0
ESTIMATOR_HISTORY_S = 10.0  # saturated windows' delivery kept this long for the [0.5, 2] clamp
ESTIMATOR_FLOOR_S = 1.0  # ... and this long for the floor under a decrease
ESTIMATOR_FLOOR_MIN_WINDOWS = 3
_LADDER_FIRST_STEP = 4  # the first |busy_level| with a non-zero step
ESTIMATOR_MIN_BPS = 1024.0 * 1024.0


class CapacityEstimator:
    """Online estimate of the backend's bandwidth (bytes/s), iocost-style. Coasts without evidence."""

    def saturated_since(self, t: float) -> bool:
        """Whether a window that ended at ``t`` or later had the in-flight window full (the backend was the
        bottleneck: what it delivered then was a measurement)."""
        q = self._busy_delivered
        return bool(q) and q[-1][0] >= t

    def __init__(self, initial_bps: float, window_s: float) -> None:
        self.capacity_bps = initial_bps
        self.window_s = window_s
        self.busy_level = 0
        self._busy_delivered: deque[tuple[float, float]] = deque()  # (t, delivered bps), saturated windows

    def tick(
        self,
        now: float,
        *,
        delivered_bytes: float,
        window_wait_s: float,
        throttled_s: float,
        errors: int,
        requests: int,
        guard_missed: bool,
    ) -> None:
        w = self.window_s
        delivered_bps = delivered_bytes / w
        wait_frac = window_wait_s / w
        error_rate = errors / requests if requests else (1.0 if errors else 0.0)
        saturated = wait_frac > ESTIMATOR_WINDOW_WAIT_BUSY
        busy = saturated or error_rate > ESTIMATOR_ERROR_RATE_BUSY or guard_missed
        unbusy = (
            not busy
            and wait_frac <= ESTIMATOR_UNBUSY_FRACTION * ESTIMATOR_WINDOW_WAIT_BUSY
            and error_rate <= ESTIMATOR_UNBUSY_FRACTION * ESTIMATOR_ERROR_RATE_BUSY
            and throttled_s / w > ESTIMATOR_THROTTLED
        )
        q = self._busy_delivered
        if saturated and delivered_bytes > 0:
            # Only a full in-flight window makes the delivery a measurement: demand was above what the
            # backend moved. A window that is busy for an error or a slow read may have carried a trickle
            # (one such window delivering 240 KB/s clamped a 1 GB/s estimate to 1 MiB/s at once).
            q.append((now, delivered_bps))
        while q and q[0][0] < now - ESTIMATOR_HISTORY_S:
            q.popleft()
        recent = [v for t, v in q if t >= now - ESTIMATOR_FLOOR_S]
        if busy:
            self.busy_level = max(self.busy_level, 0) + 1
        elif unbusy:
            self.busy_level = min(self.busy_level, 0) - 1
        else:
            self.busy_level = 0
        adj = _LADDER_PCT[min(abs(self.busy_level), len(_LADDER_PCT) - 1)] / 100.0
        c = self.capacity_bps
        if self.busy_level > 0:
            c *= 1.0 - adj
            if len(recent) >= ESTIMATOR_FLOOR_MIN_WINDOWS:
                # What the backend delivered while it was the bottleneck is a measurement, not a guess:
                # never go below it, and stop escalating the steps once it is what holds the estimate.
                floor = sum(recent) / len(recent)
                if c < floor:
                    c = floor
                    self.busy_level = min(self.busy_level, _LADDER_FIRST_STEP)
        elif self.busy_level < 0:
            c *= 1.0 + adj
        if q:
            ref = sum(v for _, v in q) / len(q)
            c = min(max(c, ESTIMATOR_CLAMP_LOW * ref), ESTIMATOR_CLAMP_HIGH * ref)
        self.capacity_bps = max(c, ESTIMATOR_MIN_BPS)


# -- SlowDown ------------------------------------------------------------------------------------------

SLOWDOWN_BETA = 0.7  # botocore's CUBIC multiplicative decrease
SLOWDOWN_RECOVERY_S = 2.0  # time to regain the pre-cut rate (CUBIC's K)
SLOWDOWN_PROBE_PER_S3 = 0.4  # CUBIC's C (botocore's 0.4), in fractions of capacity per s^3 beyond K


class SlowdownCut:
    """A lane's rate ceiling after 503 SlowDown, as a fraction of capacity; ``None`` once recovered."""

    __slots__ = ("cut_at", "floor_fraction", "last_cut_at", "w_cut", "w_max")

    def __init__(self) -> None:
        self.cut_at = -math.inf
        self.last_cut_at = -math.inf
        self.w_max = math.inf
        self.w_cut = math.inf
        self.floor_fraction = 0.0

    def active(self) -> bool:
        return math.isfinite(self.w_max)

    def cut(self, current_fraction: float, floor_fraction: float, now: float, min_interval_s: float) -> bool:
        """Cut to 0.7 x the current rate (at most once per ``min_interval_s``). Returns whether it cut."""
        if now - self.last_cut_at < min_interval_s:
            return False
        rate = min(current_fraction, self.fraction(now) or math.inf)
        self.w_max = rate
        self.w_cut = max(rate * SLOWDOWN_BETA, floor_fraction)
        self.floor_fraction = floor_fraction
        self.cut_at = self.last_cut_at = now
        return True

    def fraction(self, now: float) -> float | None:
        if not self.active():
            return None
        dt = now - self.cut_at
        k = SLOWDOWN_RECOVERY_S
        if dt < k:  # concave: regain the pre-cut rate by K
            return self.w_max - (self.w_max - self.w_cut) * (1.0 - dt / k) ** 3
        return self.w_max + SLOWDOWN_PROBE_PER_S3 * (dt - k) ** 3  # convex: probe beyond it

    def recover(self, now: float, nominal_fraction: float) -> None:
        """Forget the cut once the cubic has grown past the lane's nominal ceiling (or past 100%)."""
        f = self.fraction(now)
        if f is not None and f >= min(nominal_fraction, 1.0):
            self.w_max = self.w_cut = math.inf
