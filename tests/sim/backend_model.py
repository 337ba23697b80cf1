"""A fluid model of an object store shared by many flows (anchors-scheduler.md §8.2).

- **Capacity** ``C(t)`` in bytes/s, piecewise constant (``capacity_steps``), shared by the flows in service
  by processor sharing, each flow also capped at ``per_flow_bps`` (one connection's rate), so concurrency
  matters. Rates are recomputed only when a flow starts or ends or the capacity steps; all flows in service
  get the same rate, so one "attained service" counter and a heap of finish points replace per-flow state.
- **Time to first byte** ``t0 * (1 + k * rho / (1 - rho))`` times lognormal noise, ``rho`` the utilisation
  (an exponential average of delivered/C over ``rho_tau_s``, clipped at 0.99): the latency knee the guard
  has to find.
- **Hidden queue**: at most ``service_slots`` operations are served at once; more wait inside the store,
  first come first served, and that wait is part of their TTFB. A scheduler that lets the queue form here
  has given up choosing the order.
- **SlowDown**: a per-prefix GCRA request limit (``prefix_limit_rps``) and fault windows answer 503 at a
  request's start, before any byte moves.

A *chunk* is one operation: reads and writes move their bytes chunk by chunk, each granted by the gateway's
scheduler, the first chunk of a request pays the TTFB. Delivered bytes are attributed to their lane and to
0.1 s bins continuously (fluid), which is what the share assertions measure.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tests.sim.des import Simulator, Timer

BIN_S = 0.1


@dataclass(frozen=True, slots=True)
class BackendParams:
    capacity_steps: tuple[tuple[float, float], ...]  # (from time s, bytes/s), the first at 0.0
    per_flow_bps: float = 100e6
    service_slots: int | None = 64
    t0_s: float = 0.002
    knee_k: float = 0.05
    noise_sigma: float = 0.1
    rho_tau_s: float = 0.1
    prefix_limit_rps: float | None = None  # request starts per second per prefix (None: no limit)
    prefix_burst: int = 50
    faults: tuple[tuple[float, float, str, float], ...] = ()  # (from, to, lane, probability of 503)

    def capacity_at(self, t: float) -> float:
        c = self.capacity_steps[0][1]
        for at, v in self.capacity_steps:
            if at <= t:
                c = v
        return c


class Meter:
    """Per-lane bytes per 0.1 s bin (delivered fluidly, or granted as they are granted)."""

    def __init__(self, lanes: Sequence[str], horizon_s: float) -> None:
        self.n_bins = math.ceil(horizon_s / BIN_S) + 2
        self.bins: dict[str, list[float]] = {lane: [0.0] * self.n_bins for lane in lanes}

    def add_span(self, lane: str, t0: float, t1: float, nbytes: float) -> None:
        if nbytes <= 0:
            return
        row = self.bins[lane]
        if t1 <= t0:
            row[min(int(t0 / BIN_S), self.n_bins - 1)] += nbytes
            return
        rate = nbytes / (t1 - t0)
        t = t0
        while t < t1:
            b = int(t / BIN_S + 1e-12)
            end = min(t1, (b + 1) * BIN_S)
            if end <= t:  # float edge
                end = min(t1, t + 1e-9)
            row[min(b, self.n_bins - 1)] += rate * (end - t)
            t = end

    def add_at(self, lane: str, t: float, nbytes: float) -> None:
        self.bins[lane][min(int(t / BIN_S), self.n_bins - 1)] += nbytes

    def window(self, lane: str, t0: float, t1: float) -> float:
        """Bytes in [t0, t1) (bin-aligned)."""
        return sum(self.bins[lane][round(t0 / BIN_S) : round(t1 / BIN_S)])


@dataclass(slots=True)
class _Op:
    seq: int
    lane: str
    nbytes: int
    first: bool
    on_first_byte: Callable[[float], None] | None
    on_done: Callable[[int, int], None]
    issued_at: float
    finish_at: float = 0.0  # attained-service mark at which the transfer completes
    timer: Timer | None = None
    in_flow: bool = False
    holds_slot: bool = False
    refused: bool = False
    aborted: bool = False


class Backend:
    """The store. ``request`` starts one operation (a chunk); ``abort`` drops one mid-flight."""

    def __init__(self, sim: Simulator, params: BackendParams, lanes: Sequence[str], horizon_s: float) -> None:
        self.sim = sim
        self.p = params
        self.capacity_bps = params.capacity_at(0.0)
        self.delivered = Meter(lanes, horizon_s)
        self.delivered_total: dict[str, float] = dict.fromkeys(lanes, 0.0)
        self.requests_started: dict[str, int] = dict.fromkeys(lanes, 0)
        self.slowdowns: dict[str, int] = dict.fromkeys(lanes, 0)
        self.max_hidden_queue = 0
        self._rng = sim.rng("backend")
        self._seq = 0
        self._busy_slots = 0
        self._hidden: deque[_Op] = deque()
        self._flows: list[tuple[float, int, _Op]] = []  # heap by finish mark
        self._n_flows = 0
        self._lane_flows: dict[str, int] = dict.fromkeys(lanes, 0)
        self._attained = 0.0
        self._rate = 0.0
        self._updated_at = 0.0
        self._rho = 0.0
        self._util = 0.0
        self._version = 0
        self._prefix_tat: dict[str, float] = {}
        for at, c in params.capacity_steps[1:]:
            sim.at(at, self._set_capacity, c)

    # -- operations -------------------------------------------------------------------------------------

    def request(
        self,
        lane: str,
        nbytes: int,
        *,
        first: bool,
        prefix: str,
        on_first_byte: Callable[[float], None] | None,
        on_done: Callable[[int, int], None],
    ) -> _Op:
        """Start an operation. ``on_first_byte(ttfb_s)`` for a request's first chunk; ``on_done(status,
        delivered_bytes)`` at the end (503 before any byte if the prefix limit or a fault window says so)."""
        self._seq += 1
        op = _Op(self._seq, lane, nbytes, first, on_first_byte, on_done, self.sim.now)
        if first and self._refuse(lane, prefix):
            self.slowdowns[lane] += 1
            op.refused = True
            op.timer = self.sim.after(self.p.t0_s, self._finish_refused, op)
            return op
        if first:
            self.requests_started[lane] += 1
        if self.p.service_slots is not None and self._busy_slots >= self.p.service_slots:
            self._hidden.append(op)
            self.max_hidden_queue = max(self.max_hidden_queue, len(self._hidden))
        else:
            self._serve(op)
        return op

    def abort(self, op: _Op) -> int:
        """The client went away: drop the operation; returns the bytes it had delivered."""
        if op.aborted:
            return 0
        op.aborted = True
        delivered = 0
        if op.timer is not None:
            op.timer.cancel()
        if op.in_flow:
            self._advance()
            delivered = int(op.nbytes - max(0.0, op.finish_at - self._attained))
            op.in_flow = False
            self._n_flows -= 1
            self._lane_flows[op.lane] -= 1
            self._release_slot(op)
            self._reschedule()
        elif op.holds_slot:
            self._release_slot(op)  # it was waiting for its first byte
        elif op in self._hidden:
            self._hidden.remove(op)
        return delivered

    def utilisation(self) -> float:
        self._advance()
        return self._rho

    # -- internals --------------------------------------------------------------------------------------

    def _refuse(self, lane: str, prefix: str) -> bool:
        now = self.sim.now
        for t_from, t_to, f_lane, prob in self.p.faults:
            if t_from <= now < t_to and f_lane == lane and self._rng.random() < prob:
                return True
        rps = self.p.prefix_limit_rps
        if rps is None:
            return False
        interval = 1.0 / rps
        tat = max(self._prefix_tat.get(prefix, now), now)
        if tat - now > self.p.prefix_burst * interval:
            return True
        self._prefix_tat[prefix] = tat + interval
        return False

    def _finish_refused(self, op: _Op) -> None:
        op.timer = None
        if not op.aborted:
            op.on_done(503, 0)

    def _serve(self, op: _Op) -> None:
        self._busy_slots += 1
        op.holds_slot = True
        if op.first:
            rho = min(self.utilisation(), 0.99)
            ttfb = self.p.t0_s * (1.0 + self.p.knee_k * rho / (1.0 - rho))
            ttfb *= math.exp(self._rng.gauss(0.0, self.p.noise_sigma))
            op.timer = self.sim.after(ttfb, self._first_byte, op)
        else:
            self._join(op)

    def _first_byte(self, op: _Op) -> None:
        op.timer = None
        if op.on_first_byte is not None:
            op.on_first_byte(self.sim.now - op.issued_at)
        if op.aborted:
            return
        self._join(op)

    def _join(self, op: _Op) -> None:
        if op.nbytes <= 0:
            self._release_slot(op)
            op.on_done(200, 0)
            return
        self._advance()
        op.in_flow = True
        op.finish_at = self._attained + op.nbytes
        heapq.heappush(self._flows, (op.finish_at, op.seq, op))
        self._n_flows += 1
        self._lane_flows[op.lane] += 1
        self._reschedule()

    def _release_slot(self, op: _Op) -> None:
        op.holds_slot = False
        self._busy_slots -= 1
        while self._hidden and (self.p.service_slots is None or self._busy_slots < self.p.service_slots):
            self._serve(self._hidden.popleft())

    def _advance(self) -> None:
        now = self.sim.now
        dt = now - self._updated_at
        if dt <= 0:
            return
        if self._n_flows:
            self._attained += self._rate * dt
            per_lane = self._rate * dt
            t0 = self._updated_at
            for lane, n in self._lane_flows.items():
                if n:
                    self.delivered.add_span(lane, t0, now, n * per_lane)
                    self.delivered_total[lane] += n * per_lane
        decay = math.exp(-dt / self.p.rho_tau_s)
        self._rho = self._util + (self._rho - self._util) * decay
        self._updated_at = now

    def _recompute_rate(self) -> None:
        n = self._n_flows
        self._rate = min(self.p.per_flow_bps, self.capacity_bps / n) if n else 0.0
        self._util = min(1.0, n * self._rate / self.capacity_bps) if n else 0.0

    def _reschedule(self) -> None:
        self._recompute_rate()
        self._version += 1
        while self._flows and not self._flows[0][2].in_flow:
            heapq.heappop(self._flows)  # aborted
        if self._flows:
            mark = self._flows[0][0]
            dt = max(0.0, (mark - self._attained) / self._rate)
            self.sim.after(dt, self._on_flow_done, self._version)

    def _on_flow_done(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        done: list[_Op] = []
        while self._flows and self._flows[0][0] <= self._attained + 1e-3:
            _, _, op = heapq.heappop(self._flows)
            if not op.in_flow:
                continue
            op.in_flow = False
            self._n_flows -= 1
            self._lane_flows[op.lane] -= 1
            done.append(op)
        for op in done:
            op.holds_slot = False
            self._busy_slots -= 1
        while self._hidden and (self.p.service_slots is None or self._busy_slots < self.p.service_slots):
            self._serve(self._hidden.popleft())
        self._reschedule()
        for op in done:
            op.on_done(200, op.nbytes)

    def _set_capacity(self, c: float) -> None:
        self._advance()
        self.capacity_bps = c
        self._reschedule()
