"""Operator endpoints: ``/metrics`` (Prometheus) and ``/_s3lanes/status`` (JSON), on the S3 listeners.

``/metrics`` answers unsigned GETs only (a signed ``GET /metrics`` lists a bucket named "metrics");
``/_s3lanes/metrics`` is the same document under the gateway's own prefix.

They are answered only for peers on loopback unless ``[server].admin_open`` is set: a node-local Prometheus or
``s3lanes status`` on the node reaches them, the training fleet does not. ``_s3lanes`` can never be a bucket
name (S3 bucket names start with a letter or digit), so the paths cannot shadow a bucket.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.clock import Clock
from gateway.metrics import CONTENT_TYPE, Metrics
from gateway.runtime.dispatcher import LaneDispatcher

STATUS_PATH = "/_s3lanes/status"
ADMIN_METRICS_PATH = "/_s3lanes/metrics"
# Also served at /metrics, Prometheus' default, for unsigned requests (a signed one is ListObjects).
METRICS_PATH = "/metrics"


def _is_loopback(request: web.Request) -> bool:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if not peer:
        return False
    try:
        return ipaddress.ip_address(peer[0]).is_loopback
    except ValueError:
        return False


class Admin:
    def __init__(
        self, metrics: Metrics, dispatcher: LaneDispatcher, clock: Clock, *, open_to_all: bool
    ) -> None:
        self._metrics = metrics
        self._dispatcher = dispatcher
        self._clock = clock
        self._open = open_to_all

    def _allowed(self, request: web.Request) -> bool:
        return self._open or _is_loopback(request)

    async def metrics(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.Response(status=403, text="admin endpoints are served to loopback peers only\n")
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def status_document(self) -> dict[str, Any]:
        snap = self._dispatcher.scheduler.snapshot(self._clock.monotonic())
        return {
            "version": __version__,
            "scheduler": _plain(snap),
            "dispatcher": {"waiting": self._dispatcher.waiting, "in_flight": self._dispatcher.in_flight},
        }

    async def status(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.Response(status=403, text="admin endpoints are served to loopback peers only\n")
        return web.Response(
            text=json.dumps(self.status_document(), indent=2), content_type="application/json"
        )


def _plain(value: Any) -> Any:
    """Dataclasses, mappings and sequences to JSON-able data (inf/nan become None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [_plain(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value
