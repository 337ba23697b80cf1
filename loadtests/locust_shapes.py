"""Load shapes: ``TrainingShape`` (a training job's steady reads and periodic checkpoints) and
``StepLoadShape`` (a step load, to find where read latency turns).

Locust runs the one ``LoadTestShape`` subclass it finds in a locustfile, so each shape has its own small
locustfile: ``loadtests/locustfile_training.py`` and ``loadtests/locustfile_step.py``
(``loadtests/locustfile.py`` has none: ``-u``/``-r``/``-t`` drive it). Both shapes read Locust's ``-r`` and
``-t`` (``use_common_options``), and ``-t`` ends the run: with a shape, Locust itself starts the ``-t``
timer only once the shape has finished.

Why the training shape keeps its user counts constant: a checkpoint burst is the *writers'* behaviour
(they wake at the burst boundary, upload, and sleep; ``loadtests.locust_s3.CheckpointWriter``), not
users appearing and disappearing. Stopping a writer user mid-burst would kill its upload half-way and
leave an unfinished multipart upload, and the writers' wall-clock schedule keeps bursts aligned across
workers, which spawning could not. So the shape spawns ``--ckpt-writers`` writers, ``--lister-users``
listers and ``--readers`` readers once (fixed-count classes first), holds them for ``-t``, and the
bursts come every ``--ckpt-period-s`` after ``--ckpt-warmup-s``.

The plans are plain functions of the elapsed time (:class:`TrainingPlan`, :class:`StepPlan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from locust import LoadTestShape, events
from locust.argument_parser import LocustArgumentParser

from loadtests.locust_phases import listener

DEFAULT_SPAWN_RATE = 10.0

Tick = tuple[int, float] | None


@listener(events.init_command_line_parser)
def _add_arguments(parser: LocustArgumentParser, **_kw: Any) -> None:
    g = parser
    g.add_argument("--readers", type=int, default=8, env_var="LOCUST_READERS", help="TrainingShape: readers")
    g.add_argument("--step-users", type=int, default=10, env_var="LOCUST_STEP_USERS", help="users per step")
    g.add_argument(
        "--step-time-s", type=float, default=30.0, env_var="LOCUST_STEP_TIME_S", help="step length"
    )
    g.add_argument(
        "--step-max-users", type=int, default=100, env_var="LOCUST_STEP_MAX_USERS", help="last step's users"
    )


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """Readers, writers and listers at once, for ``run_time_s`` (None: until stopped)."""

    readers: int
    writers: int
    listers: int
    spawn_rate: float
    run_time_s: float | None

    def tick(self, elapsed_s: float) -> Tick:
        if self.run_time_s is not None and elapsed_s >= self.run_time_s:
            return None
        return self.readers + self.writers + self.listers, self.spawn_rate


@dataclass(frozen=True, slots=True)
class StepPlan:
    """``fixed`` users (writers and listers, spawned first) plus ``step_users`` more readers every
    ``step_time_s``, up to ``max_users`` in all; then hold until ``run_time_s`` (None: one more step)."""

    fixed: int
    step_users: int
    step_time_s: float
    max_users: int
    spawn_rate: float
    run_time_s: float | None

    def __post_init__(self) -> None:
        if self.step_users < 1 or not self.step_time_s > 0:
            raise ValueError("a step needs at least one user and a positive duration")

    def tick(self, elapsed_s: float) -> Tick:
        steps_to_max = math.ceil(max(0, self.max_users - self.fixed) / self.step_users)
        end = self.run_time_s if self.run_time_s is not None else (steps_to_max + 1) * self.step_time_s
        if elapsed_s >= end:
            return None
        step = math.floor(elapsed_s / self.step_time_s) + 1
        return min(self.max_users, self.fixed + step * self.step_users), self.spawn_rate


def _common(shape: LoadTestShape) -> tuple[Any, float, float | None]:
    assert shape.runner is not None
    opts = shape.runner.environment.parsed_options
    spawn_rate = float(getattr(opts, "spawn_rate", None) or DEFAULT_SPAWN_RATE)
    run_time = getattr(opts, "run_time", None)
    return opts, spawn_rate, float(run_time) if run_time else None


class TrainingShape(LoadTestShape):
    """Steady readers and listers, ``--ckpt-writers`` writers that burst every ``--ckpt-period-s``."""

    use_common_options = True

    def tick(self) -> Tick:
        opts, spawn_rate, run_time = _common(self)
        plan = TrainingPlan(
            readers=max(0, int(opts.readers)),
            writers=max(0, int(opts.ckpt_writers)),
            listers=max(0, int(opts.lister_users)),
            spawn_rate=spawn_rate,
            run_time_s=run_time,
        )
        return plan.tick(self.get_run_time())  # type: ignore[no-untyped-call]


class StepLoadShape(LoadTestShape):
    """``--step-users`` more users every ``--step-time-s`` up to ``--step-max-users``."""

    use_common_options = True

    def tick(self) -> Tick:
        opts, spawn_rate, run_time = _common(self)
        plan = StepPlan(
            fixed=max(0, int(opts.ckpt_writers)) + max(0, int(opts.lister_users)),
            step_users=int(opts.step_users),
            step_time_s=float(opts.step_time_s),
            max_users=int(opts.step_max_users),
            spawn_rate=spawn_rate,
            run_time_s=run_time,
        )
        return plan.tick(self.get_run_time())  # type: ignore[no-untyped-call]
