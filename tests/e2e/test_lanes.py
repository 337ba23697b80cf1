"""Lanes end to end: classification reported to clients, and the 70/30 split measured on the backend's wire.

The backend bandwidth is configured (40 MB/s) below what SeaweedFS on this machine can do, so the gateway is
the bottleneck and the split is the scheduler's doing (the latency guard is relaxed there; see the config).
The bytes are counted by a relay between the gateway and SeaweedFS (tests/e2e/relay.py), not by the
gateway's own counters.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.relay import CountingRelay

pytestmark = pytest.mark.e2e

BANDWIDTH_BPS = 40_000_000
OBJECT_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="module", params=[0, 1024 * 1024], ids=["copied-reads", "spliced-reads"])
def shaped_gateway(
    seaweed: Any, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[Gateway, CountingRelay]]:
    """A gateway paced at 40 MB/s in front of a byte-counting relay; once with every GET body copied
    through the gateway, once with them spliced (``zero_copy_min_bytes`` below the 4 MiB objects)."""
    parts = urlsplit(seaweed.endpoint_url)
    relay = CountingRelay(parts.hostname or "127.0.0.1", parts.port or 80)
    relay.start()
    tmp = tmp_path_factory.mktemp("lanes-gateway")
    # [scheduler]: the read-latency guard is proven in simulation (tests/sim). Here, on a 2-core machine that
    # also runs SeaweedFS and twelve boto3 threads, CPU contention alone inflates backend time-to-first-byte
    # by tens of milliseconds whatever order the gateway picks, and a 5 ms guard would (rightly, by its own
    # rules) cut the writes to their floor. This test pins the share split and work conservation.
    proc, gw = start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=f"http://127.0.0.1:{relay.port}",
        server_toml=f"zero_copy_min_bytes = {request.param}",
        # Writes are proxied here (the spool off): the split is measured on client traffic itself. Spool
        # drains take the same lane (tests/e2e/test_spool.py).
        extra_toml=(
            f'bandwidth = "{BANDWIDTH_BPS}"\n\n[scheduler]\nlatency_target_ms = 2000'
            "\n\n[spool]\nenabled = false"
        ),
    )
    try:
        yield gw, relay
    finally:
        code = stop_gateway(proc)
        relay.stop()
        text = gw.log_path.read_text(errors="replace")
        assert code == 0, text[-4000:]
        assert "Traceback" not in text, text[-8000:]


def test_lane_is_reported_and_hints_are_honoured(gateway: Gateway, bucket: str) -> None:
    s3 = gateway.client()
    s3.put_object(Bucket=bucket, Key="data/train-00001.tar", Body=b"x" * 1000)
    s3.put_object(Bucket=bucket, Key="ckpt/step_10/model.safetensors", Body=b"y" * 1000)

    def lane_of(resp: dict[str, Any]) -> str:
        return str(resp["ResponseMetadata"]["HTTPHeaders"]["x-s3lanes-lane"])

    assert lane_of(s3.get_object(Bucket=bucket, Key="data/train-00001.tar")) == "dataset"
    assert lane_of(s3.get_object(Bucket=bucket, Key="ckpt/step_10/model.safetensors")) == "restore"
    assert lane_of(s3.list_objects_v2(Bucket=bucket)) == "metadata"
    assert lane_of(s3.put_object(Bucket=bucket, Key="data/x", Body=b"z")) == "checkpoint"

    def add_hint(request: Any, **_: Any) -> None:
        request.headers["x-s3lanes-lane"] = "restore"

    s3.meta.events.register("before-sign.s3.GetObject", add_hint)
    resp = s3.get_object(Bucket=bucket, Key="data/train-00001.tar")
    assert lane_of(resp) == "restore"
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-s3lanes-lane-reason"] == "hint"


def test_metrics_and_status_are_served_to_loopback(gateway: Gateway, bucket: str) -> None:
    gateway.client().put_object(Bucket=bucket, Key="m", Body=b"1")
    with urllib.request.urlopen(gateway.http_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 's3lanes_requests_total{lane="checkpoint",operation="PutObject",status="200"}' in text
    assert "s3lanes_capacity_bytes_per_second" in text
    assert 's3lanes_lane_queue_depth{lane="dataset"}' in text
    with urllib.request.urlopen(gateway.http_url + "/_s3lanes/status", timeout=10) as resp:
        doc = json.loads(resp.read())
    lanes = {ln["name"] for ln in doc["scheduler"]["lanes"]}
    assert lanes == {"dataset", "checkpoint", "restore", "metadata"}


def _duration_count(gw: Gateway, lane: str, operation: str, served_by: str) -> float:
    with urllib.request.urlopen(gw.http_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    name = (
        f's3lanes_request_duration_seconds_count{{lane="{lane}",operation="{operation}",'
        f'served_by="{served_by}"}} '
    )
    for line in text.splitlines():
        if line.startswith(name):
            return float(line[len(name) :])
    return 0.0


@pytest.mark.parametrize("spooled", [False, True], ids=["backend", "spool"])
def test_request_durations_are_measured_by_lane_operation_and_what_served_them(
    gateway: Gateway, spool_gateway: Gateway, bucket: str, spooled: bool
) -> None:
    gw = spool_gateway if spooled else gateway
    served_by = "spool" if spooled else "backend"
    s3 = gw.client()
    before = _duration_count(gw, "checkpoint", "PutObject", served_by)
    other = _duration_count(gw, "checkpoint", "PutObject", "backend" if spooled else "spool")
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"d/{i}", Body=b"x" * 1000)
    assert _duration_count(gw, "checkpoint", "PutObject", served_by) == before + 3
    assert _duration_count(gw, "checkpoint", "PutObject", "backend" if spooled else "spool") == other
    if spooled:
        gw.flush(bucket)


def test_signed_get_of_metrics_is_still_a_bucket_listing(gateway: Gateway) -> None:
    s3 = gateway.client()
    s3.create_bucket(Bucket="metrics")
    try:
        s3.put_object(Bucket="metrics", Key="k", Body=b"v")
        assert [o["Key"] for o in s3.list_objects(Bucket="metrics")["Contents"]] == ["k"]
        s3.delete_object(Bucket="metrics", Key="k")
    finally:
        s3.delete_bucket(Bucket="metrics")


def _status(gw: Gateway) -> dict[str, Any]:
    with urllib.request.urlopen(gw.http_url + "/_s3lanes/status", timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _per_window(instants: list[float], window_s: float, since: float, until: float) -> list[int]:
    """How many of ``instants`` fall in each whole window between two instants (as CountingRelay.windows)."""
    first, last = int(since / window_s) + 1, int(until / window_s) - 1
    counts = [0] * max(0, last - first + 1)
    for t in instants:
        w = int(t / window_s)
        if first <= w <= last:
            counts[w - first] += 1
    return counts


def _windows_out_of_band(windows: list[tuple[int, int]], low: float, high: float) -> list[int]:
    """Indexes of the windows whose read share (down / (up + down)) is outside ``[low, high]``, except one
    stall and its catch-up.

    The readers are threads in this test's process, on a two-core machine that also runs the gateway and
    SeaweedFS, and now and then all of them stop asking for a fraction of a second while the writers go on
    at their cap (reads are still active). The gateway then lets the reads catch up, as a guaranteed share
    should, and the next window is read-heavy. So one displacement is accepted: a single window out of band,
    or two adjacent ones, that together with a neighbour (or each other) make two seconds in band. Skew the
    scheduler causes itself (a wrong split, a cap that does not hold) shows in more windows and still fails.
    """

    def share(ws: list[tuple[int, int]]) -> float:
        total = sum(u + d for u, d in ws)
        return sum(d for _u, d in ws) / total if total else 0.0

    out = [i for i, w in enumerate(windows) if not low <= share([w]) <= high]
    if len(out) == 2 and out[1] == out[0] + 1:
        pairs = [(out[0], out[1])]
    elif len(out) == 1:
        pairs = [(i, i + 1) for i in (out[0] - 1, out[0]) if i >= 0 and i + 1 < len(windows)]
    else:
        return out
    if any(low <= share([windows[a], windows[b]]) <= high for a, b in pairs):
        return []
    return out


def test_one_stall_and_its_catch_up_pass_but_a_skewed_split_does_not() -> None:
    """The window rule above, on the windows of a real stall (CI, [0.699, 0.712, 0.687, 0.365, 0.84])."""
    mb = 1_000_000

    def win(total_mb: float, share: float) -> tuple[int, int]:
        return int(total_mb * (1 - share) * mb), int(total_mb * share * mb)

    steady = [win(40, 0.70), win(39, 0.71), win(39, 0.69)]
    assert _windows_out_of_band([*steady, win(21, 0.365), win(62, 0.84)], 0.65, 0.75) == []
    assert _windows_out_of_band([*steady, win(40, 0.58), win(40, 0.70)], 0.65, 0.75) == [3]  # no catch-up
    assert _windows_out_of_band([win(40, 0.62)] * 5, 0.65, 0.75) == [0, 1, 2, 3, 4]  # a skewed split
    two_stalls = [win(21, 0.365), win(62, 0.84), *steady, win(21, 0.365), win(62, 0.84)]
    assert _windows_out_of_band(two_stalls, 0.65, 0.75) == [0, 1, 5, 6]
    assert _windows_out_of_band([*steady, win(40, 0.85)], 0.65, 0.75) == [3]  # the last window, alone


def _loop(stop: threading.Event, errors: list[BaseException], fn: Any) -> None:
    try:
        while not stop.is_set():
            fn()
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def test_reads_keep_70_percent_and_writes_take_idle_bandwidth(
    shaped_gateway: tuple[Gateway, CountingRelay], bucket: str
) -> None:
    gw, relay = shaped_gateway
    setup = gw.client()
    payload = os.urandom(OBJECT_BYTES)
    for i in range(4):
        setup.put_object(Bucket=bucket, Key=f"data/shard-{i}", Body=payload)

    get_starts: list[float] = []  # when each reader asked (appends are atomic under the GIL)

    def reader(i: int) -> Any:
        s3 = gw.client()

        def read_one() -> None:
            get_starts.append(time.monotonic())
            s3.get_object(Bucket=bucket, Key=f"data/shard-{i % 4}")["Body"].read()

        return read_one

    def writer(i: int) -> Any:
        s3 = gw.client()
        n = iter(range(10**6))
        return lambda: s3.put_object(Bucket=bucket, Key=f"ckpt/w{i}/part-{next(n)}", Body=payload)

    stop_reads, stop_writes = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    readers = [threading.Thread(target=_loop, args=(stop_reads, errors, reader(i))) for i in range(4)]
    # Eight writers keep the checkpoint lane backlogged through the gaps between one PUT and the next
    # (signing, Expect: 100-continue), as a checkpoint burst from many ranks does.
    writers = [threading.Thread(target=_loop, args=(stop_writes, errors, writer(i))) for i in range(8)]
    try:
        for t in readers + writers:
            t.start()
        time.sleep(3.0)  # convergence: reads become active, caps apply, buckets settle
        mixed_from = time.monotonic()
        time.sleep(5.0)
        status = _status(gw)
        time.sleep(1.0)
        mixed_until = time.monotonic()
        stop_reads.set()
        for t in readers:
            t.join(30)
        time.sleep(3.0)  # the write cap lifts read_idle_s after the last read
        alone_from = time.monotonic()
        time.sleep(4.0)
        alone_until = time.monotonic()
    finally:
        stop_reads.set()
        stop_writes.set()
        for t in readers + writers:
            t.join(60)
    assert not errors, errors

    mixed = relay.windows(mixed_from, mixed_until)
    shares = [down / (up + down) if up + down > 0 else 0.0 for up, down in mixed]
    totals = [(up + down) / relay.window_s for up, down in mixed]
    asked = _per_window(get_starts, relay.window_s, mixed_from, mixed_until)
    report = (
        f"read shares {[round(s, 3) for s in shares]}, totals MB/s {[round(t / 1e6, 1) for t in totals]}, "
        f"GETs asked per window {asked}\n"
        f"scheduler during the mixed phase: {json.dumps(status['scheduler'], indent=1)[:3000]}"
    )
    assert len(shares) >= 4, report
    # Reads keep their 70 % and writes take their cap less its headroom ([scheduler] cap_headroom 0.1: 27 %
    # of the link, so reads carry about 73 %), measured on the wire between gateway and backend, overall
    # and in every whole window. The lower bounds are the guarantee. The upper bounds say the writes are
    # not starved (they keep a fifth overall, 15 % in every window): the eight boto3 writers in this process
    # hash every 4 MiB body before sending it, and on two cores shared with the store and the readers they
    # do not always keep their whole 27 % busy, so the writes' side is not held tighter than that ...
    assert 0.68 <= sum(d for _u, d in mixed) / sum(u + d for u, d in mixed) <= 0.80, report
    assert _windows_out_of_band(mixed, 0.65, 0.85) == [], report
    assert statistics.median(totals) <= BANDWIDTH_BPS * 1.1, report

    with urllib.request.urlopen(gw.http_url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    spliced = re.search(r'^s3lanes_zero_copy_bytes_total\{lane="dataset"\} (\S+)$', metrics, re.M)
    spliced_bytes = float(spliced.group(1)) if spliced else 0.0
    if "zero_copy_min_bytes = 0\n" in (gw.log_path.parent / "s3lanes.toml").read_text():
        assert spliced_bytes == 0, spliced_bytes
    else:
        assert spliced_bytes >= 10 * OBJECT_BYTES, spliced_bytes  # the reads above took the zero-copy path

    alone = relay.windows(alone_from, alone_until)
    write_rates = [up / relay.window_s for up, _down in alone]
    report2 = f"write-only MB/s {[round(r / 1e6, 1) for r in write_rates]}"
    assert len(write_rates) >= 2, report2
    assert statistics.median(write_rates) >= 0.9 * BANDWIDTH_BPS, report2


def test_status_command_prints_every_lane(gateway: Gateway) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "s3lanes", "status", "--url", gateway.http_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "Backend capacity: " in out
    table = out.split("\n\n")[1]  # the lane table; the spool follows after another blank line
    rows = {line.split()[0] for line in table.splitlines()[1:] if line.strip()}
    assert rows == {"dataset", "checkpoint", "restore", "metadata"}, out


def test_status_command_fails_clearly_when_nothing_listens() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "s3lanes", "status", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert "cannot read" in proc.stderr
