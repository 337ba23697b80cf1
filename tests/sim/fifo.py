"""The baseline: first come, first served, behind the scheduler's interface and the same in-flight window.

What a gateway without lanes does. It is work conserving and honours the backend window, but it has no
notion of shares, caps or read latency: tickets leave in arrival order, so each lane gets bandwidth in
proportion to how many streams it has queued, and a read waits behind every write chunk ahead of it.
"""

from __future__ import annotations

from collections import deque

from s3lanes.core.scheduler import Grant, Idle, SchedulerConfig, WaitUntil


class FifoScheduler:
    def __init__(self, cfg: SchedulerConfig, now: float) -> None:
        self._cfg = cfg
        self._lanes = {lane.name for lane in cfg.lanes}
        self._queue: deque[tuple[int, str, int]] = deque()
        self._waiting: set[int] = set()
        self._granted: dict[int, tuple[str, int]] = {}
        self._next = 1
        self.inflight_bytes = 0
        self.granted_bytes_total: dict[str, int] = dict.fromkeys(self._lanes, 0)
        self.done_bytes_total: dict[str, int] = dict.fromkeys(self._lanes, 0)

    def submit(self, lane: str, cost_bytes: int, now: float) -> int:
        if lane not in self._lanes:
            raise KeyError(lane)
        t = self._next
        self._next += 1
        self._queue.append((t, lane, cost_bytes))
        self._waiting.add(t)
        return t

    def pull(self, now: float) -> Grant | WaitUntil | Idle:
        while self._queue and self._queue[0][0] not in self._waiting:
            self._queue.popleft()
        if not self._queue:
            return Idle()
        t, lane, cost = self._queue[0]
        win_b, win_r = self._cfg.inflight_bytes_max, self._cfg.inflight_requests_max
        if self._granted and (
            (win_b is not None and self.inflight_bytes + cost > win_b)
            or (win_r is not None and len(self._granted) >= win_r)
        ):
            return Idle()
        self._queue.popleft()
        self._waiting.discard(t)
        self._granted[t] = (lane, cost)
        self.inflight_bytes += cost
        self.granted_bytes_total[lane] += cost
        return Grant(ticket=t, lane=lane, cost_bytes=cost)

    def cancel(self, ticket: int, now: float) -> None:
        if ticket in self._waiting:
            self._waiting.discard(ticket)
        elif ticket in self._granted:
            self.complete(ticket, now, bytes_done=0)

    def complete(self, ticket: int, now: float, *, bytes_done: int | None = None) -> None:
        entry = self._granted.pop(ticket, None)
        if entry is not None:
            lane, cost = entry
            self.inflight_bytes -= cost
            self.done_bytes_total[lane] += cost if bytes_done is None else bytes_done

    def observe_read(self, lane: str, wait_s: float, ttfb_s: float, now: float) -> None:
        pass

    def observe_backend(self, lane: str, status: int, now: float) -> None:
        pass

    def observe_delivered(self, lane: str, nbytes: int, now: float) -> None:
        pass

    @property
    def inflight_tickets(self) -> int:
        return len(self._granted)

    @property
    def queued_tickets(self) -> int:
        return len(self._waiting)
