"""S3 requests straight to the S3 route's handler, past aiohttp's route resolution.

The application has a few admin routes, each on an exact path, and one catch-all route for S3
(:func:`s3lanes.http.app.build_app`). aiohttp resolves every request the same way (``Application._handle``):
it walks the request's path up one segment at a time in its resource index, matches the catch-all's regex,
builds a match-info object and stacks the application on it. For a path that is none of the admin paths the
answer is always the catch-all route, so :func:`install_s3_first` puts a handler in front of the server that
sends such a request to that route's handler at once, with one shared match-info, and hands every other
request (an admin path, or a path the catch-all would not match) to aiohttp's resolution as before. The path
compared is the one aiohttp resolves (``rel_url.path_safe``: percent-decoded but for ``%2F``, dot segments
removed), so ``/_s3lanes/%68ealthz`` still reaches the health check; another method on an admin path is
an S3 request here as it is there (the catch-all takes every method).
"""

from __future__ import annotations

from typing import cast

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import DynamicResource, PlainResource, UrlMappingMatchInfo

# The S3 route's pattern (build_app): every path.
CATCH_ALL_PATH = "/{tail:(?s:.*)}"


def install_s3_first(runner: web.AppRunner) -> bool:
    """Route the S3 requests of ``runner``'s server (set up: :meth:`web.AppRunner.setup`) to the catch-all
    route directly. Installs nothing and returns False when the application is not the shape this handles:
    middlewares, a sub-application or a resource other than exact paths and the one catch-all."""
    app = runner.app
    server = runner.server
    if server is None or app.middlewares:
        return False
    admin_paths: set[str] = set()
    s3_route: web.AbstractRoute | None = None
    for resource in app.router.resources():
        if isinstance(resource, DynamicResource) and resource.canonical == "/{tail}" and s3_route is None:
            routes = list(resource)
            if len(routes) != 1 or routes[0].method != hdrs.METH_ANY:
                return False
            s3_route = routes[0]
        elif isinstance(resource, PlainResource):
            admin_paths.add(resource.canonical)
        else:
            return False
    if s3_route is None:
        return False
    # One match-info for every S3 request, as aiohttp's resolution leaves it (its application stacked,
    # frozen). Nothing in the gateway reads the catch-all's "tail" match; it is left empty.
    match = UrlMappingMatchInfo({}, s3_route)
    match.add_app(app)
    match.freeze()
    resolving = server.request_handler
    handler = s3_route.handler
    expect = s3_route.handle_expect_header
    admin = frozenset(admin_paths)

    async def handle(base: web.BaseRequest) -> web.StreamResponse:
        path = base.rel_url.path_safe
        if path in admin or path[:1] != "/":
            return await resolving(base)
        request = cast(web.Request, base)
        request._match_info = match
        if request.headers.get(hdrs.EXPECT):
            resp = await expect(request)
            await request.writer.drain()
            if resp is not None:
                return resp
        return await handler(request)

    server.request_handler = handle
    return True
