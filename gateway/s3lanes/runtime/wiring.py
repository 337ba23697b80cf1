"""From config to the running pieces: the one place that turns a :class:`Config` into schedulers, pools and
the spool's directory. ``s3lanes.http.app.build_app`` and ``s3lanes.__main__`` both build through it, and so
do the tests and the simulations (``scheduler_config(Config(), capacity)``: the lanes users run)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from s3lanes.clock import Clock
from s3lanes.config import DEFAULT_BACKEND, Config
from s3lanes.core.routing import RouteTable
from s3lanes.core.scheduler import Scheduler, SchedulerConfig
from s3lanes.runtime.backend import Backend
from s3lanes.runtime.dispatcher import LaneDispatcher
from s3lanes.runtime.pools import Pools, bottleneck_of

# [scheduler] settings that are not the scheduler's own: the size of the pieces the shells charge.
_NOT_SCHEDULER_FIELDS = frozenset({"chunk_bytes"})


def scheduler_config(cfg: Config, bandwidth_bps: float | None) -> SchedulerConfig:
    """The scheduler of one bottleneck: the configured lanes (``[lanes]`` over
    :func:`s3lanes.core.lanes_config.default_lanes`) and scheduler settings, at that store's bandwidth
    (None: estimated online). Each ``[scheduler]`` setting is the :class:`SchedulerConfig` field of its name
    (``progress_interval_s = 0``: None, off)."""
    s = cfg.scheduler
    tuning = {f.name: getattr(s, f.name) for f in fields(s) if f.name not in _NOT_SCHEDULER_FIELDS}
    tuning["progress_interval_s"] = s.progress_interval_s if s.progress_interval_s > 0 else None
    return SchedulerConfig(lanes=tuple(cfg.lanes.values()), capacity_bps=bandwidth_bps, **tuning)


def build_pools(cfg: Config, backend: Backend, clock: Clock) -> Pools:
    """The default backend (given: it may be the embedded one), the named ones, a scheduler per bottleneck."""
    backends = {DEFAULT_BACKEND: backend}
    for name, bcfg in cfg.backends.items():
        assert bcfg.endpoint is not None  # validated
        backends[name] = Backend(bcfg, bcfg.endpoint, clock, name=name)
    configs = {DEFAULT_BACKEND: cfg.backend, **cfg.backends}
    bottlenecks = {name: bottleneck_of(name, configs) for name in configs}
    dispatchers = {
        root: LaneDispatcher(
            Scheduler(scheduler_config(cfg, configs[root].bandwidth_bps), clock.monotonic()), clock
        )
        for root in sorted(set(bottlenecks.values()))
    }
    table = RouteTable((r.bucket, r.backend, r.backend_bucket) for r in cfg.routes)
    return Pools(table, backends, dispatchers, bottlenecks)


def spool_dir(cfg: Config) -> Path:
    """The spool's directory: ``[spool] dir``, or ``spool`` under the state directory."""
    return cfg.spool.dir if cfg.spool.dir is not None else cfg.server.state_dir / "spool"
