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
(``s3lanes.runtime.spool_deadline``) hands it to the scheduler with ``Scheduler.set_floor``.

When even the cap cannot meet the deadline (``backlog / (cap * C)`` exceeds the time left), the plan says
so (``at_risk``), long before the spool fills: the shell reports it as a metric, a status field and a log
warning.

:class:`CheckpointCadence` learns the default deadline: the interval between checkpoint *bursts* (spool
acknowledgements separated by at least ``quiet_s`` of silence, counted by their bytes), the median of the
last few. Only a burst of at least :data:`BURST_MIN_FRACTION` of the largest recent one is a checkpoint: a
commit marker acknowledged seconds after its shards, a log or a metrics file written between checkpoints
would otherwise each start a "burst" and shorten the interval (and so the deadline) to their own spacing.
A checkpoint then has until the next one to become durable, which keeps the backlog bounded (one
checkpoint at most) whenever checkpoints average under the cap. ``[spool].max_age_s``, when set, is the
deadline whatever the cadence (longer: the backlog may span checkpoints and reads keep more of the store;
shorter: durable sooner); unset, the deadline is the learnt interval, at most :data:`DEFAULT_MAX_AGE_S`,
which is also the deadline before two checkpoints have been seen.

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
# A burst is a checkpoint when it holds at least this fraction of the bytes of the largest of the last
# BURST_WINDOW bursts (small ones included: the window moves on, so checkpoints that shrink for good are
# checkpoints again once the large ones have left it).
BURST_MIN_FRACTION = 0.25
BURST_WINDOW = 48
# The deadline when [spool].max_age_s is not set and no cadence is known (or the cadence is longer).
DEFAULT_MAX_AGE_S = 3600.0


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
    """The interval between checkpoint bursts, learnt from the times and sizes of the spool's
    acknowledgements. Bursts too small to be checkpoints (see the module docstring) are not counted."""

    __slots__ = ("_bursts", "_current", "_history", "_last_ack", "_quiet_s")

    def __init__(self, quiet_s: float = BURST_QUIET_S, history: int = CADENCE_HISTORY) -> None:
        if not quiet_s > 0 or history < 1:
            raise ValueError("quiet_s must be > 0 and history >= 1")
        self._quiet_s = quiet_s
        self._history = history
        self._last_ack: float | None = None
        # Closed bursts as [start, bytes], checkpoints and small ones alike: the last BURST_WINDOW.
        self._bursts: deque[list[float]] = deque(maxlen=BURST_WINDOW)
        self._current: list[float] | None = None  # the burst still open

    def observe_ack(self, at: float, nbytes: int = 1) -> None:
        """The spool acknowledged ``nbytes`` at ``at`` (any clock, as long as it is the same one throughout;
        a time before the last one is taken as the last one). Several acknowledgements may be reported at
        once, as one call with their bytes summed."""
        last = self._last_ack
        if last is not None:
            at = max(at, last)
        if self._current is None or last is None or at - last >= self._quiet_s:
            if self._current is not None:
                self._bursts.append(self._current)
            self._current = [at, 0.0]
        self._current[1] += max(0, nbytes)
        self._last_ack = at

    def _threshold(self) -> float:
        sizes = [b[1] for b in self._bursts]
        if self._current is not None:
            sizes.append(self._current[1])
        return BURST_MIN_FRACTION * max(sizes, default=0.0)

    def _starts(self) -> list[float]:
        """Start times of the recent checkpoint bursts, the open one included once it is large enough."""
        threshold = self._threshold()
        s = [b[0] for b in self._bursts if b[1] >= threshold]
        if self._current is not None and self._current[1] >= threshold:
            s.append(self._current[0])
        return s[-(self._history + 1) :]

    @property
    def bursts_seen(self) -> int:
        """Recent checkpoint bursts remembered (at most ``history + 1``)."""
        return len(self._starts())

    @property
    def interval_s(self) -> float | None:
        """The median interval between recent checkpoint bursts; None before two (or for a cadence under
        :data:`MIN_CADENCE_S`, which is a steady writer, not checkpoints)."""
        s = self._starts()
        if len(s) < 2:
            return None
        interval = statistics.median(b - a for a, b in itertools.pairwise(s))
        return interval if interval >= MIN_CADENCE_S else None

    def deadline_s(self, max_age_s: float | None) -> float:
        """The deadline in force: ``max_age_s`` when set; else the cadence, at most
        :data:`DEFAULT_MAX_AGE_S` (that alone while no cadence is known)."""
        if max_age_s is not None:
            return max_age_s
        interval = self.interval_s
        return DEFAULT_MAX_AGE_S if interval is None else min(DEFAULT_MAX_AGE_S, interval)
