"""Crash safety of the write spool, end to end: SIGKILL under load, and a backend that goes away.

* Crash: the workload of ``loadtests/crashmodel.py`` (PUTs of 0 B to 6 MiB, multipart uploads, overwrites,
  DELETEs, DeleteObjects, from three client threads on their own keys) runs while the gateway is SIGKILLed
  at random moments (60 times, about a minute) and restarted on the same port and state directory. The
  backend's bandwidth is limited so that drains are in flight at the kills. After a final flush the backend,
  read directly, must hold exactly what the model of the acknowledged operations allows, byte for byte,
  with no multipart upload left behind. ``python -m loadtests.spool_crash`` runs the same code for longer.
* Outage: the gateway reaches SeaweedFS through a relay that stops listening. Checkpoint writes keep being
  acknowledged into the spool, spooled objects can still be read, flush reports what is pending; once the
  relay listens again everything drains. A gateway SIGKILLed during the outage recovers its spool
  (tombstones and open multipart uploads included) and drains it later. With the spool full, a write that
  would have to go through to the missing backend gets a prompt 503, not a hang.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from loadtests.crashmodel import CrashConfig, run_crash
from tests.e2e.conftest import Gateway, start_plain_gateway, stop_gateway
from tests.e2e.relay import CountingRelay
from tests.e2e.s3raw import client_error, error_code, key_path, signed_request

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


# --- crash -------------------------------------------------------------------------------------------------


KILLS = 60  # the issue asks for at least 30; a restart costs ~0.5 s here, so 60 fit in about a minute
OPS = 400


@pytest.mark.timeout(420)
def test_backend_holds_exactly_what_was_acknowledged_across_60_sigkills(
    seaweed: Any, backend: Any, bucket: str, tmp_path: Path
) -> None:
    seed = secrets.randbelow(2**31)
    report = run_crash(
        CrashConfig(ops=OPS, kills=KILLS, seed=seed, max_kill_phase_s=180, flush_timeout_s=60),
        work_dir=tmp_path,
        backend_endpoint=seaweed.endpoint_url,
        access_key=seaweed.admin.access_key,
        secret_key=seaweed.admin.secret_key,
        bucket=bucket,
        backend=backend,
        say=print,
    )
    summary = f"{report.summary()}\nseed {seed}; logs in {tmp_path}"
    print(summary)
    assert report.ok, summary
    assert report.stats.kills >= KILLS and report.stats.ops >= OPS, summary
    served = report.stats.kills - report.stats.kills_by_mode["during-start-up"]  # runs that reached ready
    assert report.recovery.recovery_lines >= served, summary


# --- backend outage ----------------------------------------------------------------------------------------

# Put after `[backend] endpoint = ...` by start_plain_gateway. Short backend timeouts so the outage shows at
# once; short drain backoff so the drain resumes quickly once the backend is back.
OUTAGE_TOML = """
connect_timeout_s = 1
read_timeout_s = 5

[spool]
capacity = "{capacity}"
retry_base_s = 0.1
retry_max_s = 0.5
"""
PROMPT_S = 10.0  # an answer the gateway cannot give must come back within this, not hang


@pytest.fixture
def relay(seaweed: Any) -> Iterator[CountingRelay]:
    parts = urlsplit(seaweed.endpoint_url)
    relay = CountingRelay(parts.hostname or "127.0.0.1", parts.port or 80)
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()


def gateway_behind(relay: CountingRelay, seaweed: Any, tmp: Path, capacity: str) -> tuple[Any, Gateway]:
    return start_plain_gateway(
        tmp,
        seaweed,
        backend_endpoint=f"http://127.0.0.1:{relay.port}",
        extra_toml=OUTAGE_TOML.format(capacity=capacity),
    )


def stop_cleanly(proc: Any, gw: Gateway) -> None:
    code = stop_gateway(proc)
    text = gw.log_path.read_text(errors="replace")
    assert code == 0, f"gateway exited with {code}:\n{text[-4000:]}"
    assert "Traceback" not in text, f"gateway logged a traceback:\n{text[-8000:]}"


def flush_answer(gw: Gateway, bucket: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
    query = urllib.parse.urlencode({"bucket": bucket, "timeout": str(timeout_s)})
    req = urllib.request.Request(f"{gw.http_url}/_s3lanes/flush?{query}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s + 30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def backend_contents(backend: Any, bucket: str) -> dict[str, str]:
    """key -> SHA-256 of every object in the bucket, read straight from the backend."""
    out: dict[str, str] = {}
    for page in backend.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = sha(backend.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    return out


def raw_put(gw: Gateway, bucket: str, key: str, body: bytes) -> tuple[int, bytes, float]:
    """A signed PUT over a raw socket (no SDK retry); (status, body, seconds to the answer)."""
    started = time.monotonic()
    resp = signed_request(
        gw.http_url,
        "PUT",
        key_path(bucket, key),
        access_key=gw.access_key,
        secret_key=gw.secret_key,
        body=body,
        headers={"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()},
    )
    return resp.status, resp.body, time.monotonic() - started


def test_during_a_backend_outage_writes_are_acknowledged_and_readable_and_drain_when_it_returns(
    seaweed: Any, backend: Any, bucket: str, relay: CountingRelay, tmp_path: Path
) -> None:
    proc, gw = gateway_behind(relay, seaweed, tmp_path, "64MiB")
    try:
        s3 = gw.client()
        # A job that has been writing: the gateway has seen the bucket on the backend.
        s3.put_object(Bucket=bucket, Key="warmup/.keep", Body=b"")
        gw.flush(bucket, timeout_s=30)
        relay.pause()

        objects = {
            f"ckpt/step-1/shard-{i}.bin": bytes([i]) * size if size else b""
            for i, size in enumerate((0, 1024, 300 * 1024, 2 * MiB, 6 * MiB))
        }
        started = time.monotonic()
        for key, data in objects.items():
            put = s3.put_object(Bucket=bucket, Key=key, Body=data)
            assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"', key
        objects["ckpt/step-1/shard-3.bin"] = b"overwritten during the outage" * 1000
        s3.put_object(Bucket=bucket, Key="ckpt/step-1/shard-3.bin", Body=objects["ckpt/step-1/shard-3.bin"])
        s3.delete_object(Bucket=bucket, Key="ckpt/step-1/shard-1.bin")
        del objects["ckpt/step-1/shard-1.bin"]
        parts = [b"p" * (5 * MiB), b"q" * MiB]
        mpu = s3.create_multipart_upload(Bucket=bucket, Key="ckpt/step-1/model.bin")
        etags = [
            s3.upload_part(
                Bucket=bucket, Key="ckpt/step-1/model.bin", UploadId=mpu["UploadId"], PartNumber=n, Body=part
            )["ETag"]
            for n, part in enumerate(parts, start=1)
        ]
        done = s3.complete_multipart_upload(
            Bucket=bucket,
            Key="ckpt/step-1/model.bin",
            UploadId=mpu["UploadId"],
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, start=1)]},
        )
        objects["ckpt/step-1/model.bin"] = b"".join(parts)
        objects["ckpt/step-1/.metadata"] = b'{"step": 1}'
        s3.put_object(Bucket=bucket, Key="ckpt/step-1/.metadata", Body=objects["ckpt/step-1/.metadata"])
        acked_s = time.monotonic() - started
        assert acked_s < 30, f"acknowledging {len(objects)} objects into the spool took {acked_s:.1f} s"

        # Reads of spooled objects work without the backend.
        for key, data in objects.items():
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
            assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(data), key
        ranged = s3.get_object(Bucket=bucket, Key="ckpt/step-1/model.bin", Range="bytes=5242000-5243999")
        assert ranged["Body"].read() == objects["ckpt/step-1/model.bin"][5242000:5244000]
        assert s3.head_object(Bucket=bucket, Key="ckpt/step-1/model.bin")["ETag"] == done["ETag"]
        with pytest.raises(ClientError) as deleted:
            s3.head_object(Bucket=bucket, Key="ckpt/step-1/shard-1.bin")
        assert client_error(deleted.value)[1] == 404
        # What needs the backend fails promptly: an object drained earlier, and listings (merged with it).
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("GET of a drained object", lambda: s3.get_object(Bucket=bucket, Key="warmup/.keep")),
            ("ListObjectsV2", lambda: s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/")),
        ]
        for what, call in calls:
            t0 = time.monotonic()
            with pytest.raises(ClientError) as failed:
                call()
            took_s = time.monotonic() - t0
            assert took_s < PROMPT_S, f"{what} took {took_s:.1f} s to fail"
            assert client_error(failed.value)[1] in (503, 504), (what, failed.value)

        # Flush and status say what is pending; the backend has none of it.
        status, doc = flush_answer(gw, bucket, 1.0)
        assert status == 504 and doc["durable"] is False, doc
        assert doc["pending_objects"] == len(objects) + 1, doc  # + the tombstone of shard-1
        spool = gw.status()["spool"]
        assert spool["pending_objects"] == len(objects) + 1, spool
        assert spool["pending_bytes"] == sum(len(d) for d in objects.values()), spool
        assert set(backend_contents(backend, bucket)) == {"warmup/.keep"}

        relay.resume()
        status, doc = flush_answer(gw, bucket, 60.0)
        assert status == 200 and doc["durable"] is True, doc
        assert backend_contents(backend, bucket) == {
            "warmup/.keep": sha(b""),
            **{key: sha(data) for key, data in objects.items()},
        }
        assert backend.head_object(Bucket=bucket, Key="ckpt/step-1/model.bin")["ETag"] == done["ETag"]
        assert backend.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        assert gw.status()["spool"]["pending_objects"] == 0
    finally:
        stop_cleanly(proc, gw)


def test_with_the_spool_full_and_the_backend_down_a_write_through_put_gets_a_prompt_503(
    seaweed: Any, backend: Any, bucket: str, relay: CountingRelay, tmp_path: Path
) -> None:
    proc, gw = gateway_behind(relay, seaweed, tmp_path, "16MiB")
    try:
        s3 = gw.client()
        s3.put_object(Bucket=bucket, Key="warmup/.keep", Body=b"")
        gw.flush(bucket, timeout_s=30)
        relay.pause()

        acked: dict[str, bytes] = {}
        refused: tuple[int, bytes, float] | None = None
        for i in range(20):
            key, data = f"fill/{i:02d}.bin", bytes([i]) * MiB
            status, body, took_s = raw_put(gw, bucket, key, data)
            if status != 200:
                refused = status, body, took_s
                break
            acked[key] = data
        assert refused is not None, "the 16 MiB spool acknowledged 20 MiB"
        status, body, took_s = refused
        # Above high water (90 %) the PUT goes write-through (when_full's default), to a backend that is gone.
        assert len(acked) >= 12, f"only {len(acked)} MiB were spooled before {status}"
        assert status == 503, (status, body[:500])
        assert error_code(body) in ("ServiceUnavailable", "SlowDown"), body[:500]
        assert took_s < PROMPT_S, f"the 503 took {took_s:.1f} s"
        # An object bigger than the whole spool cannot be spooled either.
        status, body, took_s = raw_put(gw, bucket, "too-big.bin", b"z" * (20 * MiB))
        assert status == 503 and error_code(body) in ("ServiceUnavailable", "SlowDown"), (status, body[:500])
        assert took_s < PROMPT_S, f"the 503 took {took_s:.1f} s"
        # The spool's contents are still served.
        assert s3.get_object(Bucket=bucket, Key="fill/00.bin")["Body"].read() == acked["fill/00.bin"]

        relay.resume()
        gw.flush(bucket, timeout_s=60)
        assert backend_contents(backend, bucket) == {
            "warmup/.keep": sha(b""),
            **{key: sha(data) for key, data in acked.items()},
        }
    finally:
        stop_cleanly(proc, gw)


def restart_plain_gateway(
    relay: CountingRelay, seaweed: Any, tmp: Path, capacity: str
) -> tuple[Any, Gateway]:
    """The same gateway again (same state directory); the previous log is kept beside the new one."""
    runs = len(list(tmp.glob("gateway-*.log")))
    (tmp / "gateway.log").rename(tmp / f"gateway-{runs}.log")
    (tmp / "ready.json").unlink()
    return gateway_behind(relay, seaweed, tmp, capacity)


def test_a_gateway_killed_during_the_outage_recovers_its_spool_and_drains_it_when_the_backend_returns(
    seaweed: Any, backend: Any, bucket: str, relay: CountingRelay, tmp_path: Path
) -> None:
    proc, gw = gateway_behind(relay, seaweed, tmp_path, "64MiB")
    try:
        s3 = gw.client()
        s3.put_object(Bucket=bucket, Key="warmup/.keep", Body=b"")
        gw.flush(bucket, timeout_s=30)
        relay.pause()
        a, b, part1 = b"a" * MiB, b"b" * (2 * MiB), b"1" * (5 * MiB)
        s3.put_object(Bucket=bucket, Key="ckpt/s2/a.bin", Body=a)
        s3.put_object(Bucket=bucket, Key="ckpt/s2/b.bin", Body=b)
        s3.delete_object(Bucket=bucket, Key="ckpt/s2/b.bin")  # a tombstone in the spool
        mpu = s3.create_multipart_upload(Bucket=bucket, Key="ckpt/s2/m.bin")
        etag1 = s3.upload_part(
            Bucket=bucket, Key="ckpt/s2/m.bin", UploadId=mpu["UploadId"], PartNumber=1, Body=part1
        )["ETag"]

        proc.kill()  # SIGKILL, while the backend is still away
        proc.wait()
        proc = None
        proc, gw = restart_plain_gateway(relay, seaweed, tmp_path, "64MiB")
        assert "spool recovery:" in gw.log_path.read_text()
        s3 = gw.client()
        assert s3.get_object(Bucket=bucket, Key="ckpt/s2/a.bin")["Body"].read() == a
        with pytest.raises(ClientError) as deleted:
            s3.head_object(Bucket=bucket, Key="ckpt/s2/b.bin")
        assert client_error(deleted.value)[1] == 404
        part2 = b"2" * 1024
        etag2 = s3.upload_part(
            Bucket=bucket, Key="ckpt/s2/m.bin", UploadId=mpu["UploadId"], PartNumber=2, Body=part2
        )["ETag"]
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key="ckpt/s2/m.bin",
            UploadId=mpu["UploadId"],
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag1}, {"PartNumber": 2, "ETag": etag2}]},
        )
        c = b"c" * 1000
        s3.put_object(Bucket=bucket, Key="ckpt/s2/c.bin", Body=c)  # the bucket is known from the spool

        relay.resume()
        gw.flush(bucket, timeout_s=60)
        assert backend_contents(backend, bucket) == {
            "warmup/.keep": sha(b""),
            "ckpt/s2/a.bin": sha(a),
            "ckpt/s2/m.bin": sha(part1 + part2),
            "ckpt/s2/c.bin": sha(c),
        }
        assert backend.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    finally:
        if proc is not None:
            stop_cleanly(proc, gw)
        for old in tmp_path.glob("gateway-*.log"):
            assert "Traceback" not in old.read_text(errors="replace"), old.read_text(errors="replace")[-4000:]
