"""What the harness raises when a benchmark cannot run."""

from __future__ import annotations


class BenchError(RuntimeError):
    """A request got an unexpected answer, or a process misbehaved: the run is void."""
