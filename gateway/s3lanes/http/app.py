"""The aiohttp application: one catch-all S3 route, its Expect handler, and the backend's lifetime."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from s3lanes.clock import Clock
from s3lanes.config import DEFAULT_BACKEND, Config, Listen
from s3lanes.core.classify import CheckpointPrefixes, Classifier
from s3lanes.errors import S3Error, StartupError
from s3lanes.http.admin import (
    ADMIN_METRICS_PATH,
    DRAIN_PATH,
    FLUSH_PATH,
    HEALTH_PATH,
    METRICS_PATH,
    READY_PATH,
    STATUS_PATH,
    Admin,
    Lifecycle,
    plain,
)
from s3lanes.http.fastroute import install_s3_first
from s3lanes.http.forward import Forwarder
from s3lanes.http.intake import Intake, new_request_id
from s3lanes.http.pool_front import PoolFront
from s3lanes.http.proxy import S3Proxy
from s3lanes.http.router import Router
from s3lanes.http.spool_common import SpoolCommon
from s3lanes.http.spool_front import SpoolFront
from s3lanes.http.status_page import BARE_PATH, PAGE_PATH, StatusPage
from s3lanes.metrics import Metrics
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.cluster import Board, ClusterMember, spool_backlog
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.drainer import Drainer
from s3lanes.runtime.keyfile import CredentialsFileWatcher, KeyTables
from s3lanes.runtime.lane_metrics import pool_collector, scheduler_collector
from s3lanes.runtime.pools import Pools, StoreCall
from s3lanes.runtime.reachability import ReachabilityProbe
from s3lanes.runtime.spool import Spool, crash_on_failure
from s3lanes.runtime.spool_deadline import DeadlineKeeper
from s3lanes.runtime.spool_metrics import spool_collector
from s3lanes.runtime.spool_summary import SummaryWriter
from s3lanes.runtime.tasks import cancel_and_wait
from s3lanes.runtime.wiring import build_pools, spool_dir

log = logging.getLogger("s3lanes.app")

BACKEND_KEY = web.AppKey("backend", Backend)
PROXY_KEY = web.AppKey("proxy", S3Proxy)
ROUTER_KEY = web.AppKey("router", Router)
DISPATCHER_KEY = web.AppKey("dispatcher", LaneDispatcher)
METRICS_KEY = web.AppKey("metrics", Metrics)
SPOOL_KEY = web.AppKey("spool", Spool)
DRAINER_KEY = web.AppKey("drainer", Drainer)
CLUSTER_KEY = web.AppKey("cluster", ClusterMember)
LIFECYCLE_KEY = web.AppKey("lifecycle", Lifecycle)
FRONT_KEY = web.AppKey("spool_front", SpoolFront)
PROBE_KEY = web.AppKey("backend_probe", ReachabilityProbe)
# The bound URL of the [server] admin_listen listener, once open (start_listeners); its port tells a request
# that came in there from one on an S3 listener.
ADMIN_URL_KEY = web.AppKey("admin_url", dict[str, Any])
ADMIN_KEY = web.AppKey("admin", Admin)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's parser limits, set from config: S3 rejects header sections over 8 KiB.
_MAX_FIELD_BYTES = 8190
_PARSER_MAX_HEADERS = 4096
LISTEN_BACKLOG = 1024  # of the listeners a supervisor binds for its workers (asyncio's default is 100)


def build_app(
    cfg: Config,
    backend: Backend,
    clock: Clock,
    *,
    cluster_board: Board | None = None,
    forwarder: Forwarder | None = None,
    summary_path: Path | None = None,
) -> web.Application:
    """The gateway's application. ``cluster_board``: the board of the workers of a node when this process is
    one of them (s3lanes.runtime.workers.FileBoard): the node's split, and without Redis the write budget.
    Several workers with the spool on (s3lanes.http.forward): a worker without the spool gets the
    ``forwarder`` to its owner; the owner publishes the spool summary in ``summary_path``."""
    app = web.Application(
        client_max_size=0,
        # auto_decompress off: a request's Content-Encoding (gzip, deflate...) describes the object S3 stores
        # byte for byte, not the transfer; aiohttp would otherwise inflate such bodies as they arrive.
        handler_args={
            "max_field_size": _MAX_FIELD_BYTES,
            "max_headers": _PARSER_MAX_HEADERS,
            "auto_decompress": False,
        },
    )
    metrics = Metrics()
    pools = build_pools(cfg, backend, clock)
    dispatcher = pools.dispatcher_of(DEFAULT_BACKEND)
    scheduler = dispatcher.scheduler
    classifier = Classifier(cfg.rules, frozenset(cfg.lanes), cfg.tenant_lanes, CheckpointPrefixes())
    metrics.add_snapshot_collector(scheduler_collector(scheduler, clock))
    if len(pools.dispatchers) > 1:
        metrics.add_snapshot_collector(
            pool_collector({name: d.scheduler for name, d in pools.dispatchers.items()}, clock)
        )
    keys = KeyTables(cfg.credentials, cfg.file_access_keys)
    watcher = (
        CredentialsFileWatcher(cfg.server.credentials_file, keys)
        if cfg.server.credentials_file is not None
        else None
    )
    intake = Intake(cfg, clock, keys=keys.live)
    pool_front = PoolFront(cfg, pools, clock)
    proxy = S3Proxy(cfg, pools, clock, metrics=metrics, renamed=pool_front.relay_renamed)
    front: SpoolFront | None = None
    spool: Spool | None = None
    drainer: Drainer | None = None
    keeper: DeadlineKeeper | None = None
    if cfg.spool.enabled:
        spool = Spool(cfg.spool, spool_dir(cfg), clock)
        drainer = Drainer(
            spool,
            pools,
            keys.known,
            cfg.spool,
            clock,
            metrics,
            chunk_bytes=cfg.scheduler.chunk_bytes,
            request_cost_bytes=cfg.scheduler.request_cost_bytes,
            lane_names=frozenset(cfg.lanes),
            zero_copy=cfg.server.zero_copy_min_bytes > 0,
            in_doubt_hold_s=cfg.backend.read_timeout_s,
            fence_s=cfg.backend.read_timeout_s if cfg.spool.fence_s is None else cfg.spool.fence_s,
        )
        front = SpoolFront(
            SpoolCommon(spool, cfg, pools, clock, metrics, keys.known),
            drain_uploads=drainer.open_upload_ids,
            drain_creating=drainer.creating_upload_keys,
        )
        metrics.add_snapshot_collector(spool_collector(spool, clock))
        keeper = DeadlineKeeper(
            spool, list(pools.dispatchers.values()), cfg.spool.lanes, cfg.spool.max_age_s, clock
        )
        metrics.add_snapshot_collector(keeper.collector())
        app[SPOOL_KEY] = spool
        app[DRAINER_KEY] = drainer
        app[FRONT_KEY] = front
    summary: SummaryWriter | None = None
    if spool is not None and summary_path is not None:
        summary = SummaryWriter(summary_path, spooled_buckets(spool))
    cluster: ClusterMember | None = None
    if cfg.cluster.enabled or cluster_board is not None:  # shared lanes get a cluster- or node-wide budget
        backlog = spool_backlog(spool) if spool is not None else None
        cluster = ClusterMember(
            cfg.cluster,
            scheduler,
            clock,
            # Several workers with the cluster's Redis: Redis for the write budget, their board for the node.
            board=None if cfg.cluster.enabled else cluster_board,
            backlog_bytes=backlog,
            wake=dispatcher.wake,
            node_share=cluster_board is not None,
            node_workers=cfg.server.workers,
            node_board=cluster_board if cfg.cluster.enabled else None,
        )
        metrics.add_snapshot_collector(cluster.collector())
        app[CLUSTER_KEY] = cluster
    probe = ReachabilityProbe(pools.backends, gates_readiness=cfg.server.ready_requires_backend)
    app[PROBE_KEY] = probe
    admin = Admin(
        metrics,
        dispatcher,
        clock,
        open_to_all=cfg.server.admin_open,
        spool=spool,
        secrets=keys.secrets,
        max_skew_s=cfg.server.max_skew_s,
        drainer_status=_drain_status(drainer, keeper) if drainer is not None else None,
        admin_token=cfg.server.admin_token,
        cluster_status=cluster.status if cluster is not None else None,
        pools_status=lambda: pools_status(pools, clock),
        policies=cfg.tenant_policies,
        drain_hold=drainer.hold if drainer is not None else None,
        backends_waiting=probe.never_answered if cfg.server.ready_requires_backend else None,
        bucket_exists=lambda bucket, tenant: bucket_exists(pools, keys, bucket, tenant),
    )
    if forwarder is not None:
        admin.spool_status = forwarder.owner_spool_status
    app[LIFECYCLE_KEY] = admin.lifecycle
    app[ADMIN_KEY] = admin
    app[BACKEND_KEY] = backend
    router = Router(
        cfg,
        pools,
        clock,
        intake=intake,
        proxy=proxy,
        pool_front=pool_front,
        spool_front=front,
        classifier=classifier,
        metrics=metrics,
    )
    router.forwarder = forwarder
    router.spool_summary = summary
    app[PROXY_KEY] = proxy
    app[ROUTER_KEY] = router
    app[DISPATCHER_KEY] = dispatcher
    app[METRICS_KEY] = metrics

    async def backend_ctx(app: web.Application) -> AsyncIterator[None]:
        await pools.start()
        drain_task: asyncio.Task[None] | None = None
        if spool is not None and drainer is not None:
            # Recovery runs here, before the listeners open: replay, truncate, drop orphans.
            try:
                await spool.open()
            except BaseException:  # a damaged journal: the backend sessions close before the exit
                await pools.close()
                raise
            if front is not None:
                front.remember_buckets()
            if summary is not None:
                summary.refresh()  # recovered: published before the listeners open
            drain_task = _spawn(drainer.run(), "spool-drainer")
        deadline_task = _spawn(keeper.run(), "spool-deadline") if keeper is not None else None
        watch_task = _spawn(watcher.run(), "credentials-file") if watcher is not None else None
        cluster_task = _spawn(cluster.run(), "cluster-budget") if cluster is not None else None
        summary_task = _spawn(summary.run(), "spool-summary") if summary is not None else None
        probe_task = _spawn(probe.run(), "backend-probe")
        yield
        if forwarder is not None:
            await forwarder.close()
        await cancel_and_wait(summary_task)
        await cancel_and_wait(probe_task)
        await cancel_and_wait(watch_task)
        if cluster is not None:
            await cancel_and_wait(cluster_task)
            await cluster.close()
        await cancel_and_wait(deadline_task)
        if drainer is not None and drain_task is not None:
            await drainer.close()
            await cancel_and_wait(drain_task)
        if spool is not None:
            await spool.close()
        await pools.close()

    app.cleanup_ctx.append(backend_ctx)
    app.on_cleanup.append(lambda _app: _close(pools))
    status_page = StatusPage(admin.allowed, admin.forbidden_text)
    admin_url: dict[str, Any] = {}  # "url" and "port", once bound
    app[ADMIN_URL_KEY] = admin_url
    separate = cfg.server.admin_listen is not None
    on_admin = _on_admin_listener(admin_url)
    for path, handler in (
        (HEALTH_PATH, admin.healthz),
        (READY_PATH, admin.readyz),
        (STATUS_PATH, admin.status),
        (ADMIN_METRICS_PATH, admin.metrics),
        (PAGE_PATH, status_page.page),
        (BARE_PATH, status_page.redirect),
    ):
        route = _admin_only(handler, router, on_admin) if separate else _unless_signed(handler, router)
        app.router.add_get(path, route)
    # The durability API stays on the S3 listeners too: jobs call it (signed) where they write.
    flush: Handler = admin.flush
    drain: Handler = _admin_only(admin.drain, router, on_admin) if separate else admin.drain
    if forwarder is not None:  # the spool's owner answers them
        flush = drain = _to_owner(forwarder)
    app.router.add_post(FLUSH_PATH, flush)
    app.router.add_post(DRAIN_PATH, drain)

    async def s3_or_metrics(request: web.Request) -> web.StreamResponse:
        if separate:
            if not on_admin(request):
                return await router.handle(request)
            if request.method == "GET" and request.path == METRICS_PATH:
                return await admin.metrics(request)
            return web.Response(
                status=404,
                text="not found: this is the s3lanes admin listener (/metrics, /_s3lanes/...); "
                "S3 requests go to the S3 listener\n",
            )
        # GET /metrics is also ListObjects of a bucket named "metrics": only an unsigned request is a scrape.
        if request.method == "GET" and request.path == METRICS_PATH and not _signed(request):
            return await admin.metrics(request)
        return await router.handle(request)

    app.router.add_route("*", "/{tail:(?s:.*)}", s3_or_metrics, expect_handler=router.expect_handler)
    return app


async def bucket_exists(pools: Pools, keys: KeyTables, bucket: str, tenant: str | None) -> bool | None:
    """HEAD the bucket on its backend, as the signing tenant (a loopback flush: as the first key): False
    for 404, True for 2xx, None when the store cannot tell (403, 5xx, unreachable)."""
    cred = keys.live.get(tenant) if tenant is not None else next(iter(keys.live.values()), None)
    if cred is None:
        return None
    try:
        resp = await pools.request(
            StoreCall("metadata", bucket, None, "HEAD", {}, cred), cost=None, observe=False
        )
    except S3Error:
        return None
    resp.release()
    return False if resp.status == 404 else True if resp.status < 300 else None


def pools_status(pools: Pools, clock: Clock) -> dict[str, Any]:
    """The ``pools`` section of the status: backends (endpoint, bottleneck, buckets routed to them) and,
    per bottleneck, its scheduler's snapshot."""
    now = clock.monotonic()
    routes: dict[str, list[dict[str, str]]] = {}
    for r in pools.table.routes:
        routes.setdefault(r.backend, []).append({"bucket": r.bucket, "backend_bucket": r.backend_bucket})
    return {
        "backends": {
            name: {
                "endpoint": b.endpoint,
                "bottleneck": pools.bottleneck(name),
                "source_address": b.cfg.source_address,
                "lane_source_addresses": dict(b.cfg.lane_source_addresses),
                "routes": routes.get(name, []),
                "health": {"state": b.health.state, **plain(b.health)},
                "credentials": b.chain.status()
                if b.chain is not None
                else {"source": "static" if b.cfg.access_key is not None else "clients"},
            }
            for name, b in sorted(pools.backends.items())
        },
        "schedulers": {
            name: plain(d.scheduler.snapshot(now)) for name, d in sorted(pools.dispatchers.items())
        },
    }


def spooled_buckets(spool: Spool) -> Callable[[], list[str]]:
    """The buckets the spool holds anything of: entries (objects, tombstones), open uploads, and keys whose
    last write the journal could not record."""

    def buckets() -> list[str]:
        found = {e.bucket for e in spool.entries()}
        found.update(u.bucket for u in spool.uploads())
        found.update(b for b, _ in spool.unjournaled_keys)
        return list(found)

    return buckets


def _to_owner(forwarder: Forwarder) -> Handler:
    async def route(request: web.Request) -> web.StreamResponse:
        return await forwarder.relay(request, new_request_id())

    return route


def _drain_status(drainer: Drainer, keeper: DeadlineKeeper | None) -> Callable[[], dict[str, object]]:
    """The drainer's status, with the durability deadline's (``spool.drain.deadline``)."""

    def status() -> dict[str, object]:
        out = drainer.status()
        if keeper is not None:
            out["deadline"] = keeper.status()
        return out

    return status


def _unless_signed(handler: Handler, router: Router) -> Handler:
    """Admin GETs are unsigned (or carry the admin bearer token). A SigV4-signed GET of the same path is an S3
    request: a virtual-hosted ``GET b.<domain>/_s3lanes/status`` reads the key ``_s3lanes/status`` of bucket
    ``b``, and a path-style one names the bucket ``_s3lanes``, which S3 refuses as InvalidBucketName."""

    async def route(request: web.Request) -> web.StreamResponse:
        if _signed(request):
            return await router.handle(request)
        return await handler(request)

    return route


def _on_admin_listener(admin_url: dict[str, Any]) -> Callable[[web.Request], bool]:
    """Whether a request came in on the admin listener: its connection's local port is the one that listener
    bound (``[server] admin_listen`` must use another port than the S3 listeners, config validation)."""

    def on_admin(request: web.Request) -> bool:
        port = admin_url.get("port")
        if port is None or request.transport is None:
            return False
        sockname = request.transport.get_extra_info("sockname")
        return sockname is not None and int(sockname[1]) == port

    return on_admin


def _admin_only(handler: Handler, router: Router, on_admin: Callable[[web.Request], bool]) -> Handler:
    """With ``[server] admin_listen``: an admin path is the admin endpoint on the admin listener only; on an
    S3 listener it is an S3 request like any other (path-style, bucket ``_s3lanes``: InvalidBucketName)."""

    async def route(request: web.Request) -> web.StreamResponse:
        if on_admin(request):
            return await handler(request)
        return await router.handle(request)

    return route


def _signed(request: web.Request) -> bool:
    auth = request.headers.get("Authorization")
    if auth is not None and not auth.lower().startswith("bearer "):
        return True
    return "X-Amz-Signature" in request.query


async def drain_for_shutdown(app: web.Application, timeout_s: float, abort: asyncio.Event) -> None:
    """SIGTERM, step 1: stop spooling new writes (they go to the backend directly), keep serving, and let the
    drainer empty the spool for up to ``timeout_s`` (or until ``abort``: a second signal). Readiness answers
    503 from here on, so load balancers move new traffic away. What is left is resumed by recovery."""
    lifecycle = app[LIFECYCLE_KEY]
    lifecycle.state = "draining"
    spool = app.get(SPOOL_KEY)
    front = app.get(FRONT_KEY)
    if spool is None or front is None:
        return
    front.stop_accepting()
    drainer = app.get(DRAINER_KEY)
    if drainer is not None:
        drainer.hold(False)  # a held drain (POST /_s3lanes/drain?pause=1) runs again to empty the spool
    status = spool.status()
    log.info(
        "shutdown: draining %d objects (%d bytes) for up to %.0f s; new writes go to the backend directly",
        status["pending_objects"],
        status["pending_bytes"],
        timeout_s,
    )
    waiter = asyncio.ensure_future(spool.wait_empty(timeout_s))
    aborter = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({waiter, aborter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborter.cancel()
        waiter.cancel()
    status = spool.status()
    if status["pending_objects"] or status["backend_uploads_open"]:
        log.warning(
            "shutdown: %d objects (%d bytes) not yet on the backend; they stay in %s and drain after restart",
            status["pending_objects"],
            status["pending_bytes"],
            spool.root,
        )
    else:
        log.info("shutdown: spool drained")


def _spawn(run: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A background task of the app, whose failure takes the process down."""
    task = asyncio.create_task(run, name=name)
    task.add_done_callback(crash_on_failure)
    return task


async def _close(pools: Pools) -> None:
    for dispatcher in pools.dispatchers.values():
        dispatcher.close()


def tls_context(cfg: Config) -> ssl.SSLContext | None:
    if cfg.server.https_listen is None:
        return None
    assert cfg.server.tls_cert is not None and cfg.server.tls_key is not None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert, key = cfg.server.tls_cert, cfg.server.tls_key
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        reason = (
            "the key does not match the certificate"
            if "KEY_VALUES_MISMATCH" in str(exc)
            else "not a PEM certificate chain and its PEM private key"
        )
        raise StartupError(f"[server] tls_cert {cert}, tls_key {key}: cannot load them: {reason}") from None
    except OSError as exc:
        raise StartupError(
            f"[server] tls_cert {cert}, tls_key {key}: cannot read them: {exc.strerror or exc}"
        ) from None
    return ctx


async def start_listeners(
    cfg: Config, app: web.Application, sockets: ListenSockets | None = None, *, unix_path: str | None = None
) -> tuple[web.AppRunner, list[str]]:
    """Open the HTTP and HTTPS listeners; return the runner and the endpoint URLs actually bound.
    ``sockets``: listening sockets bound already (by a supervisor of several workers) to serve on.
    ``unix_path``: also serve on this unix socket (the spool's owner, for the other workers)."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=cfg.server.shutdown_grace_s,
        handle_signals=False,
        max_line_size=max(cfg.server.max_url_bytes + 64, 8190),
        max_field_size=_MAX_FIELD_BYTES,
        # aiohttp's own limit (128) would answer a bare 400 and log a traceback; the gateway's limit
        # (s3lanes.core.limits.MAX_HEADERS) answers S3's error instead, so aiohttp's is set far above it.
        max_headers=_PARSER_MAX_HEADERS,
    )
    try:
        urls = await _open(cfg, runner, sockets)
        if unix_path is not None:
            await web.UnixSite(runner, unix_path).start()
    except BaseException:
        await runner.cleanup()  # what started (spool, drainer, backend sessions) stops cleanly
        raise
    return runner, urls


async def _open(cfg: Config, runner: web.AppRunner, sockets: ListenSockets | None) -> list[str]:
    await runner.setup()
    install_s3_first(runner)
    urls: list[str] = []
    if sockets is not None:
        if sockets.http is not None:
            await web.SockSite(runner, sockets.http).start()
            urls.append(sock_url(sockets.http, "http"))
        if sockets.https is not None:
            await web.SockSite(runner, sockets.https, ssl_context=tls_context(cfg)).start()
            urls.append(sock_url(sockets.https, "https"))
        return urls
    if cfg.server.listen is not None:
        site = web.TCPSite(runner, cfg.server.listen.host, cfg.server.listen.port, reuse_address=True)
        await _bind(site, cfg.server.listen, "listen")
        urls.append(_bound_url(site, "http"))
    ctx = tls_context(cfg)
    if ctx is not None and cfg.server.https_listen is not None:
        tls_site = web.TCPSite(
            runner,
            cfg.server.https_listen.host,
            cfg.server.https_listen.port,
            ssl_context=ctx,
            reuse_address=True,
        )
        await _bind(tls_site, cfg.server.https_listen, "https_listen")
        urls.append(_bound_url(tls_site, "https"))
    if cfg.server.admin_listen is not None:
        admin = cfg.server.admin_listen
        admin_site = web.TCPSite(runner, admin.host, admin.port, reuse_address=True)
        await _bind(admin_site, admin, "admin_listen")
        url = _bound_url(admin_site, "http")
        runner.app[ADMIN_URL_KEY].update(url=url, port=int(url.rsplit(":", 1)[1]))
    return urls


async def _bind(site: web.TCPSite, listen: Listen, setting: str) -> None:
    try:
        await site.start()
    except OSError as exc:
        raise _listen_error(listen, setting, exc) from None


@dataclass(frozen=True, slots=True)
class ListenSockets:
    """Listening sockets bound before the workers start (they inherit them)."""

    http: socket.socket | None
    https: socket.socket | None

    def close(self) -> None:
        for sock in (self.http, self.https):
            if sock is not None:
                sock.close()


def bind_listen_sockets(cfg: Config) -> ListenSockets:
    """Bind and listen on the configured addresses (StartupError if one cannot be bound)."""
    bound: list[socket.socket | None] = []
    try:
        for listen, setting in ((cfg.server.listen, "listen"), (cfg.server.https_listen, "https_listen")):
            if listen is None or (setting == "https_listen" and tls_context(cfg) is None):
                bound.append(None)
                continue
            family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((listen.host, listen.port))
            except OSError as exc:
                raise _listen_error(listen, setting, exc) from None
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for s in bound:
            if s is not None:
                s.close()
        raise
    return ListenSockets(http=bound[0], https=bound[1])


def sock_url(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def check_listen_addresses(cfg: Config) -> None:
    """Fail early (StartupError) if a configured listen address cannot be bound, e.g. the port is taken:
    before an embedded store starts and the spool is recovered. The listeners bind for real later."""
    for listen, setting in (
        (cfg.server.listen, "listen"),
        (cfg.server.https_listen, "https_listen"),
        (cfg.server.admin_listen, "admin_listen"),
    ):
        if listen is None or listen.port == 0:
            continue
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will
            try:
                sock.bind((listen.host, listen.port))
            except OSError as exc:
                raise _listen_error(listen, setting, exc) from None


def _listen_error(listen: Listen, setting: str, exc: OSError) -> StartupError:
    if exc.errno == errno.EADDRINUSE:
        why = "the address is already in use (another s3lanes, or another service, holds the port)"
    else:
        why = (exc.strerror or str(exc)).lower()
    flag = {"listen": "--listen ", "https_listen": "--https-listen "}.get(setting, "")
    return StartupError(f"cannot listen on {listen}: {why}; choose another with {flag}or [server] {setting}")


def _bound_url(site: web.TCPSite, scheme: str) -> str:
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    host, port = sockets[0].getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
