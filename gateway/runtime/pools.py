"""Storage pools: the backends behind the gateway, their schedulers, and which bucket goes where.

One :class:`~gateway.runtime.backend.Backend` per configured store (``[backend]`` is "default", the rest are
``[backends.<name>]``), each with its own connection pools (and source addresses: network planes). Each
*bottleneck* has one scheduler and its dispatcher: a backend has its own unless it declares
``shares_bottleneck_with`` another (one array behind two endpoints), so a checkpoint burst to one pool
throttles reads from another only where the configuration says they share hardware. The route table
(:mod:`gateway.core.routing`) decides, per client-visible bucket, the backend and the bucket's name there.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import DEFAULT_BACKEND, BackendConfig
from gateway.core.routing import Route, RouteTable
from gateway.runtime.backend import Backend, BackendTarget
from gateway.runtime.dispatcher import LaneDispatcher


def bottleneck_of(name: str, backends: Mapping[str, BackendConfig]) -> str:
    """The backend whose scheduler ``name`` uses: follow ``shares_bottleneck_with`` to its end."""
    seen = {name}
    while True:
        nxt = backends[name].shares_bottleneck_with
        if nxt is None or nxt in seen:
            return name
        seen.add(nxt)
        name = nxt


class Pools:
    def __init__(
        self,
        table: RouteTable,
        backends: Mapping[str, Backend],
        dispatchers: Mapping[str, LaneDispatcher],
        bottlenecks: Mapping[str, str],
    ) -> None:
        """``dispatchers`` by bottleneck name; ``bottlenecks`` maps each backend to its bottleneck."""
        self.table = table
        self.backends = dict(backends)
        self.dispatchers = dict(dispatchers)
        self._bottleneck = dict(bottlenecks)

    @property
    def default(self) -> Backend:
        return self.backends[DEFAULT_BACKEND]

    @property
    def routed(self) -> bool:
        return not self.table.empty

    def route(self, bucket: str | None) -> Route | None:
        return None if bucket is None else self.table.resolve(bucket)

    def backend_for(self, bucket: str | None) -> Backend:
        route = self.route(bucket)
        return self.backends[route.backend if route is not None else DEFAULT_BACKEND]

    def target(self, bucket: str | None, key: str | None, raw_query: str) -> tuple[Backend, BackendTarget]:
        """The backend holding ``bucket``, and the request's target there (the backend's bucket name)."""
        route = self.route(bucket)
        if route is None:
            return self.default, self.default.target(None, key, raw_query)
        backend = self.backends[route.backend]
        return backend, backend.target(route.backend_bucket, key, raw_query)

    def dispatcher_for(self, bucket: str | None) -> LaneDispatcher:
        return self.dispatcher_of(self.backend_for(bucket).name)

    def dispatcher_of(self, backend: str) -> LaneDispatcher:
        return self.dispatchers[self._bottleneck[backend]]

    def bottleneck(self, backend: str) -> str:
        return self._bottleneck[backend]

    async def start(self) -> None:
        started: list[Backend] = []
        try:
            for backend in self.backends.values():
                await backend.start()
                started.append(backend)
        except BaseException:  # e.g. no credentials for one backend: close the sessions already open
            for backend in started:
                await backend.close()
            raise

    async def close(self) -> None:
        for backend in self.backends.values():
            await backend.close()
