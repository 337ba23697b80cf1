"""The fluid allocation the lane scheduler realises: mClock's reservation/weight/limit as water-filling.

Theory of operation
-------------------
Given a capacity ``C`` (bytes/s) and, per lane, a reservation ``r`` (bytes/s), a weight ``w``, a limit ``l``
(bytes/s, ``inf`` for none) and a demand ``d`` (bytes/s, ``inf`` for backlogged), the allocation is the
unique

    a_i = clamp(lambda * w_i, lo_i, hi_i)   with   lo_i = min(d_i, r_i, hi_i),  hi_i = min(d_i, l_i)

whose sum is ``min(C, sum(hi))``: every lane gets its reservation (or its demand, if smaller), nobody
gets more than its limit or its demand, and the rest is shared in proportion to the weights, work
conserving. This is what two-phase mClock converges to when its P tags count *all* service (dmclock's
tags: a request served in the reservation phase still advances the lane's proportional tag), so a
reservation acts as a floor under the weighted share, not as an extra on top of it. With the default
lanes and both dataset and checkpoint backlogged this gives 0.70 / 0.30.

``lambda`` is found exactly: ``sum(clamp(lambda * w_i, lo_i, hi_i))`` is piecewise linear and
non-decreasing in ``lambda``, with breakpoints at ``lo_i / w_i`` and ``hi_i / w_i``.

This module is *not* the scheduler (``s3lanes.core.scheduler`` orders discrete chunks with tags and
buckets); it is the specification the scheduler's long-run shares are tested against, and what the
scheduler reports as each lane's current allocation. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaneDemand:
    """One lane's parameters for :func:`allocate`, all absolute (bytes/s), not fractions of capacity."""

    reservation_bps: float
    weight: float
    limit_bps: float  # math.inf for no limit
    demand_bps: float  # math.inf for backlogged

    def __post_init__(self) -> None:
        if self.reservation_bps < 0 or self.limit_bps < 0 or self.demand_bps < 0:
            raise ValueError("rates must be >= 0")
        if not self.weight > 0:
            raise ValueError("weight must be > 0")


def allocate(capacity_bps: float, lanes: Sequence[LaneDemand]) -> tuple[float, ...]:
    """Water-fill ``capacity_bps`` over ``lanes`` (see the module docstring). Returns bytes/s per lane.

    If the reservations (capped by demand and limit) alone exceed the capacity, they are scaled down
    proportionally: an overcommitted configuration degrades evenly instead of starving the last lane.
    """
    if capacity_bps < 0 or math.isnan(capacity_bps):
        raise ValueError("capacity must be >= 0")
    hi = [min(x.demand_bps, x.limit_bps) for x in lanes]
    lo = [min(x.reservation_bps, h) for x, h in zip(lanes, hi, strict=True)]
    sum_lo = math.fsum(lo)
    if sum_lo >= capacity_bps:
        if sum_lo == 0:
            return tuple(0.0 for _ in lanes)
        scale = capacity_bps / sum_lo
        return tuple(v * scale for v in lo)
    sum_hi = math.fsum(hi)
    if sum_hi <= capacity_bps:
        return tuple(hi)  # everyone satisfied (includes finite demands below capacity)
    target = capacity_bps
    # The sum is piecewise linear in lambda; walk the sorted breakpoints until it reaches the target.
    breaks = sorted(
        {v / x.weight for x, v in zip(lanes, lo, strict=True)}
        | {v / x.weight for x, v in zip(lanes, hi, strict=True) if math.isfinite(v)}
    )

    def total(lam: float) -> float:
        return math.fsum(
            min(max(lam * x.weight, lo_i), hi_i) for x, lo_i, hi_i in zip(lanes, lo, hi, strict=True)
        )

    prev_lam, prev_sum = 0.0, total(0.0)
    lam = prev_lam
    for b in breaks:
        s = total(b)
        if s >= target:
            lam = prev_lam + (target - prev_sum) * (b - prev_lam) / (s - prev_sum) if s > prev_sum else b
            break
        prev_lam, prev_sum = b, s
    else:
        # Past the last finite breakpoint only unbounded lanes still grow, linearly in lambda.
        slope = math.fsum(x.weight for x, h in zip(lanes, hi, strict=True) if math.isinf(h))
        lam = prev_lam + (target - prev_sum) / slope if slope > 0 else prev_lam
    out = [min(max(lam * x.weight, lo_i), hi_i) for x, lo_i, hi_i in zip(lanes, lo, hi, strict=True)]
    # Remove the rounding residue so the sum never exceeds the capacity.
    excess = math.fsum(out) - capacity_bps
    if excess > 0:
        # Defensive: the residue is a few ulps, and the lane with the most headroom above its floor has far
        # more (sum(out) > capacity > sum(lo)), so the loop ends at its first lane; 300 000 random
        # allocations never moved on to a second one.
        for i in sorted(range(len(out)), key=lambda j: -(out[j] - lo[j])):  # pragma: no branch
            take = min(excess, out[i] - lo[i])
            out[i] -= take
            excess -= take
            if excess <= 0:  # pragma: no branch
                break
    return tuple(out)
