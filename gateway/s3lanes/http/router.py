"""The router: one entry point for S3 requests, which picks the front that answers each.

Per request: the request id and context (:class:`~s3lanes.http.intake.Intake`), the lane
(:class:`~s3lanes.core.classify.Classifier`), limits and a restricted tenant's grants, then the front:

- an anonymous read first waits for spooled data under its key or prefix to reach the store;
- the write spool (:class:`~s3lanes.http.spool_front.SpoolFront`), when enabled, answers the operations it
  holds data for (or takes the write);
- with storage pools, ListBuckets and copies between stores go to :class:`~s3lanes.http.pool_front.PoolFront`;
- everything else is proxied to the bucket's store (:class:`~s3lanes.http.proxy.S3Proxy`).

Errors become S3 error answers here, and the request metrics are counted here, whichever front answered.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass
from urllib.parse import unquote

from aiohttp import web

from s3lanes.clock import Clock
from s3lanes.config import Config
from s3lanes.core.access import TenantPolicy
from s3lanes.core.classify import Classifier, Decision, RequestFacts
from s3lanes.core.limits import check_limits
from s3lanes.core.routing import split_copy_source
from s3lanes.core.s3request import query_names
from s3lanes.errors import InternalError, S3Error, SlowDown
from s3lanes.http.forward import Forwarder, forwarded_request_id, write_hold
from s3lanes.http.intake import (
    RID_KEY,
    SOURCE_HEADER,
    Intake,
    RequestContext,
    error_response,
    lane_headers,
    new_request_id,
    stored,
)
from s3lanes.http.peer import client_gone
from s3lanes.http.pool_front import PoolFront
from s3lanes.http.proxy import S3Proxy
from s3lanes.http.spool_front import SpoolFront
from s3lanes.logsetup import REQUEST_ID
from s3lanes.metrics import Metrics
from s3lanes.runtime.pools import Pools
from s3lanes.runtime.spool_summary import SummaryWriter

log = logging.getLogger("s3lanes.http")

# How long an anonymous read waits for spooled data under its key or prefix to reach the store.
ANONYMOUS_SETTLE_TIMEOUT_S = 30.0


@dataclass(eq=False)
class Router:
    """The request handler. One instance per application; holds no per-request state."""

    cfg: Config
    pools: Pools
    clock: Clock
    _: KW_ONLY
    intake: Intake
    proxy: S3Proxy
    pool_front: PoolFront
    # The write spool's front, when the spool is enabled; it answers the operations it holds data for.
    spool_front: SpoolFront | None
    classifier: Classifier
    metrics: Metrics
    # Several workers: a worker without the spool relays what may touch it to the spool's owner
    # (s3lanes.http.forward); the owner marks the buckets of writes in the shared spool summary.
    forwarder: Forwarder | None = None
    spool_summary: SummaryWriter | None = None

    async def expect_handler(self, request: web.Request) -> web.StreamResponse | None:
        return await self.intake.expect_handler(request)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rid = stored(request, RID_KEY) or forwarded_request_id(request) or new_request_id()
        request[RID_KEY] = rid
        REQUEST_ID.set(rid)
        try:
            ctx = self.intake.authenticate(request)
        except S3Error as err:
            self.metrics.child(self.metrics.auth_failures, err.code).inc()
            self.metrics.child(self.metrics.requests, "none", "unauthenticated", str(err.status)).inc()
            return error_response(request, err, rid)
        facts = RequestFacts.from_request(ctx.target, ctx.view.headers, ctx.auth.access_key)
        decision = self.classifier.classify(facts)
        status = 500
        started = self.clock.monotonic()
        served_by = "backend"
        try:
            check_limits(
                ctx.target.operation, query_names(ctx.view.raw_query), facts.size_bytes, len(request.headers)
            )
            policy = self.cfg.tenant_policies.get(ctx.auth.access_key)
            if policy is not None:
                self._check_access(policy, ctx, facts, decision)
            resp = await self._route(request, ctx, decision)
            status = resp.status
            if resp.headers.get(SOURCE_HEADER) == "spool":
                served_by = "spool"
            if 200 <= status < 300:
                self.classifier.note_write_completed(facts, decision)
            return resp
        except S3Error as err:
            status = err.status
            return lane_headers(error_response(request, err, rid), decision)
        except ConnectionError:  # reset, broken pipe, or aiohttp's bare "Connection lost"
            if not client_gone(request):
                raise
            # Nobody is left to answer. Raising would make aiohttp log "Error handling request" with a
            # traceback; a returned response fails to write and aiohttp drops the connection quietly.
            status = 499  # nginx's "client closed request", for the metrics
            return web.Response(status=status)
        except Exception:
            log.exception("internal error on %s %s", request.method, request.raw_path)
            return lane_headers(error_response(request, InternalError(), rid), decision)
        finally:
            self.metrics.child(self.metrics.requests, decision.lane, ctx.target.operation, str(status)).inc()
            self.metrics.child(self.metrics.duration, decision.lane, ctx.target.operation, served_by).observe(
                self.clock.monotonic() - started
            )

    @staticmethod
    def _check_access(
        policy: TenantPolicy, ctx: RequestContext, facts: RequestFacts, decision: Decision
    ) -> None:
        """A restricted tenant's grants and lanes (s3lanes.core.access), before anything reaches a backend."""
        t = ctx.target
        copy_source = None
        if "x-amz-copy-source" in ctx.view.headers:
            src_bucket, rest = split_copy_source(ctx.view.headers["x-amz-copy-source"])
            copy_source = (src_bucket, unquote(rest.lstrip("/").partition("?")[0]))
        policy.check(t.operation, t.bucket, t.key, query_names(ctx.view.raw_query), copy_source=copy_source)
        hinted = facts.hint.strip().lower() if facts.hint else None
        policy.check_lane(decision.lane, hinted=hinted)

    async def _route(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse:
        if self.forwarder is not None and self.forwarder.wants(ctx.target, ctx.view, decision.lane):
            return await self.forwarder.relay(request, ctx.request_id)
        with write_hold(self.spool_summary, ctx.target.bucket, request.method):
            return await self._answer(request, ctx, decision)

    async def _answer(
        self, request: web.Request, ctx: RequestContext, decision: Decision
    ) -> web.StreamResponse:
        if ctx.anonymous:
            await self._settle_for_anonymous(ctx)
        elif self.spool_front is not None:
            spooled = await self.spool_front.route(request, ctx, decision)
            if spooled is not None:
                return spooled
        if self.pools.routed:
            if ctx.target.operation == "ListBuckets":
                return await self.pool_front.list_buckets(request, ctx, decision)
            if "x-amz-copy-source" in ctx.view.headers and self.pool_front.crosses_backends(ctx):
                return await self.pool_front.copy_across(request, ctx, decision)
        return await self.proxy.forward(request, ctx, decision)

    async def _settle_for_anonymous(self, ctx: RequestContext) -> None:
        """An anonymous read sees what the store holds (the spool cannot evaluate the store's policy or
        ACL): spooled data under its key, or its listing's prefix, is drained first."""
        bucket = ctx.target.bucket
        if self.spool_front is None or bucket is None or ctx.target.operation == "HeadBucket":
            return
        if ctx.target.key is not None:
            prefix = ctx.target.key
        else:
            prefix = query_names(ctx.view.raw_query).get("prefix", "")
        spool = self.spool_front.spool
        if not spool.has_bucket_prefix(bucket, prefix):
            return
        result = await spool.flush(bucket, prefix, ANONYMOUS_SETTLE_TIMEOUT_S)
        if not result.durable:
            raise SlowDown(
                "Acknowledged writes under this key are still being uploaded to the store; retry later.",
                retry_after_s=self.cfg.spool.retry_after_s,
            )
