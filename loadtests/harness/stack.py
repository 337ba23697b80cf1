"""A SeaweedFS and a proxying gateway in front of it (no spool): the stack the proxy benchmarks measure."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.harness.endpoint import Endpoint
from loadtests.harness.gateway import server_toml, start_gateway, stop_process
from loadtests.harness.store import ACCESS_KEY, REGION, SECRET_KEY
from s3lanes.seaweed.process import SeaweedProcess


@dataclass(slots=True)
class Stack:
    """SeaweedFS and the gateway in front of it, and where to reach them."""

    tmp: Path
    weed: SeaweedProcess
    gateway: subprocess.Popen[bytes] | None = None
    gateway_pid: int = 0
    gateway_log: Path | None = None
    direct: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 0))
    via_gateway: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 0))

    def endpoint(self, side: str) -> Endpoint:
        return self.direct if side == "direct" else self.via_gateway


def start_proxy_gateway(stack: Stack, extra_toml: str = "") -> None:
    """Start the gateway of ``stack`` under ``stack.tmp/gateway``, in front of its SeaweedFS, spool off;
    ``extra_toml`` is appended to the generated config."""
    d = stack.tmp / "gateway"
    text = (
        server_toml(d / "state")
        + f"""
[backend]
endpoint = "{stack.weed.endpoint_url}"
region = "{REGION}"

# The proxy path is what this benchmark measures: uploads are streamed through, not spooled
# (the spool has its own benchmark, loadtests/bench_spool.py).
[spool]
enabled = false

[[credentials]]
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
"""
        + extra_toml
    )
    gw = start_gateway(d, text)
    stack.gateway, stack.gateway_pid, stack.gateway_log = gw.popen, gw.pid, gw.log
    stack.via_gateway = gw.endpoint


def stop_proxy_gateway(stack: Stack) -> int | None:
    """Stop the gateway of ``stack``, if it was started; its exit code."""
    return None if stack.gateway is None else stop_process(stack.gateway)
