"""Scheduler.submit_fast, the fast path of an uncontended scheduler: it is taken when nothing is queued and
the lane has budget, not when a lane is queued, and it grants exactly what submit() and pull() would have
(same tickets, same state afterwards), so the lanes' guarantees are the slow path's."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3lanes.config import Config
from s3lanes.core.scheduler import Grant, Scheduler, SchedulerConfig, _Ticket
from s3lanes.runtime.wiring import scheduler_config
from tests.budget import examples

MiB = 1024 * 1024
C = 20_000_000.0  # a slow store: the buckets and the window run dry within a few tickets
T0 = 1000.0
LANES = ("dataset", "checkpoint", "restore", "metadata")


def cfg(**kw: Any) -> SchedulerConfig:
    return replace(scheduler_config(Config(), C), **{"burst_bytes": MiB, **kw})


def state(x: Any, depth: int = 0) -> Any:
    """Everything a scheduler holds, as plain values (tickets by id and state), for an equality check."""
    if isinstance(x, _Ticket):
        return ("ticket", x.id, x.cost, x.state.name, x.reserved, x.lane.spec.name)
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, (int, float, str, bool, type(None))):
        return x
    if isinstance(x, (list, tuple, deque)):
        return tuple(state(v, depth + 1) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, state(v, depth + 1)) for k, v in x.items()))
    assert depth < 8, type(x)
    names = [n for c in type(x).__mro__ for n in getattr(c, "__slots__", ())]
    fields = {n: getattr(x, n) for n in names if hasattr(x, n)}
    fields.update(getattr(x, "__dict__", {}))
    fields.pop("spec", None)
    fields.pop("_cfg", None)
    fields.pop("_by_name", None)
    fields.pop("_read_lanes", None)
    return (type(x).__name__, tuple(sorted((k, state(v, depth + 1)) for k, v in fields.items())))


def pump(s: Scheduler, now: float) -> list[int]:
    granted = []
    while isinstance(d := s.pull(now), Grant):
        granted.append(d.ticket)
    return granted


def test_an_uncontended_lane_is_granted_in_the_submitting_call() -> None:
    s = Scheduler(cfg(), T0)
    ticket, granted = s.submit_fast("dataset", 64 * 1024, T0)
    assert granted
    assert s.snapshot(T0).lane("dataset").inflight_tickets == 1
    assert s.snapshot(T0).lane("dataset").queued_tickets == 0
    s.complete(ticket, T0)
    assert s.snapshot(T0).inflight_tickets == 0


def test_the_fast_path_is_not_taken_while_a_lane_is_queued() -> None:
    # A checkpoint ticket is held (its lane's concurrency is used up): a newcomer on another lane, which
    # would have budget, still goes through pull() and its ordering, behind nobody it could overtake unseen.
    s = Scheduler(cfg(lanes=tuple(replace(x, max_concurrency=1) for x in cfg().lanes)), T0)
    first, granted = s.submit_fast("checkpoint", 4096, T0)
    assert granted
    held, granted = s.submit_fast("checkpoint", 4096, T0)
    assert not granted  # its lane's concurrency: queued as submit() leaves it
    assert s.snapshot(T0).lane("checkpoint").queued_tickets == 1
    other, granted = s.submit_fast("metadata", 4096, T0)
    assert not granted  # somebody is queued: no fast path, even with budget at hand
    assert pump(s, T0) == [other]  # ... and pull() serves it as before
    s.complete(first, T0)
    assert pump(s, T0) == [held]


def test_a_lane_without_budget_is_queued_not_granted() -> None:
    s = Scheduler(cfg(), T0)
    # The capacity bucket (one MiB deep) is emptied by a write lane's tickets; the next one waits.
    tickets = []
    for _ in range(100):
        t, granted = s.submit_fast("checkpoint", 512 * 1024, T0)
        if not granted:
            break
        tickets.append(t)
    assert 0 < len(tickets) < 100
    assert s.snapshot(T0).lane("checkpoint").queued_tickets == 1
    assert not isinstance(s.pull(T0), Grant)


_op = st.tuples(
    st.sampled_from(("submit", "submit", "submit", "complete", "cancel", "read", "time")),
    st.sampled_from(LANES),
    st.sampled_from((0, 1, 4096, 64 * 1024, 512 * 1024, 2 * MiB)),
    st.sampled_from((0.0, 0.0, 0.001, 0.02, 0.3, 2.5)),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(_op, min_size=1, max_size=80),
    window=st.sampled_from((None, 3 * MiB)),
    requests=st.sampled_from((None, 3)),
)
def test_submit_fast_grants_exactly_what_submit_and_pull_grant(
    ops: list[tuple[str, str, int, float]], window: int | None, requests: int | None
) -> None:
    # Two schedulers driven as the dispatcher drives them (pull until no grant after every change), one
    # through the fast path: the same tickets are granted at the same instants and every internal value
    # (tags, buckets, windows, read activity, guard) is the same after every step.
    c = cfg(inflight_bytes_max=window, inflight_requests_max=requests)
    slow, fast = Scheduler(c, T0), Scheduler(c, T0)
    now = T0
    granted: list[int] = []
    waiting: list[int] = []
    fast_taken = 0
    for kind, lane, cost, dt in ops:
        now += dt
        if kind == "submit":
            t1 = slow.submit(lane, cost, now)
            g1 = pump(slow, now)
            t2, took = fast.submit_fast(lane, cost, now)
            g2 = [t2] if took else pump(fast, now)
            fast_taken += took
            assert t1 == t2
            if took:
                assert g1 == [t1]  # a fast grant is one the slow path makes at once, of that ticket alone
        elif kind == "complete" and granted:
            t = granted.pop(0)
            slow.complete(t, now, bytes_done=cost % 3 * 1000)
            fast.complete(t, now, bytes_done=cost % 3 * 1000)
            g1, g2 = pump(slow, now), pump(fast, now)
        elif kind == "cancel" and waiting:
            t = waiting.pop()
            slow.cancel(t, now)
            fast.cancel(t, now)
            g1, g2 = pump(slow, now), pump(fast, now)
        elif kind == "read":
            slow.observe_read(lane, dt, 0.5 if cost > MiB else 0.01, now)
            fast.observe_read(lane, dt, 0.5 if cost > MiB else 0.01, now)
            g1, g2 = pump(slow, now), pump(fast, now)
        else:
            g1, g2 = pump(slow, now), pump(fast, now)
        assert g1 == g2
        if kind == "submit" and t1 not in g1:
            waiting.append(t1)
        waiting = [t for t in waiting if t not in g1]
        granted += g1
        assert state(slow) == state(fast)


def test_a_paced_lane_over_its_window_share_while_reads_are_active_is_queued() -> None:
    s = Scheduler(cfg(inflight_bytes_max=4 * MiB), T0)
    _, granted = s.submit_fast("dataset", 2 * MiB, T0)  # reads become active; this one stays in flight
    assert granted and s.snapshot(T0).reads_active
    _, granted = s.submit_fast("checkpoint", MiB, T0)  # its first: within the window share (0.3 x 4 MiB)
    assert granted
    _, granted = s.submit_fast("checkpoint", 512 * 1024, T0)  # would hold more than its share: waits
    assert not granted
    assert not isinstance(s.pull(T0), Grant)
