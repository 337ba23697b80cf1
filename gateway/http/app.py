"""The aiohttp application: one catch-all S3 route, its Expect handler, and the backend's lifetime."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.clock import Clock
from gateway.config import Config
from gateway.http.proxy import S3Proxy
from gateway.runtime.backend import Backend

BACKEND_KEY = web.AppKey("backend", Backend)
PROXY_KEY = web.AppKey("proxy", S3Proxy)

# aiohttp's parser limits, set from config: S3 rejects header sections over 8 KiB.
_MAX_FIELD_BYTES = 8190


def build_app(cfg: Config, backend: Backend, clock: Clock) -> web.Application:
    app = web.Application(client_max_size=0, handler_args={"max_field_size": _MAX_FIELD_BYTES})
    proxy = S3Proxy(cfg, backend, clock)
    app[BACKEND_KEY] = backend
    app[PROXY_KEY] = proxy

    async def backend_ctx(app: web.Application) -> AsyncIterator[None]:
        await backend.start()
        yield
        await backend.close()

    app.cleanup_ctx.append(backend_ctx)
    app.router.add_route("*", "/{tail:.*}", proxy.handle, expect_handler=proxy.expect_handler)
    return app


def tls_context(cfg: Config) -> ssl.SSLContext | None:
    if cfg.server.https_listen is None:
        return None
    assert cfg.server.tls_cert is not None and cfg.server.tls_key is not None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cfg.server.tls_cert), str(cfg.server.tls_key))
    return ctx


async def start_listeners(cfg: Config, app: web.Application) -> tuple[web.AppRunner, list[str]]:
    """Open the HTTP and HTTPS listeners; return the runner and the endpoint URLs actually bound."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=cfg.server.shutdown_grace_s,
        handle_signals=False,
        max_line_size=max(cfg.server.max_url_bytes + 64, 8190),
        max_field_size=_MAX_FIELD_BYTES,
    )
    await runner.setup()
    urls: list[str] = []
    if cfg.server.listen is not None:
        site = web.TCPSite(runner, cfg.server.listen.host, cfg.server.listen.port, reuse_address=True)
        await site.start()
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
        await tls_site.start()
        urls.append(_bound_url(tls_site, "https"))
    return runner, urls


def _bound_url(site: web.TCPSite, scheme: str) -> str:
    server = site._server
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    host, port = sockets[0].getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
