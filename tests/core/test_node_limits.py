"""Several workers of a node that is also a member of a cluster (the cluster's Redis): each lane is paced to
the tighter of the cluster budget's allowance and the worker's part of the node
(core.node_lanes.tighter_limits), each as it is paced on its own (external_paced_bps)."""

from __future__ import annotations

import pytest

from s3lanes.core.node_lanes import LaneLimit, NodeRulesMode, WorkerRules, tighter_limits
from s3lanes.core.scheduler import DEFAULT_CAP_HEADROOM, external_paced_bps

C = 100_000_000.0


def rules(limits: dict[str, float | None], for_reads: frozenset[str] = frozenset()) -> WorkerRules:
    return WorkerRules(
        mode=NodeRulesMode.NODE,
        share=0.5,
        guard_multiplier=1.0,
        limits=limits,
        for_reads=for_reads,
        floors={},
    )


def test_without_the_node_the_allowances_apply_as_they_are() -> None:
    got = tighter_limits({"checkpoint": 0.1 * C}, frozenset({"checkpoint"}), None, cap_headroom=0.1)
    assert got == {"checkpoint": LaneLimit(0.1 * C, for_reads=True)}


def test_the_tighter_of_the_allowance_and_the_node_part_paces_the_lane() -> None:
    ckpt = frozenset({"checkpoint"})
    # The cluster allows 20 % of the store; the worker's part of the node's cap is 10 %: the part.
    part = tighter_limits(
        {"checkpoint": 0.2 * C}, ckpt, rules({"checkpoint": 0.1 * C}, ckpt), cap_headroom=0.1
    )
    assert part["checkpoint"] == LaneLimit(0.1 * C, for_reads=True, headroom_taken=True)
    # The cluster allows 5 %, the part is 10 %: the allowance, paced less its headroom.
    allowed = tighter_limits(
        {"checkpoint": 0.05 * C}, ckpt, rules({"checkpoint": 0.1 * C}, ckpt), cap_headroom=0.1
    )
    assert allowed["checkpoint"] == LaneLimit(0.05 * C, for_reads=True)
    # Close calls go by what each paces to: a part of 9.5 % (headroom off) against an allowance of 10 %
    # (paced at 9 % once the headroom is taken): the allowance.
    close = tighter_limits(
        {"checkpoint": 0.1 * C},
        ckpt,
        rules({"checkpoint": 0.095 * C}, ckpt),
        cap_headroom=DEFAULT_CAP_HEADROOM,
    )
    assert close["checkpoint"].bps == pytest.approx(0.1 * C)
    paced = [
        external_paced_bps(0.1 * C, for_reads=True, headroom_taken=False, cap_headroom=DEFAULT_CAP_HEADROOM),
        external_paced_bps(0.095 * C, for_reads=True, headroom_taken=True, cap_headroom=DEFAULT_CAP_HEADROOM),
    ]
    assert paced[0] < paced[1]


def test_lanes_only_the_node_limits_and_lanes_it_leaves_to_the_part() -> None:
    got = tighter_limits(
        {"checkpoint": 0.2 * C},
        frozenset(),
        rules({"dataset": 0.6 * C, "metadata": None, "checkpoint": None}),
        cap_headroom=0.1,
    )
    assert got["dataset"] == LaneLimit(0.6 * C)  # no allowance: the node's part
    assert got["metadata"] == LaneLimit(None)  # neither: no limit (a part of an earlier round is lifted)
    assert got["checkpoint"] == LaneLimit(0.2 * C)  # the node leaves it to the part: the allowance holds
