"""Progress within a lane, simulated: 16 writer connections against 2 saturating readers on a 40 MB/s store.

The latency guard holds the checkpoint lane low for the readers; every writer must still get its next piece
within ``progress_interval_s`` (2 s), and the readers keep at least their 70 % in every second."""

from __future__ import annotations

import tests.sim.scenarios as S


def test_every_writer_moves_a_piece_at_least_every_two_seconds_and_reads_keep_their_share() -> None:
    r = S.run(S.many_writers())
    assert r.ctx.max_gap_s["checkpoint"] <= 2.0 + 0.05
    for a, b in S.windows(4.0, r.scenario.duration_s):
        assert r.share("dataset", a, b) >= 0.70
        assert r.fraction_of_capacity("checkpoint", a, b) > 0.0


def test_without_the_progress_floor_a_writer_waits_four_seconds_between_pieces() -> None:
    # The same run with the configured 2 % floor alone: 16 x 192 KiB at 0.8 MB/s is 3.9 s per round.
    r = S.run(S.many_writers(progress_interval_s=None))
    assert r.ctx.max_gap_s["checkpoint"] > 3.5
