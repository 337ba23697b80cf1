"""The operator page at ``/_s3lanes/``: one static HTML document that polls ``/_s3lanes/status`` every second.

The page (``ui/status.html``, package data) holds no state and asks for nothing but the status JSON, so it
adds no work to the gateway beyond that JSON's. It loads no external assets (clusters are often
air-gapped). It is not a dashboard with storage: its history is what the open tab has seen, two minutes of
it.

Access follows the status JSON: ``Admin.allowed`` (loopback peers, unless ``[server].admin_open``), 403
otherwise. The inline script and style run under a per-response CSP nonce; apart from them the page may only
fetch from its own origin. ``/_s3lanes`` redirects to ``/_s3lanes/`` so that the page's relative URL
``status`` resolves to the JSON (also behind a reverse proxy that adds a path prefix).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from importlib import resources

from aiohttp import web

PAGE_PATH = "/_s3lanes/"
BARE_PATH = "/_s3lanes"
_NONCE_MARK = "{{nonce}}"
_FORBIDDEN = "admin endpoints are served to loopback peers only\n"


def load_page() -> str:
    html = resources.files("s3lanes.http").joinpath("ui/status.html").read_text(encoding="utf-8")
    # The style and the script carry the nonce; a page without it would be blocked by its own CSP.
    if html.count(_NONCE_MARK) != 2:
        raise RuntimeError(
            f"ui/status.html: expected the nonce mark on <style> and <script> only: {_NONCE_MARK}"
        )
    return html


def _headers(nonce: str) -> dict[str, str]:
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
        "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


class StatusPage:
    """Answers ``GET /_s3lanes/`` with the page and ``GET /_s3lanes`` with a redirect to it.

    ``allowed`` is the admin access rule (``Admin.allowed``); the page is not served where the JSON is not.
    """

    def __init__(
        self, allowed: Callable[[web.Request], bool], forbidden: Callable[[web.Request], str] | None = None
    ) -> None:
        self._allowed = allowed
        self._forbidden = forbidden or (lambda _request: _FORBIDDEN)
        self._html = load_page()  # at startup: a wheel without its package data fails loudly, not per request

    async def page(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.Response(status=403, text=self._forbidden(request))
        nonce = secrets.token_urlsafe(18)
        return web.Response(
            text=self._html.replace(_NONCE_MARK, nonce),
            content_type="text/html",
            charset="utf-8",
            headers=_headers(nonce),
        )

    async def redirect(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.Response(status=403, text=self._forbidden(request))
        # Relative, so that a path prefix added by a reverse proxy is kept.
        return web.Response(status=301, headers={"Location": "_s3lanes/", "Cache-Control": "no-store"})
