"""Has each backend answered at least once since start? The start-up probe behind the warning about an
unreachable store and behind readiness (``[server] ready_requires_backend``).

A probe is an unsigned ``HEAD /`` of the backend's endpoint: any HTTP answer below 500 (S3 answers 403 to
an anonymous request) shows the store is there; its credentials are not the question here. A backend that
has not answered is probed again (after :data:`PROBE_INTERVAL_S`, doubling up to
:data:`PROBE_MAX_INTERVAL_S`) until it does (readiness must not wait for
client traffic that a not-ready gateway never gets); after that the probe stops for good: readiness does
not follow later outages, which are the health section's and the alerts' business (a gateway that stopped
being ready while its store blips would take every job on the node down with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from s3lanes.config import Credential
from s3lanes.errors import S3Error
from s3lanes.runtime.backend import Backend

log = logging.getLogger("s3lanes.backend")

# The first retry comes after PROBE_INTERVAL_S, each next one after twice as long, up to the maximum.
PROBE_INTERVAL_S = 2.0
PROBE_MAX_INTERVAL_S = 30.0
_NOBODY = Credential("", "", "", "")
_WHY_MAX_CHARS = 200


class ReachabilityProbe:
    """Probes the backends that have never answered until each has. Lives on the gateway's event loop."""

    def __init__(
        self,
        backends: Mapping[str, Backend],
        *,
        gates_readiness: bool = True,
        interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self._backends = backends
        self.gates_readiness = gates_readiness
        self._interval_s = interval_s
        self._warned: set[str] = set()
        self.first_round_done = asyncio.Event()

    def never_answered(self) -> list[str]:
        """Names of the backends with no answer below 500 yet (a client request's answer counts too)."""
        return [name for name, b in sorted(self._backends.items()) if b.health.last_ok_at is None]

    async def _probe(self, name: str, backend: Backend) -> None:
        why = "no answer"
        try:
            resp = await backend.request("HEAD", backend.target(None, None, ""), {}, _NOBODY, signed=False)
        except S3Error as exc:  # unreachable or timed out (also recorded in backend.health)
            why = str(exc.__cause__ or exc) or type(exc.__cause__).__name__
        except Exception as exc:  # anything else (garbage for an answer, ...): not answered yet, keep probing
            why = f"{type(exc).__name__}: {exc}"
        else:
            resp.release()
            why = f"it answers HTTP {resp.status}"
        if len(why) > _WHY_MAX_CHARS:  # a store answering garbage may quote it all back
            why = why[:_WHY_MAX_CHARS] + "..."
        if backend.health.last_ok_at is None:
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "backend %s (%s) does not answer: %s. Requests to it fail (503) until it does%s",
                    name,
                    backend.endpoint,
                    why,
                    "; the gateway is not ready until then" if self.gates_readiness else "",
                )
        elif name in self._warned:
            log.info("backend %s (%s) answers now", name, backend.endpoint)

    async def run(self) -> None:
        """Probe until every backend has answered once; never raises (but CancelledError): whatever a probe
        round fails on counts as "not answered yet", logged once per backend."""
        wait_s = self._interval_s
        try:
            while True:
                waiting = self.never_answered()
                if waiting:
                    await asyncio.gather(*(self._probe(n, self._backends[n]) for n in waiting))
                self.first_round_done.set()
                if not self.never_answered():
                    return
                await asyncio.sleep(wait_s)
                wait_s = min(wait_s * 2, PROBE_MAX_INTERVAL_S)
        finally:
            self.first_round_done.set()

    async def wait_first_round(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.first_round_done.wait(), timeout_s)
