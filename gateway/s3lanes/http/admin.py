"""Operator endpoints: ``/metrics`` (Prometheus) and ``/_s3lanes/status`` (JSON), on the S3 listeners.

``/metrics`` answers unsigned GETs only (a signed ``GET /metrics`` lists a bucket named "metrics");
``/_s3lanes/metrics`` is the same document under the gateway's own prefix.

They are answered for peers on loopback, for requests carrying
``Authorization: Bearer <[server].admin_token>``, or for everyone if ``[server].admin_open`` is set: a
node-local Prometheus or ``s3lanes status`` on the node reaches them, the training fleet does not.
``/_s3lanes/healthz`` (liveness) and ``/_s3lanes/readyz`` (readiness) answer every peer: kubelets probe
from the node's address and the answers reveal nothing. ``_s3lanes`` can never be a bucket name (S3 bucket
names start with a letter or digit), so the paths cannot shadow a bucket.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from s3lanes import __version__
from s3lanes.clock import Clock
from s3lanes.core.access import TenantPolicy
from s3lanes.core.s3request import query_names, split_target
from s3lanes.core.sigv4 import RequestView, parse_auth, verify
from s3lanes.errors import S3Error
from s3lanes.http.forward import forwarded_peer
from s3lanes.metrics import CONTENT_TYPE, Metrics, event_loop_tasks
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.spool import Spool

STATUS_PATH = "/_s3lanes/status"
HEALTH_PATH = "/_s3lanes/healthz"
READY_PATH = "/_s3lanes/readyz"
FLUSH_PATH = "/_s3lanes/flush"
FLUSH_HEADER = "x-s3lanes-flush"
DRAIN_PATH = "/_s3lanes/drain"
MAX_FLUSH_TIMEOUT_S = 3600.0
ADMIN_METRICS_PATH = "/_s3lanes/metrics"
# Also served at /metrics, Prometheus' default, for unsigned requests (a signed one is ListObjects).
METRICS_PATH = "/metrics"


def _is_loopback(request: web.Request) -> bool:
    relayed = forwarded_peer(request)  # another worker's relay: the client's address
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    address = peer[0] if isinstance(peer, (tuple, list)) and peer else None
    if relayed is not None:
        address = relayed
    if not address:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Admin:
    def __init__(
        self,
        metrics: Metrics,
        dispatcher: LaneDispatcher,
        clock: Clock,
        *,
        open_to_all: bool,
        spool: Spool | None = None,
        secrets: dict[str, str] | None = None,
        max_skew_s: float = 900.0,
        drainer_status: Any = None,
        admin_token: str | None = None,
        lifecycle: Lifecycle | None = None,
        cluster_status: Callable[[], dict[str, Any]] | None = None,
        pools_status: Callable[[], dict[str, Any]] | None = None,
        policies: Mapping[str, TenantPolicy] | None = None,
        drain_hold: Callable[[bool | None], bool] | None = None,
        backends_waiting: Callable[[], list[str]] | None = None,
        bucket_exists: Callable[[str, str | None], Awaitable[bool | None]] | None = None,
    ) -> None:
        self._metrics = metrics
        self._dispatcher = dispatcher
        self._clock = clock
        self._open = open_to_all
        self._spool = spool
        self._secrets = secrets if secrets is not None else {}  # shared: updated in place on reloads
        self._max_skew_s = max_skew_s
        self._drainer_status = drainer_status
        self._token = admin_token.encode() if admin_token else None
        self.lifecycle = lifecycle if lifecycle is not None else Lifecycle()
        self._cluster_status = cluster_status
        self._pools_status = pools_status
        self._policies = dict(policies or {})
        self._drain_hold = drain_hold
        # Backends that have never answered (readiness waits for them), None = readiness does not.
        self._backends_waiting = backends_waiting
        # (bucket, signing tenant or None) -> does the store have it (None: could not tell)
        self._bucket_exists = bucket_exists
        # One of several workers (s3lanes.runtime.workers.NodeMetrics.gather): own exposition -> the node's.
        self.gather_metrics: Callable[[bytes], Awaitable[bytes]] | None = None
        # One of several workers: {"index", "count", "pid"} in the status document (None: a single process).
        self.worker: dict[str, int] | None = None
        # Several workers, on one that does not hold the spool: the spool's section, from its owner.
        self.spool_status: Callable[[], Awaitable[dict[str, Any]]] | None = None

    def allowed(self, request: web.Request) -> bool:
        return self._open or _is_loopback(request) or self._bearer_ok(request)

    def forbidden_text(self, request: web.Request) -> str:
        """The 403 body for a peer that may not see the admin endpoints: what would let it in."""
        if self._token is None:
            return (
                "admin endpoints answer loopback peers only: ask from the gateway's host, or set [server]"
                " admin_token and send it (Authorization: Bearer <token>; s3lanes status --token), or set"
                " [server] admin_open = true where a network policy guards the port\n"
            )
        if request.headers.get("Authorization", "").lower().startswith("bearer "):
            return "the bearer token does not match [server] admin_token\n"
        return (
            "admin endpoints answer loopback peers, and others that send Authorization: Bearer <[server]"
            " admin_token> (s3lanes status --token TOKEN, or S3LANES_SERVER_ADMIN_TOKEN in its environment)\n"
        )

    def _bearer_ok(self, request: web.Request) -> bool:
        if self._token is None:
            return False
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token)

    async def healthz(self, _request: web.Request) -> web.Response:
        """Liveness: the event loop answers. Never fails on the backend's account (restarting won't help)."""
        return web.Response(text="ok\n", headers={"Cache-Control": "no-store"})

    async def readyz(self, _request: web.Request) -> web.Response:
        """Readiness: recovery done and listeners open, not shutting down. 503 with the reason otherwise."""
        state = self.lifecycle.state
        status = 200 if state == "ready" else 503
        text = state
        waiting = self._backends_waiting() if self._backends_waiting is not None else []
        if status == 200 and waiting:
            status, text = 503, f"waiting for backend {', '.join(waiting)} to answer"
        return web.Response(status=status, text=f"{text}\n", headers={"Cache-Control": "no-store"})

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
            return web.Response(status=403, text=self.forbidden_text(request))
        body = self._metrics.render()
        if self.gather_metrics is not None:  # one of several workers: the node's metrics
            body = await self.gather_metrics(body)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def status_document(self) -> dict[str, Any]:
        snap = self._dispatcher.scheduler.snapshot(self._clock.monotonic())
        spool: dict[str, Any] = {"enabled": False}
        if self._spool is not None:
            spool = self._spool.status()
            if self._drainer_status is not None:
                spool["drain"] = self._drainer_status()
        doc: dict[str, Any] = {
            "version": __version__,
            "state": self.lifecycle.state,
            "scheduler": plain(snap),
            "dispatcher": {"waiting": self._dispatcher.waiting, "in_flight": self._dispatcher.in_flight},
            "spool": spool,
            "cluster": self._cluster_status() if self._cluster_status is not None else {"enabled": False},
            "pools": self._pools_status() if self._pools_status is not None else {},
            "event_loop_tasks": event_loop_tasks(),
        }
        if self.worker is not None:
            doc["worker"] = dict(self.worker)
        return doc

    def _signed_by_a_tenant(self, request: web.Request) -> str | None:
        """The access key of a valid SigV4 signature by a configured key pair (the flush API is a tenant
        operation), else None."""
        raw_path, raw_query = split_target(request.raw_path)
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]},{value}" if key in headers else value
        view = RequestView(request.method, raw_path, raw_query, headers)
        try:
            auth = parse_auth(view)
            if auth is None or auth.access_key not in self._secrets:
                return None
            verify(
                view, auth, self._secrets[auth.access_key], self._clock.wall(), max_skew_s=self._max_skew_s
            )
        except S3Error:
            return None
        return auth.access_key

    async def flush(self, request: web.Request) -> web.Response:
        """``POST /_s3lanes/flush?bucket=B&prefix=P&timeout=S``: wait until spooled data is on the backend.

        200 with ``durable: true`` once everything acknowledged under bucket/prefix before the call is on the
        backend; 504 with ``durable: false`` and what is still pending when the timeout expires first.
        Loopback peers, or requests SigV4-signed by a configured key pair.
        """
        tenant = None if self.allowed(request) else self._signed_by_a_tenant(request)
        if not self.allowed(request) and tenant is None:
            return web.Response(
                status=403,
                text="flush needs a loopback peer or a SigV4-signed request\n",
                headers={FLUSH_HEADER: "1"},
            )
        q = query_names(split_target(request.raw_path)[1])
        bucket = q.get("bucket", "")
        prefix = q.get("prefix", "")
        policy = self._policies.get(tenant) if tenant is not None else None
        if policy is not None and not policy.may_see(bucket, prefix):
            return web.Response(
                status=403, text="this key has no grant on that bucket/prefix\n", headers={FLUSH_HEADER: "1"}
            )
        try:
            timeout_s = float(q.get("timeout", "30"))
        except ValueError:
            timeout_s = -1.0
        if not bucket or not 0 <= timeout_s <= MAX_FLUSH_TIMEOUT_S:
            return web.json_response(
                {"error": f"need bucket=<name> and 0 <= timeout <= {MAX_FLUSH_TIMEOUT_S:g} seconds"},
                status=400,
                headers={FLUSH_HEADER: "1"},
            )
        doc: dict[str, Any] = {"bucket": bucket, "prefix": prefix}
        if self._spool is None:
            doc.update(
                durable=True, pending_objects=0, pending_bytes=0, oldest_pending_age_s=None, waited_s=0.0
            )
            return web.json_response(doc, headers={FLUSH_HEADER: "1"})
        # Nothing pending says nothing about a bucket the spool never saw: ask the store.
        if (
            self._bucket_exists is not None
            and not self._spool.pending_under(bucket, prefix)[0]
            and await self._bucket_exists(bucket, tenant) is False
        ):
            doc.update(
                durable=False,
                error=f"no bucket named {bucket!r} on the backend",
                pending_objects=0,
                pending_bytes=0,
                oldest_pending_age_s=None,
                waited_s=0.0,
            )
            return web.json_response(doc, status=404, headers={FLUSH_HEADER: "1"})
        result = await self._spool.flush(bucket, prefix, timeout_s)
        doc.update(plain(result))
        return web.json_response(doc, status=200 if result.durable else 504, headers={FLUSH_HEADER: "1"})

    async def drain(self, request: web.Request) -> web.Response:
        """``POST /_s3lanes/drain?pause=1`` holds the drain (no new upload to the backend starts; uploads in
        flight finish), ``?resume=1`` lets it run again; without either it only reports. Answers
        ``{"paused": bool}``. An operator switch (loopback, admin token), not a tenant one: while the drain is
        held, acknowledged writes stay in the spool and flushes wait. Shutdown (SIGTERM) resumes it."""
        if not self.allowed(request):
            return web.Response(status=403, text=self.forbidden_text(request))
        if self._drain_hold is None:
            return web.json_response({"error": "the write spool is off"}, status=409)
        q = query_names(split_target(request.raw_path)[1])
        pause, resume = q.get("pause") == "1", q.get("resume") == "1"
        if (pause and resume) or set(q) - {"pause", "resume"}:
            return web.json_response({"error": "use pause=1 or resume=1"}, status=400)
        paused = self._drain_hold(pause if pause or resume else None)
        return web.json_response({"paused": paused})

    async def status(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
            return web.Response(status=403, text=self.forbidden_text(request))
        doc = self.status_document()
        if self.spool_status is not None:
            doc["spool"] = await self.spool_status()
        return web.Response(text=json.dumps(doc, indent=2), content_type="application/json")


class Lifecycle:
    """``starting`` -> ``ready`` -> ``draining`` (SIGTERM: new checkpoint writes go to the backend directly,
    the spool drains) -> ``stopping`` (listeners close, in-flight requests finish)."""

    def __init__(self) -> None:
        self.state = "starting"


def plain(value: Any) -> Any:
    """Dataclasses, mappings and sequences to JSON-able data (inf/nan become None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [plain(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value
