"""The workers' Prometheus texts merged into the node's: each family once, every sample with its worker."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from s3lanes.core.metrics_merge import merge_expositions, with_worker_label


def test_the_worker_label_goes_first_in_the_braces_or_makes_them() -> None:
    assert with_worker_label('a_total{lane="x"} 1.0', 2) == 'a_total{worker="2",lane="x"} 1.0'
    assert with_worker_label("a 1.0", 0) == 'a{worker="0"} 1.0'
    assert with_worker_label("a{} 1.0", 1) == 'a{worker="1"} 1.0'


def _worker_text(requests: float, inflight: float, seconds: list[float]) -> str:
    reg = CollectorRegistry()
    c = Counter("s3lanes_requests", "requests", ["lane"], registry=reg)
    c.labels(lane="dataset").inc(requests)
    Gauge("s3lanes_inflight", "in flight", registry=reg).set(inflight)
    h = Histogram("s3lanes_wait_seconds", "wait", buckets=(0.1, 1.0), registry=reg)
    for s in seconds:
        h.observe(s)
    return generate_latest(reg).decode()


def test_two_workers_merge_into_one_valid_exposition_that_sums_to_the_node() -> None:
    merged = merge_expositions({1: _worker_text(5, 2, [0.5]), 0: _worker_text(3, 1, [0.05, 2.0])})
    families = {f.name: f for f in text_string_to_metric_families(merged)}  # parses: one HELP/TYPE each
    assert merged.count("# TYPE s3lanes_wait_seconds histogram") == 1
    req = [s for s in families["s3lanes_requests"].samples if s.name == "s3lanes_requests_total"]
    assert {(s.labels["worker"], s.labels["lane"], s.value) for s in req} == {
        ("0", "dataset", 3.0),
        ("1", "dataset", 5.0),
    }
    assert sum(s.value for s in families["s3lanes_inflight"].samples) == 3.0
    counts = [s for s in families["s3lanes_wait_seconds"].samples if s.name == "s3lanes_wait_seconds_count"]
    assert sorted((s.labels["worker"], s.value) for s in counts) == [("0", 2.0), ("1", 1.0)]
    le1 = [
        s.value
        for s in families["s3lanes_wait_seconds"].samples
        if s.name == "s3lanes_wait_seconds_bucket" and s.labels["le"] == "1.0"
    ]
    assert sorted(le1) == [1.0, 1.0]
    # Worker 0's samples come before worker 1's within a family, whatever the order given.
    lines = [ln for ln in merged.splitlines() if ln.startswith("s3lanes_inflight")]
    assert lines == ['s3lanes_inflight{worker="0"} 1.0', 's3lanes_inflight{worker="1"} 2.0']


def test_blank_lines_other_comments_and_samples_outside_their_family_block() -> None:
    assert with_worker_label("lonely", 4) == "lonely"  # no value: nothing to label
    worker0 = '# HELP h wait\n# TYPE h histogram\nh_bucket{le="1.0"} 1.0\n\n# a comment, not a family head\n'
    worker1 = "h_count 2.0\nh_sum 0.5\nh 9.0\nunknown_total 7.0\n"
    lines = merge_expositions({0: worker0, 1: worker1}).splitlines()
    # worker 1's h_count and h_sum come with no HELP/TYPE before them: their suffix puts them in family h
    assert lines == [
        "# HELP h wait",
        "# TYPE h histogram",
        'h_bucket{worker="0",le="1.0"} 1.0',
        'h_count{worker="1"} 2.0',
        'h_sum{worker="1"} 0.5',
        'h{worker="1"} 9.0',
        'unknown_total{worker="1"} 7.0',
    ]
