"""Who may reach the admin endpoints: loopback peers, holders of the admin token, everyone if admin_open.

Requests are built with aiohttp's request factory and a transport that reports the peer address, so the
non-loopback case is checked without a second network interface."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from s3lanes.clock import FakeClock
from s3lanes.config import Config
from s3lanes.core.scheduler import Scheduler
from s3lanes.http.admin import Admin
from s3lanes.metrics import Metrics
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.wiring import scheduler_config

TOKEN = "0123456789abcdef-admin-token"


def request(peer: str, headers: dict[str, str] | None = None, path: str = "/_s3lanes/status") -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    return make_mocked_request("GET", path, headers=headers or {}, transport=transport)


def admin(*, open_to_all: bool = False, token: str | None = TOKEN) -> Admin:
    clock = FakeClock()
    scheduler = Scheduler(scheduler_config(Config(), 1e9), clock.monotonic())
    return Admin(
        Metrics(), LaneDispatcher(scheduler, clock), clock, open_to_all=open_to_all, admin_token=token
    )


@pytest.mark.parametrize(
    ("peer", "headers", "expected"),
    [
        ("127.0.0.1", {}, True),
        ("::1", {}, True),
        ("10.1.2.3", {}, False),
        ("10.1.2.3", {"Authorization": f"Bearer {TOKEN}"}, True),
        ("10.1.2.3", {"Authorization": f"bearer {TOKEN}"}, True),
        ("10.1.2.3", {"Authorization": f"Bearer {TOKEN}x"}, False),
        ("10.1.2.3", {"Authorization": f"Basic {TOKEN}"}, False),
        ("10.1.2.3", {"Authorization": "Bearer "}, False),
        ("10.1.2.3", {"Authorization": "AWS4-HMAC-SHA256 Credential=x"}, False),
    ],
)
def test_admin_access_rule(peer: str, headers: dict[str, str], expected: bool) -> None:
    assert admin().allowed(request(peer, headers)) is expected


def test_without_a_token_only_loopback_or_open() -> None:
    closed = admin(token=None)
    assert not closed.allowed(request("10.1.2.3", {"Authorization": "Bearer "}))
    assert not closed.allowed(request("10.1.2.3", {"Authorization": f"Bearer {TOKEN}"}))
    assert admin(open_to_all=True, token=None).allowed(request("10.1.2.3"))


def test_status_refuses_a_remote_peer_and_probes_do_not() -> None:
    a = admin()
    remote = request("10.1.2.3")
    assert asyncio.run(a.status(remote)).status == 403
    assert asyncio.run(a.metrics(remote)).status == 403
    assert asyncio.run(a.healthz(remote)).status == 200
    # Readiness follows the lifecycle, whoever asks.
    assert asyncio.run(a.readyz(remote)).status == 503
    a.lifecycle.state = "ready"
    assert asyncio.run(a.readyz(remote)).status == 200
    a.lifecycle.state = "draining"
    resp = asyncio.run(a.readyz(remote))
    assert (resp.status, resp.text) == (503, "draining\n")


def test_flush_signed_by_a_restricted_tenant_needs_a_grant_on_the_prefix() -> None:
    """A remote tenant may wait only for what its grants cover (the SigV4 path of the flush API)."""
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials

    from s3lanes.clock import SystemClock
    from s3lanes.core.access import Grant, TenantPolicy

    clock = SystemClock()
    scheduler = Scheduler(scheduler_config(Config(), 1e9), clock.monotonic())
    a = Admin(
        Metrics(),
        LaneDispatcher(scheduler, clock),
        clock,
        open_to_all=False,
        secrets={"AKJOB": "secret-of-job"},
        policies={"AKJOB": TenantPolicy(write=(Grant("ckpt", "job-42/"),))},
    )

    def flush(prefix: str) -> int:
        path = f"/_s3lanes/flush?bucket=ckpt&prefix={prefix}&timeout=0"
        req = botocore.awsrequest.AWSRequest(method="POST", url=f"http://gw.example:9000{path}", data=b"")
        creds = botocore.credentials.Credentials("AKJOB", "secret-of-job")
        botocore.auth.S3SigV4Auth(creds, "s3", "us-east-1").add_auth(req)
        headers = {**dict(req.headers.items()), "Host": "gw.example:9000"}
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (
            ("10.1.2.3", 40000) if name == "peername" else default
        )
        r = make_mocked_request("POST", path, headers=headers, transport=transport)
        return int(asyncio.run(a.flush(r)).status)

    assert flush("job-42/step-3/") == 200
    assert flush("job-7/") == 403
    assert flush("") == 403


def test_status_and_metrics_count_the_event_loop_tasks_and_show_the_process() -> None:
    a = admin()

    async def scrape(extra_tasks: int) -> tuple[int, str]:
        gate = asyncio.Event()
        parked = [asyncio.create_task(gate.wait()) for _ in range(extra_tasks)]
        await asyncio.sleep(0)
        try:
            doc = a.status_document()
            resp = await a.metrics(request("127.0.0.1", path="/metrics"))
            assert resp.body is not None and isinstance(resp.body, bytes)
            return doc["event_loop_tasks"], resp.body.decode()
        finally:
            gate.set()
            await asyncio.gather(*parked)

    alone, text = asyncio.run(scrape(0))
    more, _ = asyncio.run(scrape(7))
    assert alone >= 1 and more == alone + 7  # the count follows the tasks really alive, not a constant
    lines = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines() if not line.startswith("#")}
    assert float(lines["s3lanes_event_loop_tasks"]) == alone
    assert float(lines["process_open_fds"]) > 0 and float(lines["process_resident_memory_bytes"]) > 0


def test_drain_switch_pauses_and_resumes_for_admins_only() -> None:
    """POST /_s3lanes/drain?pause=1 / ?resume=1 flips the drainer's hold; a remote peer without the token
    cannot, a bad query is refused, and without a spool there is nothing to hold."""
    state = {"paused": False}

    def hold(paused: bool | None) -> bool:
        if paused is not None:
            state["paused"] = paused
        return state["paused"]

    clock = FakeClock()
    scheduler = Scheduler(scheduler_config(Config(), 1e9), clock.monotonic())
    a = Admin(
        Metrics(),
        LaneDispatcher(scheduler, clock),
        clock,
        open_to_all=False,
        admin_token=TOKEN,
        drain_hold=hold,
    )

    def call(query: str, peer: str = "127.0.0.1", headers: dict[str, str] | None = None) -> tuple[int, str]:
        resp = asyncio.run(a.drain(request(peer, headers, path=f"/_s3lanes/drain{query}")))
        return resp.status, resp.text or ""

    status, text = call("?pause=1", peer="10.1.2.3")
    assert status == 403 and "Authorization: Bearer <[server] admin_token>" in text and "--token" in text
    status, text = call("?pause=1", peer="10.1.2.3", headers={"Authorization": "Bearer wrong"})
    assert (status, text) == (403, "the bearer token does not match [server] admin_token\n")
    assert state["paused"] is False
    assert call("?pause=1") == (200, '{"paused": true}') and state["paused"] is True
    assert call("") == (200, '{"paused": true}')
    assert call("?pause=1&resume=1")[0] == 400 and call("?stop=1")[0] == 400
    assert call("?resume=1", peer="10.1.2.3", headers={"Authorization": f"Bearer {TOKEN}"}) == (
        200,
        '{"paused": false}',
    )
    assert state["paused"] is False
    assert asyncio.run(admin().drain(request("127.0.0.1", path="/_s3lanes/drain?pause=1"))).status == 409
