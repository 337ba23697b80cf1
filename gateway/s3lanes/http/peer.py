"""What the gateway can tell about the client at the other end of a request's connection."""

from __future__ import annotations

from aiohttp import web


def client_gone(request: web.Request) -> bool:
    """The client closed its connection (or it is closing): nobody is left to read an answer.

    aiohttp does not cancel a handler whose client disconnects (and the gateway does not ask it to), so code
    that waits on behalf of a request (a queue in its lane) asks this instead."""
    transport = request.transport
    return transport is None or transport.is_closing()
