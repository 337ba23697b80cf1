"""Storage pools: the backends behind the gateway, their schedulers, and which bucket goes where.

One :class:`~s3lanes.runtime.backend.Backend` per configured store (``[backend]`` is "default", the rest are
``[backends.<name>]``), each with its own connection pools (and source addresses: network planes). Each
*bottleneck* has one scheduler and its dispatcher: a backend has its own unless it declares
``shares_bottleneck_with`` another (one array behind two endpoints), so a checkpoint burst to one pool
throttles reads from another only where the configuration says they share hardware. The route table
(:mod:`s3lanes.core.routing`) decides, per client-visible bucket, the backend and the bucket's name there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from s3lanes.config import DEFAULT_BACKEND, BackendConfig, Credential
from s3lanes.core.routing import Route, RouteTable
from s3lanes.core.sigv4 import UNSIGNED_PAYLOAD
from s3lanes.errors import S3Error
from s3lanes.runtime.backend import Backend, BackendResponse, BackendTarget, Body
from s3lanes.runtime.dispatcher import LaneDispatcher


def bottleneck_of(name: str, backends: Mapping[str, BackendConfig]) -> str:
    """The backend whose scheduler ``name`` uses: follow ``shares_bottleneck_with`` to its end."""
    seen = {name}
    while True:
        nxt = backends[name].shares_bottleneck_with
        if nxt is None or nxt in seen:
            return name
        seen.add(nxt)
        name = nxt


@dataclass(frozen=True, slots=True)
class StoreCall:
    """One request to the store holding a client-visible bucket, as :meth:`Pools.request` and
    :meth:`Pools.read` send it: in ``lane``, signed as ``credential``. ``bucket`` is the client's name (the
    route gives the store's); ``None`` with ``key`` ``None`` is the store's service (ListBuckets)."""

    lane: str
    bucket: str | None
    key: str | None
    method: str
    headers: Mapping[str, str]
    credential: Credential
    raw_query: str = ""


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

    async def request(
        self,
        call: StoreCall,
        body: Body = None,
        *,
        cost: int | None,
        backend: str | None = None,
        gone: Callable[[], bool] | None = None,
        account_body: bool = False,
        admitted: Callable[[], None] | None = None,
        observe: bool = True,
        observe_errors: bool = False,
        payload_hash: str = UNSIGNED_PAYLOAD,
        signed: bool = True,
    ) -> aiohttp.ClientResponse:
        """Send ``call`` to the backend holding its bucket, through its lane; return the backend's response,
        body unread (the caller reads or streams it, and releases it).

        The bucket's route picks the backend and the bucket's name there; ``backend`` names one instead, for
        a request to the store's service (no bucket). The request first queues in its lane at its
        bottleneck's dispatcher for ``cost`` bytes (``None``: not admitted, a connection-pool choice only);
        the grant is completed at once, the cost being a charge, not a resource held for the exchange (a
        long upload waiting for its next chunk would otherwise count as in flight, and a paced lane whose
        window share such tickets use up could never be granted that chunk). ``gone`` withdraws a waiting
        request whose client went away. ``account_body``: a whole (bytes) body's length is added to the
        cost and, once granted, counted as delivered. ``admitted`` is called once the grant is in, just
        before the signed request goes out. The answer's status is reported to the dispatcher
        (``observe``), and so is an :class:`~s3lanes.errors.S3Error`'s (``observe_errors``).
        """
        lane = call.lane
        if backend is not None:
            chosen = self.backends[backend]
            target = chosen.target(None, call.key, call.raw_query)
        else:
            chosen, target = self.target(call.bucket, call.key, call.raw_query)
        dispatcher = self.dispatcher_of(chosen.name)
        if cost is not None:
            whole = account_body and isinstance(body, bytes)
            if whole:
                assert isinstance(body, bytes)
                cost += len(body)
            ticket = await dispatcher.acquire(lane, cost, gone=gone)
            dispatcher.release(ticket)
            if whole and body:
                assert isinstance(body, bytes)
                dispatcher.observe_delivered(lane, len(body))
        if admitted is not None:
            admitted()
        try:
            resp = await chosen.request(
                call.method,
                target,
                call.headers,
                call.credential,
                body=body,
                payload_hash=payload_hash,
                lane=lane,
                signed=signed,
            )
        except S3Error as err:
            if observe_errors:
                dispatcher.observe_backend(lane, err.status)
            raise
        if observe:
            try:
                dispatcher.observe_backend(lane, resp.status)
            except BaseException:
                resp.release()
                raise
        return resp

    async def read(
        self,
        call: StoreCall,
        *,
        cost: int,
        gone: Callable[[], bool] | None = None,
        admitted: Callable[[], None] | None = None,
        signed: bool = True,
    ) -> BackendResponse:
        """A bodiless GET or HEAD as :meth:`request` sends it (same lane admission, same observations),
        through the backend's lean client where it has one (:meth:`Backend.read`)."""
        chosen, target = self.target(call.bucket, call.key, call.raw_query)
        dispatcher = self.dispatcher_of(chosen.name)
        ticket = await dispatcher.acquire(call.lane, cost, gone=gone)
        dispatcher.release(ticket)
        if admitted is not None:
            admitted()
        # A failure (S3Error) is observed by the caller, as :meth:`request` leaves it with observe_errors off.
        resp = await chosen.read(
            call.method, target, call.headers, call.credential, lane=call.lane, signed=signed
        )
        try:
            dispatcher.observe_backend(call.lane, resp.status)
        except BaseException:
            resp.release()
            raise
        return resp

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
