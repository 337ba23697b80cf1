"""The spool's durability deadline: how much of the store the drain lane must be guaranteed, and when to warn.

Theory of operation
-------------------
The spool acknowledges a checkpoint write once it is durable on local disk and drains it to the store in the
background, through the checkpoint lane. While dataset reads saturate the store, that lane is paced for
them: the latency guard may hold it at its configured floor (2 % of ``C``), and a backlog drained at 2 %
grows without bound when checkpoints arrive at 20 % on average. So the oldest acknowledged byte gets a
*deadline*: it must be on the store within ``deadline_s`` of its acknowledgement.

:func:`plan` turns the spool's state into the drain lane's floor: the rate that puts the whole backlog on the
store by ``DEADLINE_AIM`` of the deadline (a margin for the next burst and the estimate's error), as a
fraction of the capacity, between the lane's configured floor and its cap (30 %). Far from the deadline that
is the configured floor, and the latency guard keeps the read latency target; as the deadline nears (less
time left for the same backlog) the floor rises toward the cap, and the guard can pace the lane no lower.
Reads keep the rest (70 % and more), since the floor never exceeds the cap. The floor is a pure function of
backlog bytes, the age of the oldest byte, the deadline and the estimated capacity; the shell
(``gateway.runtime.spool_deadline``) hands it to the scheduler with ``Scheduler.set_floor``.

When even the cap cannot meet the deadline (``backlog / (cap * C)`` exceeds the time left), the plan says
so (``at_risk``), long before the spool fills: the shell reports it as a metric, a status field and a log
warning.

:class:`CheckpointCadence` learns the default deadline: the interval between checkpoint *bursts* (spool
acknowledgements separated by at least ``quiet_s`` of silence), the median of the last few. A checkpoint
then has until the next one to become durable, which keeps the backlog bounded (one checkpoint at most)
whenever checkpoints average under the cap. The deadline is the smaller of that interval and
``[spool].max_age_s``; before two bursts have been seen, ``max_age_s`` alone.

Nothing here reads a clock: every method takes the time.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass

# Aim to have the backlog on the store by this fraction of the deadline: room for the estimate's error and
# for the lane getting less than its floor for a moment (a guard window, a SlowDown).
DEADLINE_AIM = 0.8
# Bursts: acknowledgements after at least this much silence start a new one.
BURST_QUIET_S = 4.0
# The deadline learnt from the cadence is the median of this many recent intervals.
CADENCE_HISTORY = 5
# A cadence shorter than this is not a checkpoint cadence (a steady writer): not used as a deadline.
MIN_CADENCE_S = 5.0


@dataclass(frozen=True, slots=True)
class DeadlinePlan:
    """What :func:`plan` decided. Fractions are of the capacity ``C``; times in seconds."""

    floor_fraction: float  # the drain lane's floor to set now
    deadline_s: float  # the deadline in force
    time_left_s: float  # until the oldest pending byte is overdue (negative once it is)
    best_case_s: float  # to put the whole backlog on the store at the lane's cap
    projected_s: float  # to put it there at the floor (the guaranteed rate: an upper bound); 0 if empty
    at_risk: bool  # the deadline cannot be met even at the cap


def plan(
    *,
    backlog_bytes: int,
    oldest_age_s: float,
    deadline_s: float,
    capacity_bps: float,
    min_fraction: float,
    cap_fraction: float,
) -> DeadlinePlan:
    """The drain lane's floor for a backlog of ``backlog_bytes`` whose oldest byte was acknowledged
    ``oldest_age_s`` ago, to be on a store of ``capacity_bps`` within ``deadline_s`` of acknowledgement; the
    floor stays within ``[min_fraction, cap_fraction]`` (the lane's configured floor and its cap).

    Raises ``ValueError`` for a non-positive deadline or capacity, or fractions out of order."""
    if not (deadline_s > 0 and capacity_bps > 0):
        raise ValueError("deadline_s and capacity_bps must be > 0")
    if not 0.0 <= min_fraction <= cap_fraction <= 1.0 or cap_fraction <= 0:
        raise ValueError("need 0 <= min_fraction <= cap_fraction <= 1 and cap_fraction > 0")
    if backlog_bytes <= 0:
        return DeadlinePlan(min_fraction, deadline_s, deadline_s, 0.0, 0.0, at_risk=False)
    age = max(0.0, oldest_age_s)
    time_left = deadline_s - age
    aim_left = DEADLINE_AIM * deadline_s - age
    need = backlog_bytes / aim_left / capacity_bps if aim_left > 0 else math.inf
    floor = min(cap_fraction, max(min_fraction, need))
    best = backlog_bytes / (cap_fraction * capacity_bps)
    projected = backlog_bytes / (floor * capacity_bps) if floor > 0 else math.inf
    return DeadlinePlan(
        floor_fraction=floor,
        deadline_s=deadline_s,
        time_left_s=time_left,
        best_case_s=best,
        projected_s=projected,
        at_risk=best > time_left,
    )


class CheckpointCadence:
    """The interval between checkpoint bursts, learnt from the times the spool acknowledged writes."""

    __slots__ = ("_burst_starts", "_last_ack", "_quiet_s")

    def __init__(self, quiet_s: float = BURST_QUIET_S, history: int = CADENCE_HISTORY) -> None:
        if not quiet_s > 0 or history < 1:
            raise ValueError("quiet_s must be > 0 and history >= 1")
        self._quiet_s = quiet_s
        self._last_ack: float | None = None
        self._burst_starts: deque[float] = deque(maxlen=history + 1)

    def observe_ack(self, at: float) -> None:
        """The spool acknowledged a write at ``at`` (any clock, as long as it is the same one throughout;
        a time before the last one is taken as the last one)."""
        last = self._last_ack
        if last is not None:
            at = max(at, last)
        if last is None or at - last >= self._quiet_s:
            self._burst_starts.append(at)
        self._last_ack = at

    @property
    def bursts_seen(self) -> int:
        return len(self._burst_starts)

    @property
    def interval_s(self) -> float | None:
        """The median interval between recent burst starts; None before two bursts (or for a cadence under
        :data:`MIN_CADENCE_S`, which is a steady writer, not checkpoints)."""
        s = list(self._burst_starts)
        if len(s) < 2:
            return None
        interval = statistics.median(b - a for a, b in itertools.pairwise(s))
        return interval if interval >= MIN_CADENCE_S else None

    def deadline_s(self, max_age_s: float) -> float:
        """The deadline in force: the cadence, or ``max_age_s`` if that is smaller or no cadence is known."""
        interval = self.interval_s
        return max_age_s if interval is None else min(max_age_s, interval)
