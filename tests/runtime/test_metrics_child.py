"""``Metrics.child``: a labelled metric's child looked up once, and counting where ``labels()`` counts."""

from __future__ import annotations

from s3lanes.metrics import Metrics


def test_child_is_the_labelled_child_and_is_looked_up_once() -> None:
    m = Metrics()
    first = m.child(m.requests, "dataset", "GetObject", "200")
    assert m.child(m.requests, "dataset", "GetObject", "200") is first
    assert first is m.requests.labels("dataset", "GetObject", "200")
    first.inc()
    m.child(m.requests, "dataset", "GetObject", "404").inc(2)
    m.child(m.wait, "dataset").observe(0.001)
    text = m.render().decode()
    assert 's3lanes_requests_total{lane="dataset",operation="GetObject",status="200"} 1.0' in text
    assert 's3lanes_requests_total{lane="dataset",operation="GetObject",status="404"} 2.0' in text
    assert 's3lanes_lane_wait_seconds_count{lane="dataset"} 1.0' in text
    # The same label values of another metric are another child.
    assert m.child(m.backend_latency, "dataset") is not m.child(m.wait, "dataset")
