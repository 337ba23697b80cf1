"""Several workers of one node: the progress floor (every stream of a lane moves at least one piece per
``progress_interval_s`` while the lane is paced for the reads) stays per worker, and that is the node's:
it is one round of the lane's queue, and each worker's queue holds the streams whose connections landed
on it, so the workers' floors add up to one round of the node's streams, what one gateway with all of
them would give, not N times it. Simulated: two workers' schedulers on one fake clock (test_node_lanes)."""

from __future__ import annotations

from collections import Counter

import pytest

from s3lanes.core.scheduler import PROGRESS_HEADROOM
from tests.core.test_node_guard import FAST_S, SLOW_S
from tests.core.test_node_lanes import CFG, PIECE, C, _Node

STREAMS = 16


def _cut_writes(writers: dict[str, int]) -> tuple[list[Counter[str]], _Node]:
    """Readers on n.w0 missing their target (the node's guard cuts), ``writers``: worker -> streams."""
    node = _Node({"n.w0": {"dataset"}} | {w: {"checkpoint"} for w in writers})
    node.depth = dict(writers)
    node.read_ttfb_s["n.w0"] = FAST_S
    node.seconds(4)
    node.read_ttfb_s["n.w0"] = SLOW_S
    node.seconds(1)  # the guard cuts (it lets go again after ~4 s: the slow reads become its baseline)
    return node.seconds(3), node


def test_the_progress_floor_of_the_workers_adds_up_to_one_round_of_the_nodes_streams() -> None:
    interval = CFG.progress_interval_s
    assert interval is not None
    round_bps = STREAMS * PIECE * PROGRESS_HEADROOM / interval  # one round of 16 streams: 2.6 % of C
    assert round_bps > 0.02 * C  # above the lane's 2 % floor: the progress floor is what holds it
    one, node = _cut_writes({"n.w1": STREAMS})
    assert node.workers["n.w1"][0].snapshot(node.now).node_guard_multiplier < 0.1
    two, node = _cut_writes({"n.w1": STREAMS // 2, "n.w2": STREAMS // 2})
    assert node.workers["n.w2"][0].snapshot(node.now).node_guard_multiplier < 0.1
    rate_one = sum(sec["checkpoint"] for sec in one) / len(one)
    rate_two = sum(sec["checkpoint"] for sec in two) / len(two)
    # All the streams on one worker, or half on each of two: the same round of 16 streams for the node ...
    assert rate_one == pytest.approx(round_bps, rel=0.2)
    assert rate_two == pytest.approx(rate_one, rel=0.15)
    # ... not twice it (each worker's floor is its own streams' round, not the node's).
    assert rate_two < 1.5 * round_bps
