"""Clients of the simulated gateway, driving the scheduler exactly as the async shell does.

:class:`SimShell` mirrors ``s3lanes.runtime.dispatcher.LaneDispatcher``: submit a ticket (granted in the same
call on an uncontended scheduler, ``Scheduler.submit_fast``), else pull until the answer is not a grant, wake
the granted waiters (one event later, as a resolved future resumes its coroutine on a later loop iteration),
keep a single timer for ``WaitUntil``. A :class:`Stream` is one request: it asks for ~1 MiB of budget at a
time (the first ticket also carries the per-request cost), moves that chunk through the backend model,
completes the ticket, and reports what the shell would report (``observe_read`` for a read's first byte,
``observe_delivered``, ``observe_backend`` for errors). Streams can be cancelled mid-flight, as a client
disconnect would: a waiting ticket is cancelled, an in-flight chunk is aborted at the backend and its ticket
completed with the bytes it had moved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from s3lanes.core.scheduler import Grant, Idle, WaitUntil
from tests.sim.backend_model import Backend, Meter, _Op
from tests.sim.des import Simulator, Timer

CHUNK_BYTES = 1024 * 1024
_SMOOTH_SHAPE = 8.0
OpKind = Literal["read", "write", "meta"]


class SchedulerLike(Protocol):
    def submit(self, lane: str, cost_bytes: int, now: float) -> int: ...
    def pull(self, now: float) -> Grant | WaitUntil | Idle: ...
    def cancel(self, ticket: int, now: float) -> None: ...
    def complete(self, ticket: int, now: float, *, bytes_done: int | None = None) -> None: ...
    def observe_read(self, lane: str, wait_s: float, ttfb_s: float, now: float) -> None: ...
    def observe_backend(self, lane: str, status: int, now: float) -> None: ...
    def observe_delivered(self, lane: str, nbytes: int, now: float) -> None: ...


class SimShell:
    def __init__(self, sim: Simulator, sched: SchedulerLike, granted: Meter) -> None:
        self.sim = sim
        self.sched = sched
        self.granted = granted
        self.granted_cost: dict[str, int] = {}
        self.used: dict[str, int] = {}  # what completions reported as used
        self.refunded: dict[str, int] = {}  # the rest of what was granted, given back
        self._granted: dict[int, tuple[str, int]] = {}
        self.pulls = 0
        self.fast_grants = 0  # granted by Scheduler.submit_fast, as the dispatcher's fast path
        self.timer_wakeups = 0
        self._waiters: dict[int, Callable[[int], None]] = {}
        self._timer: Timer | None = None
        self._timer_at = 0.0

    def acquire(self, lane: str, cost_bytes: int, on_grant: Callable[[int], None]) -> int:
        submit_fast = cast(
            "Callable[[str, int, float], tuple[int, bool]] | None", getattr(self.sched, "submit_fast", None)
        )
        if submit_fast is None:  # a baseline scheduler without the fast path
            ticket = self.sched.submit(lane, cost_bytes, self.sim.now)
        else:
            ticket, granted = submit_fast(lane, cost_bytes, self.sim.now)
            if granted:
                self.fast_grants += 1
                self._record_grant(ticket, lane, cost_bytes, on_grant)
                return ticket
        self._waiters[ticket] = on_grant
        self.pump()
        return ticket

    def cancel_wait(self, ticket: int) -> None:
        self._waiters.pop(ticket, None)
        self.sched.cancel(ticket, self.sim.now)
        self.pump()

    def release(self, ticket: int, bytes_done: int | None = None) -> None:
        self._settle(ticket, bytes_done)
        self.sched.complete(ticket, self.sim.now, bytes_done=bytes_done)
        self.pump()

    def abort(self, ticket: int) -> None:
        """A granted ticket whose request died before moving a byte: cancel() releases everything."""
        self._settle(ticket, 0)
        self.sched.cancel(ticket, self.sim.now)
        self.pump()

    def _settle(self, ticket: int, bytes_done: int | None) -> None:
        lane, cost = self._granted.pop(ticket)
        used = cost if bytes_done is None else min(cost, bytes_done)
        self.used[lane] = self.used.get(lane, 0) + used
        self.refunded[lane] = self.refunded.get(lane, 0) + cost - used

    @property
    def outstanding(self) -> int:
        """Granted tickets not yet completed, as the shell sees them."""
        return len(self._granted)

    def pump(self) -> None:
        now = self.sim.now
        while True:
            self.pulls += 1
            d = self.sched.pull(now)
            if isinstance(d, Grant):
                cb = self._waiters.pop(d.ticket, None)
                if cb is None:
                    self.sched.cancel(d.ticket, now)
                    continue
                self._record_grant(d.ticket, d.lane, d.cost_bytes, cb)
                continue
            if isinstance(d, WaitUntil):
                assert d.at > now, f"WaitUntil({d.at}) is not in the future of {now}"
                if self._timer is None or self._timer.cancelled or self._timer_at > d.at:
                    if self._timer is not None:
                        self._timer.cancel()
                    self._timer = self.sim.at(d.at, self._on_timer)
                    self._timer_at = d.at
            elif self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return

    def _record_grant(self, ticket: int, lane: str, cost_bytes: int, cb: Callable[[int], None]) -> None:
        now = self.sim.now
        self.granted.add_at(lane, now, cost_bytes)
        self.granted_cost[lane] = self.granted_cost.get(lane, 0) + cost_bytes
        self._granted[ticket] = (lane, cost_bytes)
        self.sim.trace("grant", ticket, lane, cost_bytes)
        self.sim.after(0.0, cb, ticket)

    def _on_timer(self) -> None:
        self._timer = None
        self.timer_wakeups += 1
        self.pump()


@dataclass(slots=True)
class ReadSample:
    at: float
    lane: str
    wait_s: float
    ttfb_s: float


class Context:
    """What every stream needs: the simulator, the shell, the backend, the recorders."""

    def __init__(
        self, sim: Simulator, shell: SimShell, backend: Backend, request_cost_bytes: int, t0_s: float
    ) -> None:
        self.sim = sim
        self.shell = shell
        self.sched = shell.sched
        self.backend = backend
        self.request_cost_bytes = request_cost_bytes
        self.reads: list[ReadSample] = []
        self.bytes_done: dict[str, int] = {}
        self.streams_started = 0
        self.streams_cancelled = 0
        self.streams_finished = 0
        self.slowdown_retries = 0
        self.active_streams = 0
        self.rng = sim.rng("streams")
        # Progress: per lane, the longest time a stream waited between two of its grants (or from its start
        # to its first), over streams still running at the time.
        self.max_gap_s: dict[str, float] = {}


class Stream:
    """One S3 request moving ``nbytes`` on ``lane`` chunk by chunk (``meta``: no body, request cost only)."""

    __slots__ = (
        "chunk",
        "ctx",
        "cur_cost",
        "cur_data",
        "first",
        "first_wait_s",
        "kind",
        "lane",
        "on_end",
        "op",
        "prefix",
        "remaining",
        "state",
        "t_progress",
        "t_submit",
        "ticket",
    )

    def __init__(
        self,
        ctx: Context,
        lane: str,
        kind: OpKind,
        nbytes: int,
        prefix: str,
        on_end: Callable[[Stream, bool], None] | None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.ctx = ctx
        self.chunk = chunk_bytes
        self.t_progress = 0.0
        self.lane = lane
        self.kind = kind
        self.remaining = nbytes if kind != "meta" else 0
        self.prefix = prefix
        self.on_end = on_end
        self.first = True
        self.state = "new"
        self.ticket = 0
        self.op: _Op | None = None
        self.cur_cost = 0
        self.cur_data = 0
        self.t_submit = 0.0
        self.first_wait_s = 0.0

    def start(self) -> None:
        self.ctx.streams_started += 1
        self.ctx.active_streams += 1
        self.t_progress = self.ctx.sim.now
        self._next()

    def _next(self) -> None:
        if self.state in ("cancelled", "done"):
            return
        data = min(self.chunk, self.remaining)
        self.cur_data = data
        self.cur_cost = data + (self.ctx.request_cost_bytes if self.first else 0)
        self.t_submit = self.ctx.sim.now
        self.state = "waiting"
        self.ticket = self.ctx.shell.acquire(self.lane, self.cur_cost, self._granted)

    def _granted(self, ticket: int) -> None:
        if self.state != "waiting" or ticket != self.ticket:
            return
        now = self.ctx.sim.now
        self.state = "inflight"
        gaps = self.ctx.max_gap_s
        gaps[self.lane] = max(gaps.get(self.lane, 0.0), now - self.t_progress)
        self.t_progress = now
        if self.first:
            self.first_wait_s = now - self.t_submit
        fb = self._first_byte if (self.first and self.kind == "read") else None
        self.op = self.ctx.backend.request(
            self.lane,
            self.cur_data,
            first=self.first,
            prefix=self.prefix,
            on_first_byte=fb,
            on_done=self._done,
        )

    def _first_byte(self, ttfb_s: float) -> None:
        if self.state != "inflight":
            return
        now = self.ctx.sim.now
        self.ctx.reads.append(ReadSample(now, self.lane, self.first_wait_s, ttfb_s))
        self.ctx.sched.observe_read(self.lane, self.first_wait_s, ttfb_s, now)

    def _used(self, data_bytes: int) -> int:
        return data_bytes + (self.ctx.request_cost_bytes if self.first else 0)

    def _done(self, status: int, delivered: int) -> None:
        if self.state != "inflight":
            return
        ctx = self.ctx
        now = ctx.sim.now
        self.op = None
        if delivered:
            ctx.sched.observe_delivered(self.lane, delivered, now)
        if status != 200:
            ctx.sched.observe_backend(self.lane, status, now)
            # Refused before the request started: nothing was used, the budget goes back.
            ctx.shell.release(self.ticket, bytes_done=0)
            ctx.slowdown_retries += 1
            self.state = "backoff"
            backoff = ctx.rng.uniform(0.0, 0.05)
            ctx.sim.after(backoff, self._retry)
            return
        used = self._used(delivered)
        ctx.bytes_done[self.lane] = ctx.bytes_done.get(self.lane, 0) + used
        ctx.shell.release(self.ticket, bytes_done=used)
        self.remaining -= self.cur_data
        self.first = False
        if self.remaining > 0:
            self._next()
        else:
            self._end(cancelled=False)

    def _retry(self) -> None:
        if self.state == "backoff":
            self._next()

    def cancel(self) -> None:
        """The client disconnected."""
        ctx = self.ctx
        if self.state == "waiting":
            ctx.shell.cancel_wait(self.ticket)
        elif self.state == "inflight":
            assert self.op is not None
            delivered = ctx.backend.abort(self.op)
            if delivered:
                ctx.sched.observe_delivered(self.lane, delivered, ctx.sim.now)
            op = self.op
            self.op = None
            used = delivered + (ctx.request_cost_bytes if self.first and not op.refused else 0)
            if used:
                ctx.bytes_done[self.lane] = ctx.bytes_done.get(self.lane, 0) + used
                ctx.shell.release(self.ticket, bytes_done=used)
            else:
                ctx.shell.abort(self.ticket)
        elif self.state not in ("backoff", "new"):
            return
        ctx.streams_cancelled += 1
        self._end(cancelled=True)

    def _end(self, *, cancelled: bool) -> None:
        self.state = "cancelled" if cancelled else "done"
        self.ctx.active_streams -= 1
        if not cancelled:
            self.ctx.streams_finished += 1
        if self.on_end is not None:
            self.on_end(self, cancelled)


# -- client populations ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """``open``: Poisson arrivals of requests at ``rate_bps`` (objects of ``object_bytes``); ``closed``:
    ``streams`` requests always outstanding (backlogged), each followed at once by the next."""

    lane: str
    kind: OpKind
    mode: Literal["open", "closed"]
    object_bytes: int
    start_s: float
    stop_s: float
    rate_bps: float = 0.0
    rate_ops: float = 0.0  # open-loop metadata: operations per second
    streams: int = 0
    prefix: str = "p0"
    cancel_prob: float = 0.0  # probability that a request is abandoned mid-flight
    # Open-loop interarrival times: "poisson" (exponential, CV 1) or "smooth" (gamma, shape 8, CV 0.35).
    # At 10 GB/s a 100 ms window holds ~1000 sample reads and their count varies by ~3%; at this model's
    # 400 MB/s it holds ~24, and Poisson arrivals would make it vary by 20%, a burstiness the real
    # aggregate does not have. "smooth" restores the relative smoothness of the full-scale system.
    arrival: Literal["poisson", "smooth"] = "smooth"
    chunk_bytes: int = CHUNK_BYTES  # budget asked for (and moved) at a time: a paced lane's piece


class Population:
    def __init__(self, ctx: Context, spec: ClientSpec, index: int) -> None:
        self.ctx = ctx
        self.spec = spec
        self.rng = ctx.sim.rng(f"client/{index}/{spec.lane}/{spec.kind}")
        ctx.sim.at(spec.start_s, self._begin)

    def _begin(self) -> None:
        s = self.spec
        if s.mode == "open":
            self._arrive()
        else:
            for _ in range(s.streams):
                self._spawn()

    def _arrive(self) -> None:
        s = self.spec
        if self.ctx.sim.now >= s.stop_s:
            return
        self._spawn()
        rate = s.rate_ops if s.kind == "meta" else s.rate_bps / s.object_bytes
        if s.arrival == "poisson":
            gap = self.rng.expovariate(rate)
        else:
            gap = self.rng.gammavariate(_SMOOTH_SHAPE, 1.0 / (_SMOOTH_SHAPE * rate))
        self.ctx.sim.after(gap, self._arrive)

    def _spawn(self) -> None:
        s = self.spec
        on_end = self._closed_next if s.mode == "closed" else None
        st = Stream(self.ctx, s.lane, s.kind, s.object_bytes, s.prefix, on_end, s.chunk_bytes)
        st.start()
        if s.cancel_prob > 0 and self.rng.random() < s.cancel_prob:
            # Abandon it somewhere in its expected life (a chunk at ~per-flow speed, plus queueing).
            chunks = max(1, s.object_bytes // CHUNK_BYTES)
            self.ctx.sim.after(self.rng.uniform(0.0, chunks * 0.02), st.cancel)

    def _closed_next(self, stream: Stream, cancelled: bool) -> None:
        if self.ctx.sim.now < self.spec.stop_s:
            self._spawn()
