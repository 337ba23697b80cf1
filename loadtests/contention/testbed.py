"""Testbeds for the contention benchmark: one shared bottleneck between the client side and SeaweedFS
(and, for the separate-pools scenarios, a second store behind a second bottleneck of its own).

Theory of operation
-------------------
The benchmark needs a store whose reads really queue behind a write burst, as they do at a saturated array
controller or storage link. On one machine a SeaweedFS on loopback does not show that reliably (its CPU is
the bottleneck, and the kernel's loopback queues are shallow), so both testbeds put *one FIFO* at a fixed
rate between the clients and the store, which requests, write data, read data and ACKs all cross:

``netns`` (needs root)::

    <run>-cli 10.79.1.1 (clients, the gateway, its spool on local disk)
        -- veth -- <run>-rtr (router: both directions redirected into ONE ifb with ONE tbf FIFO)
        -- veth -- <run>-srv 10.79.2.1 (SeaweedFS, S3 on port 8333, every port explicit)

  - The FIFO sits on a *router*: a qdisc reached before an IP receive is seen by TCP Small Queues, and the
    sender then keeps only about 1 ms of data queued there; ``ip_rcv()`` on the router orphans the packets,
    so the queue fills like a real switch buffer (measured in shared/testbed: 259x read p99 with a router,
    a few x without).
  - Both directions of the router's traffic go through one ifb device with one tbf (clsact + u32 match-all
    + mirred on both router egresses): a half-duplex shared bottleneck.
  - TCP congestion control is pinned to cubic per route (``congctl``): this kernel defaults to bbr, which
    keeps the queue near one BDP and hides most of the contention; cubic fills a deep FIFO as most
    distributions' defaults would.
  - Namespace names carry our pid (``s3lc-<pid>-cli``...), veths are created directly inside them, so
    nothing of ours ever appears in the root namespace. :meth:`NetnsTestbed.down` stops what runs in them
    (by pid) and deletes them; it runs from ``finally``, from ``atexit`` and on SIGTERM/SIGHUP (see
    ``run.py``), and a later run deletes namespaces left by a run that was killed with SIGKILL.

With ``ckpt_store=True`` both testbeds add a *second store* for the checkpoint bucket, behind its own
bottleneck of the same rate and depth (storage pools): netns a second router and server namespace
(``<run>-rtr2``, ``<run>-srv2`` 10.79.3.1, reached from the client namespace over a second veth,
10.79.4.0/24), the model a second SeaweedFS behind a second relay. The two FIFOs share nothing; the two
SeaweedFS processes do share the machine's CPU (and so, on a small machine, are not fully independent).

``model`` (no root, for CI and machines without netns/ifb): an asyncio TCP relay (``_relay`` below) in front
of a SeaweedFS on loopback that pushes every byte, both directions, through one FIFO served at the link
rate, with a bounded depth in bytes (a full FIFO stops the relay reading, which is TCP backpressure). It is
a model of the netns testbed, not a measurement of hardware: report its parameters with every result.

SeaweedFS runs under a small agent process (``_weed`` below, inside the server namespace for netns) that
uses the project's own supervisor (:class:`s3lanes.seaweed.SeaweedProcess`) and stops weed when it
is told to (SIGTERM) or dies; the agent reports weed's pid, which :meth:`Testbed.down` kills too if the
agent could not.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess

MIB = 1024 * 1024
MB = 1_000_000

# The store's one identity; the gateway holds the same key pair (transparent mode) and the clients sign
# with it.
ACCESS_KEY = "CONTENTIONBENCHKEY01"
SECRET_KEY = "contention-bench-secret-not-a-real-one0"
REGION = "us-east-1"
DATASET_BUCKET = "dataset"
CHECKPOINT_BUCKET = "ckpt"
STORE_IDENTITY = SeaweedIdentity("bench", ACCESS_KEY, SECRET_KEY)

# Where `python -m loadtests.contention...` is importable from (subprocesses run there).
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent

# netns layout
NS_PREFIX = "s3lc"
CLIENT_IP = "10.79.1.1"
ROUTER_CLIENT_IP = "10.79.1.254"
ROUTER_STORE_IP = "10.79.2.254"
STORE_IP = "10.79.2.1"
STORE_S3_PORT = 8333
CLIENT_DEV, ROUTER_CLIENT_DEV = "c0", "rc"
STORE_DEV, ROUTER_STORE_DEV = "s0", "rs"
IFB_DEV = "s3lcifb"
# The second store's path (separate pools): its own client veth, router (same device names, its own ifb) and
# server namespace.
CKPT_CLIENT_IP = "10.79.4.1"
CKPT_ROUTER_CLIENT_IP = "10.79.4.254"
CKPT_ROUTER_STORE_IP = "10.79.3.254"
CKPT_STORE_IP = "10.79.3.1"
CKPT_CLIENT_DEV = "c1"
# Link names: the FIFO in front of the dataset's store (the only one without a second store), and the one in
# front of the checkpoint store.
LINK_DATA = "data"
LINK_CKPT = "ckpt"
TCP_CC = "cubic"

STORE_START_TIMEOUT_S = 120.0
RELAY_START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 20.0

# model relay
RELAY_READ_BYTES = 64 * 1024
# Per connection and direction, chunks admitted to the FIFO and not yet delivered: deep enough that one
# stream can fill the FIFO (as one TCP flow fills a tbf), bounded for a receiver that stops reading.
RELAY_PUMP_QUEUE_CHUNKS = 1024
RELAY_STATS_INTERVAL_S = 0.1


class TestbedError(RuntimeError):
    """The testbed cannot be built on this machine (no root, no netns, no ifb...) or a piece of it failed."""

    __test__ = False  # not a pytest test class despite its name


@dataclass(frozen=True, slots=True)
class BottleneckSpec:
    """The shared FIFO: ``rate_bps`` bytes/s, at most ``depth_bytes`` queued, ``burst_bytes`` of token
    bucket depth (tbf needs one at least as large as a GSO packet)."""

    rate_bps: float
    depth_bytes: int
    burst_bytes: int = 256 * 1024

    @property
    def depth_s(self) -> float:
        return self.depth_bytes / self.rate_bps


@dataclass(frozen=True, slots=True)
class WireSample:
    """Cumulative bytes that left the FIFO per direction, and what is queued in it, at monotonic ``at``."""

    at: float
    up_bytes: int  # client side -> store: requests, write data
    down_bytes: int  # store -> client side: read data, responses
    backlog_bytes: int
    drops: int


# --------------------------------------------------------------------------------------------------------
# Child processes, stopped by pid only


@dataclass(slots=True)
class Child:
    """A subprocess of ours in its own session (a Ctrl-C reaches the benchmark only, which stops it)."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    exit_code: int | None = None
    signalled: bool = False  # told to stop already: a second signal may mean "hurry" (the gateway)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send ``sig`` once, without waiting (to stop several children at once, then :meth:`stop` each)."""
        if self.popen.poll() is None and not self.signalled:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            self.signalled = True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """``sig`` (SIGTERM) by pid unless :meth:`signal_stop` sent it, wait ``timeout_s``, then SIGKILL.
        Idempotent."""
        p = self.popen
        if p.poll() is None:
            self.signal_stop(sig)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
        self.exit_code = p.returncode
        return p.returncode


def stop_all(children: Sequence[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop ``children`` together: each shutdown takes seconds, so signal them all first, then wait."""
    for child in children:
        child.signal_stop()
    for child in children:
        child.stop(timeout_s)


def spawn(name: str, argv: Sequence[str], log_path: Path, cwd: Path = PROJECT_ROOT) -> Child:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_fh:
        popen = subprocess.Popen(
            list(argv),
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
    return Child(name, popen, log_path)


def log_tail(path: Path, max_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait_ready_file(child: Child, ready: Path, timeout_s: float, what: str) -> dict[str, Any]:
    """The JSON a child writes (atomically) to ``ready`` once it serves; TestbedError if it dies first."""
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if not child.alive():
            raise TestbedError(
                f"{what} exited with code {child.popen.returncode}:\n{log_tail(child.log_path)}"
            )
        if time.monotonic() > deadline:
            raise TestbedError(f"{what} not ready after {timeout_s:.0f} s:\n{log_tail(child.log_path)}")
        time.sleep(0.05)
    doc: dict[str, Any] = json.loads(ready.read_text())
    return doc


def write_json_atomic(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, one pid that is ours (not necessarily our child: no reaping)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------------------
# The testbeds


class Testbed(abc.ABC):
    """The shared bottleneck and the store behind it (and with ``ckpt_store``, a second store behind a
    second bottleneck). Use as a context manager or call :meth:`down`."""

    kind: str

    def __init__(self, spec: BottleneckSpec, work_dir: Path, ckpt_store: bool = False) -> None:
        self.spec = spec
        self.work_dir = work_dir
        self.ckpt_store = ckpt_store
        self.children: list[Child] = []
        self.weed_pids: dict[str, int] = {}  # process name for the report -> weed's pid
        self.store_url = ""  # S3 endpoint as clients see it, through the bottleneck
        self.setup_url = ""  # S3 endpoint for loading the dataset before the run
        self.ckpt_store_url = ""  # the second store through its own bottleneck ("" without one)
        self._down = False
        self._atexit_registered = False

    @property
    def links(self) -> tuple[str, ...]:
        """The bottlenecks :meth:`sample` reports: the dataset store's, then the checkpoint store's."""
        return (LINK_DATA, LINK_CKPT) if self.ckpt_store else (LINK_DATA,)

    # -- life cycle ------------------------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.down)
            self._atexit_registered = True

    @abc.abstractmethod
    def up(self) -> None:
        """Build the network side (no shaping yet): namespaces and links, or nothing for the model."""

    @abc.abstractmethod
    def start_store(self) -> None:
        """Start SeaweedFS (and the relay, for the model); sets :attr:`store_url` and :attr:`setup_url`
        (and :attr:`ckpt_store_url` with a second store)."""

    @abc.abstractmethod
    def shape(self) -> None:
        """Put the bottleneck(s) in the path (after the dataset is loaded at full speed)."""

    @abc.abstractmethod
    def client_argv(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` on the client side (in the client namespace)."""

    @abc.abstractmethod
    def sample(self) -> dict[str, WireSample]:
        """Each FIFO's counters now, by link name (:attr:`links`). Blocking (it may run commands)."""

    def describe(self) -> dict[str, Any]:
        """The testbed's parameters, reported with every result."""
        topology, store, tcp_cc = self._layout()
        return {
            "testbed": self.kind,
            "topology": topology,
            "stores": len(self.links),
            "rate_MBps": self.spec.rate_bps / MB,
            "fifo_depth_MiB": self.spec.depth_bytes / MIB,
            "fifo_depth_ms": round(self.spec.depth_s * 1000, 1),
            "tbf_burst_KiB": self.spec.burst_bytes / 1024,
            "tcp_congestion_control": tcp_cc,
            "store": store,
        }

    @abc.abstractmethod
    def _layout(self) -> tuple[str, str, str]:
        """For :meth:`describe`: the topology, the stores, and the TCP congestion control, in words."""

    def down(self) -> None:
        """Stop every process we started (by pid) and remove what :meth:`up` built. Idempotent."""
        if self._down:
            return
        self._down = True
        stop_all(list(reversed(self.children)))
        for pid in self.weed_pids.values():
            if _pid_alive(pid):
                _kill_pid(pid)
        self._teardown_network()

    def _teardown_network(self) -> None:
        return None

    def pids(self) -> dict[str, int]:
        """Processes of the testbed whose CPU the report accounts for."""
        out = {c.name: c.pid for c in self.children if c.alive()}
        out.update(self.weed_pids)
        return out

    def _start_weeds(self, stores: Sequence[tuple[str, str, int, Sequence[str], Sequence[str]]]) -> list[str]:
        """Start one SeaweedFS agent per ``(name, ip, s3 port, wrapper argv, buckets)``, all at once (each
        takes a few seconds, mostly waiting), and wait for them; their endpoints, in order."""
        waiting: list[tuple[str, Child, Path]] = []
        for name, ip, s3_port, wrapper, buckets in stores:
            d = self.work_dir / name
            d.mkdir(parents=True, exist_ok=True)
            ready = d / "agent-ready.json"
            argv = [
                *wrapper, sys.executable, "-m", "loadtests.contention.testbed", "_weed",
                "--state-dir", str(d / "state"), "--ip", ip, "--s3-port", str(s3_port),
                "--ready-file", str(ready),
                *(arg for b in buckets for arg in ("--bucket", b)),
            ]  # fmt: skip
            child = spawn(f"{name}-agent", argv, d / "agent.log")
            self.children.append(child)
            waiting.append((name, child, ready))
        urls = []
        for name, child, ready in waiting:
            doc = wait_ready_file(child, ready, STORE_START_TIMEOUT_S, f"the SeaweedFS agent ({name})")
            self.weed_pids[name] = int(doc["weed_pid"])
            urls.append(str(doc["endpoint"]))
        return urls


@dataclass(frozen=True, slots=True)
class NetnsLink:
    """One path client namespace -- router (with its FIFO) -- store namespace."""

    name: str
    router_ns: str
    store_ns: str
    client_dev: str
    client_ip: str
    router_client_ip: str
    router_store_ip: str
    store_ip: str
    client_route: str  # what the client namespace routes over this path ("default" or a prefix)


class NetnsTestbed(Testbed):
    kind = "netns"

    def __init__(self, spec: BottleneckSpec, work_dir: Path, ckpt_store: bool = False) -> None:
        super().__init__(spec, work_dir, ckpt_store)
        base = f"{NS_PREFIX}-{os.getpid()}"
        self.ns_client, self.ns_router, self.ns_store = f"{base}-cli", f"{base}-rtr", f"{base}-srv"
        self._links = [
            NetnsLink(LINK_DATA, self.ns_router, self.ns_store, CLIENT_DEV, CLIENT_IP, ROUTER_CLIENT_IP,
                      ROUTER_STORE_IP, STORE_IP, "default"),
        ]  # fmt: skip
        if ckpt_store:
            self._links.append(
                NetnsLink(LINK_CKPT, f"{base}-rtr2", f"{base}-srv2", CKPT_CLIENT_DEV, CKPT_CLIENT_IP,
                          CKPT_ROUTER_CLIENT_IP, CKPT_ROUTER_STORE_IP, CKPT_STORE_IP,
                          f"{CKPT_STORE_IP.rsplit('.', 1)[0]}.0/24")
            )  # fmt: skip
        self._created: list[str] = []
        self.removed_stale: list[str] = []

    # -- commands --------------------------------------------------------------------------------------

    @staticmethod
    def _run(argv: Sequence[str], what: str, hint: str = "") -> str:
        try:
            proc = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TestbedError(f"{what}: `{' '.join(argv)}` failed: {exc}. {hint}".rstrip()) from exc
        if proc.returncode != 0:
            cmd = " ".join(argv)
            raise TestbedError(
                f"{what}: `{cmd}` exited with {proc.returncode}: {proc.stderr.strip()}. {hint}"
            )
        return proc.stdout

    @staticmethod
    def preflight() -> None:
        """Fail early, with a message that says what is missing, where the netns testbed cannot run."""
        if os.geteuid() != 0:
            raise TestbedError(
                "the netns testbed needs root: it creates network namespaces, veth pairs, an ifb device and "
                "a tbf qdisc. Run the benchmark as root, or use `--testbed model` (no root; a modelled FIFO)."
            )
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise TestbedError(
                    f"the netns testbed needs `{tool}` (iproute2) on PATH; install iproute2 or use "
                    "`--testbed model`."
                )
        if not Path("/proc/self/ns/net").exists():
            raise TestbedError(
                "this kernel has no network namespaces (CONFIG_NET_NS); use `--testbed model`."
            )

    def remove_stale(self) -> None:
        """Delete namespaces a killed run of this benchmark left behind (their pid is gone)."""
        out = self._run(["ip", "netns", "list"], "list network namespaces")
        for line in out.splitlines():
            name = line.split()[0] if line.split() else ""
            m = re.fullmatch(rf"{NS_PREFIX}-(\d+)-(cli|rtr2?|srv2?)", name)
            if m is None or _pid_alive(int(m.group(1))):
                continue
            self._delete_namespace(name)
            self.removed_stale.append(name)

    def _delete_namespace(self, name: str) -> None:
        with contextlib.suppress(TestbedError):
            pids = self._run(["ip", "netns", "pids", name], f"list processes in {name}").split()
            for pid in pids:  # only processes this benchmark started can be in a namespace it created
                _kill_pid(int(pid))
        self._run(["ip", "netns", "del", name], f"delete network namespace {name}")

    # -- life cycle ------------------------------------------------------------------------------------

    def up(self) -> None:
        self.preflight()
        self._register_atexit()
        self.remove_stale()
        r = self._run
        cli = self.ns_client
        namespaces = [cli, *(ns for link in self._links for ns in (link.router_ns, link.store_ns))]
        for ns in namespaces:
            r(["ip", "netns", "add", ns], "create a network namespace", "The kernel needs CONFIG_NET_NS.")
            self._created.append(ns)
        for ns in namespaces:
            r(["ip", "-n", ns, "link", "set", "lo", "up"], "bring loopback up")
        for link in self._links:
            self._build_link(link)

    def _build_link(self, link: NetnsLink) -> None:
        r, cli, rtr, srv = self._run, self.ns_client, link.router_ns, link.store_ns
        veth_hint = "The kernel needs veth (CONFIG_VETH)."
        r(["ip", "link", "add", link.client_dev, "netns", cli, "type", "veth", "peer", "name",
           ROUTER_CLIENT_DEV, "netns", rtr], f"create the client veth pair ({link.name})",
          veth_hint)  # fmt: skip
        r(["ip", "link", "add", STORE_DEV, "netns", srv, "type", "veth", "peer", "name", ROUTER_STORE_DEV,
           "netns", rtr], f"create the store veth pair ({link.name})", veth_hint)  # fmt: skip
        addrs = (
            (cli, link.client_dev, link.client_ip),
            (rtr, ROUTER_CLIENT_DEV, link.router_client_ip),
            (rtr, ROUTER_STORE_DEV, link.router_store_ip),
            (srv, STORE_DEV, link.store_ip),
        )
        for ns, dev, ip in addrs:
            r(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev], "address a veth")
            r(["ip", "-n", ns, "link", "set", dev, "up"], "bring a veth up")
        cc_hint = f"The kernel needs TCP congestion control '{TCP_CC}' (tcp_{TCP_CC})."
        r(["ip", "-n", cli, "route", "add", link.client_route, "via", link.router_client_ip, "congctl",
           TCP_CC], f"route the client side through the router ({link.name})", cc_hint)  # fmt: skip
        r(["ip", "-n", srv, "route", "add", "default", "via", link.router_store_ip, "congctl", TCP_CC],
          f"route the store side through the router ({link.name})", cc_hint)  # fmt: skip
        r(["ip", "netns", "exec", rtr, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
          "enable forwarding on the router")  # fmt: skip
        r(["ip", "-n", rtr, "link", "add", IFB_DEV, "type", "ifb"], "create the ifb device",
          "The kernel needs ifb (CONFIG_IFB; `modprobe ifb`).")  # fmt: skip
        r(["ip", "-n", rtr, "link", "set", IFB_DEV, "up"], "bring the ifb device up")

    def start_store(self) -> None:
        stores: list[tuple[str, str, int, Sequence[str], Sequence[str]]] = [
            ("seaweedfs", STORE_IP, STORE_S3_PORT, ["ip", "netns", "exec", self.ns_store],
             (DATASET_BUCKET, CHECKPOINT_BUCKET)),
        ]  # fmt: skip
        if self.ckpt_store:
            stores.append(
                ("seaweedfs-ckpt", CKPT_STORE_IP, STORE_S3_PORT,
                 ["ip", "netns", "exec", self._links[1].store_ns], (CHECKPOINT_BUCKET,))
            )  # fmt: skip
        urls = self._start_weeds(stores)
        self.store_url = self.setup_url = urls[0]
        if self.ckpt_store:
            self.ckpt_store_url = urls[1]

    def shape(self) -> None:
        r, s = self._run, self.spec
        rate = f"{round(s.rate_bps * 8)}bit"
        for link in self._links:
            rtr = link.router_ns
            r(["tc", "-n", rtr, "qdisc", "add", "dev", IFB_DEV, "root", "tbf", "rate", rate,
               "burst", str(s.burst_bytes), "limit", str(s.depth_bytes)], "add the tbf FIFO",
              "The kernel needs tbf (CONFIG_NET_SCH_TBF).")  # fmt: skip
            for dev in (ROUTER_CLIENT_DEV, ROUTER_STORE_DEV):
                r(["tc", "-n", rtr, "qdisc", "add", "dev", dev, "clsact"], "add a clsact qdisc",
                  "The kernel needs clsact (CONFIG_NET_SCH_INGRESS).")  # fmt: skip
                r(["tc", "-n", rtr, "filter", "add", "dev", dev, "egress", "protocol", "all", "prio", "1",
                   "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", IFB_DEV],
                  "redirect the router's egress into the ifb",
                  "The kernel needs u32 and mirred (CONFIG_NET_CLS_U32, CONFIG_NET_ACT_MIRRED).")  # fmt: skip

    def client_argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns_client, *argv]

    def sample(self) -> dict[str, WireSample]:
        return {link.name: self._sample_link(link.router_ns) for link in self._links}

    def _sample_link(self, router_ns: str) -> WireSample:
        at = time.monotonic()
        links = json.loads(self._run(["ip", "-n", router_ns, "-s", "-j", "link", "show"], "read counters"))
        tx = {ln["ifname"]: int(ln["stats64"]["tx"]["bytes"]) for ln in links}
        qdiscs = json.loads(
            self._run(["tc", "-n", router_ns, "-s", "-j", "qdisc", "show", "dev", IFB_DEV], "read the FIFO")
        )
        tbf: dict[str, Any] = next((q for q in qdiscs if q.get("kind") == "tbf"), {})
        return WireSample(
            at=at,
            up_bytes=tx.get(ROUTER_STORE_DEV, 0),
            down_bytes=tx.get(ROUTER_CLIENT_DEV, 0),
            backlog_bytes=int(tbf.get("backlog", 0)),
            drops=int(tbf.get("drops", 0)),
        )

    def _layout(self) -> tuple[str, str, str]:
        topology = (
            f"{self.ns_client} {CLIENT_IP} (clients, gateway, spool) -- {self.ns_router} "
            f"(one tbf FIFO via ifb, both directions) -- {self.ns_store} {STORE_IP} (SeaweedFS)"
        )
        store = f"SeaweedFS (weed mini) at {self.store_url}"
        if self.ckpt_store:
            ck = self._links[1]
            topology += (
                f"; second store (checkpoint pool): {self.ns_client} {ck.client_ip} -- {ck.router_ns} "
                f"(its own tbf FIFO, same rate and depth) -- {ck.store_ns} {ck.store_ip} (SeaweedFS)"
            )
            store += f"; second SeaweedFS at {self.ckpt_store_url}"
        return topology, store, f"{TCP_CC} (pinned per route)"

    def _teardown_network(self) -> None:
        problems: list[str] = []
        for ns in reversed(self._created):
            try:
                self._delete_namespace(ns)
            except TestbedError as exc:
                problems.append(str(exc))
        self._created.clear()
        if problems:
            print("testbed teardown problems:\n" + "\n".join(problems), file=sys.stderr, flush=True)


class ModelTestbed(Testbed):
    kind = "model"

    def __init__(self, spec: BottleneckSpec, work_dir: Path, ckpt_store: bool = False) -> None:
        super().__init__(spec, work_dir, ckpt_store)
        self._stats_paths = {link: work_dir / f"relay-{link}" / "stats.json" for link in self.links}
        self._weed_urls: list[str] = []

    def up(self) -> None:
        self._register_atexit()

    def start_store(self) -> None:
        stores: list[tuple[str, str, int, Sequence[str], Sequence[str]]] = [
            ("seaweedfs", "127.0.0.1", 0, [], (DATASET_BUCKET, CHECKPOINT_BUCKET)),
        ]
        if self.ckpt_store:
            stores.append(("seaweedfs-ckpt", "127.0.0.1", 0, [], (CHECKPOINT_BUCKET,)))
        self._weed_urls = self._start_weeds(stores)
        relays = [self._start_relay(link, url) for link, url in zip(self.links, self._weed_urls, strict=True)]
        self.store_url = relays[0]
        self.setup_url = self._weed_urls[0]
        if self.ckpt_store:
            self.ckpt_store_url = relays[1]

    def _start_relay(self, link: str, weed_url: str) -> str:
        d = self.work_dir / f"relay-{link}"
        d.mkdir(parents=True, exist_ok=True)
        ready = d / "ready.json"
        target = weed_url.removeprefix("http://")
        argv = [
            sys.executable, "-m", "loadtests.contention.testbed", "_relay", "--listen", "127.0.0.1:0",
            "--target", target, "--rate-bps", str(self.spec.rate_bps), "--depth-bytes",
            str(self.spec.depth_bytes), "--burst-bytes", str(self.spec.burst_bytes), "--ready-file",
            str(ready), "--stats-file", str(self._stats_paths[link]),
        ]  # fmt: skip
        child = spawn("relay" if link == LINK_DATA else f"relay-{link}", argv, d / "relay.log")
        self.children.append(child)
        doc = wait_ready_file(child, ready, RELAY_START_TIMEOUT_S, f"the FIFO relay ({link})")
        return f"http://127.0.0.1:{int(doc['port'])}"

    def shape(self) -> None:
        return None  # the relay shapes from its start; the dataset is loaded around it (setup_url)

    def client_argv(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def sample(self) -> dict[str, WireSample]:
        return {link: self._sample_link(path) for link, path in self._stats_paths.items()}

    @staticmethod
    def _sample_link(path: Path) -> WireSample:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return WireSample(time.monotonic(), 0, 0, 0, 0)
        return WireSample(
            at=float(doc["at"]),
            up_bytes=int(doc["up_bytes"]),
            down_bytes=int(doc["down_bytes"]),
            backlog_bytes=int(doc["backlog_bytes"]),
            drops=0,
        )

    def _layout(self) -> tuple[str, str, str]:
        topology = (
            "clients, gateway, spool -- asyncio FIFO relay (one queue, both directions, loopback) -- "
            "SeaweedFS on 127.0.0.1"
        )
        store = f"SeaweedFS (weed mini) at {self.setup_url}, behind the relay at {self.store_url}"
        if self.ckpt_store:
            topology += "; second store (checkpoint pool): its own relay (same rate and depth) -- SeaweedFS"
            store += f"; second SeaweedFS at {self._weed_urls[1]}, behind its relay at {self.ckpt_store_url}"
        return topology, store, "kernel default (loopback; the relay's FIFO does the queueing)"


def make_testbed(kind: str, spec: BottleneckSpec, work_dir: Path, ckpt_store: bool = False) -> Testbed:
    if kind == "netns":
        return NetnsTestbed(spec, work_dir, ckpt_store)
    if kind == "model":
        return ModelTestbed(spec, work_dir, ckpt_store)
    raise ValueError(f"unknown testbed {kind!r}")


# --------------------------------------------------------------------------------------------------------
# The SeaweedFS agent (runs inside the store's namespace)


def weed_agent_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="testbed _weed")
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--ip", required=True)
    p.add_argument("--s3-port", type=int, required=True)
    p.add_argument("--ready-file", type=Path, required=True)
    p.add_argument("--bucket", action="append", default=[])
    a = p.parse_args(argv)
    stop_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    # Blocked before the start, so a stop request during it is seen (pending) right after.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    weed = SeaweedProcess(
        SeaweedOptions(
            state_dir=a.state_dir,
            identities=(STORE_IDENTITY,),
            ip=a.ip,
            s3_port=a.s3_port,
            buckets=tuple(a.bucket),
        )
    )
    try:
        weed.start()
        write_json_atomic(
            a.ready_file, {"agent_pid": os.getpid(), "weed_pid": weed.pid, "endpoint": weed.endpoint_url}
        )
        while weed.returncode is None:
            if signal.sigtimedwait(stop_signals, 0.5) is not None:
                break
        if weed.returncode is not None:
            print(f"weed exited with code {weed.returncode}:\n{weed.log_tail()}", file=sys.stderr)
            return 1
        return 0
    finally:
        weed.stop(timeout_s=15.0)


# --------------------------------------------------------------------------------------------------------
# The model's FIFO relay


@dataclass(slots=True)
class FifoLink:
    """One FIFO served at ``rate_bps``: a chunk admitted now leaves when everything admitted before it has
    left, at the link rate (with ``burst_bytes`` of credit after idle time, like tbf). At most
    ``depth_bytes`` are queued; further chunks wait, in arrival order, for room (TCP backpressure)."""

    rate_bps: float
    depth_bytes: int
    burst_bytes: int
    queued_bytes: int = 0
    max_backlog_bytes: int = 0
    sent: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    _next_free: float = 0.0
    _admit: asyncio.Lock = field(default_factory=asyncio.Lock)
    _room: asyncio.Event = field(default_factory=asyncio.Event)

    async def enqueue(self, nbytes: int, direction: str) -> float:
        """Admit ``nbytes``; returns the loop time at which they leave the FIFO."""
        loop = asyncio.get_running_loop()
        async with self._admit:  # asyncio.Lock is FIFO: chunks are admitted in arrival order
            while self.queued_bytes > 0 and self.queued_bytes + nbytes > self.depth_bytes:
                self._room.clear()
                await self._room.wait()
            now = loop.time()
            self._next_free = (
                max(self._next_free, now - self.burst_bytes / self.rate_bps) + nbytes / self.rate_bps
            )
            self.queued_bytes += nbytes
            self.max_backlog_bytes = max(self.max_backlog_bytes, self.queued_bytes)
            due = max(now, self._next_free)
            loop.call_at(due, self._left, nbytes, direction)
            return due

    def _left(self, nbytes: int, direction: str) -> None:
        self.queued_bytes -= nbytes
        self.sent[direction] += nbytes
        self._room.set()


async def _pump(
    link: FifoLink, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Copy ``reader`` to ``writer`` through ``link``; half-close ``writer`` at EOF."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(RELAY_PUMP_QUEUE_CHUNKS)

    async def feed() -> None:
        try:
            while data := await reader.read(RELAY_READ_BYTES):
                due = await link.enqueue(len(data), direction)
                await queue.put((due, data))
        finally:
            await queue.put(None)  # the deliverer below keeps taking until it sees this

    feeder = asyncio.create_task(feed())
    try:
        while (item := await queue.get()) is not None:
            due, data = item
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
        await feeder  # raises what the reading side failed with: the connection is then over
        if writer.can_write_eof():
            writer.write_eof()
    finally:
        if not feeder.done():
            feeder.cancel()
            with contextlib.suppress(BaseException):
                await feeder


async def relay_serve(
    listen: str, target: str, link: FifoLink, ready_file: Path, stats_file: Path, stop: asyncio.Event
) -> None:
    t_host, _, t_port = target.rpartition(":")

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(t_host, int(t_port))
        except OSError:
            c_writer.close()
            return
        for w in (c_writer, s_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pumps = [
            asyncio.create_task(_pump(link, "up", c_reader, s_writer)),
            asyncio.create_task(_pump(link, "down", s_reader, c_writer)),
        ]
        try:
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:  # one side failed: the connection is over
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for w in (c_writer, s_writer):
                w.close()

    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(handle, host, int(port))
    bound = server.sockets[0].getsockname()[1]
    write_json_atomic(ready_file, {"pid": os.getpid(), "port": bound})
    async with server:
        while not stop.is_set():
            write_json_atomic(
                stats_file,
                {
                    "at": time.monotonic(),
                    "up_bytes": link.sent["up"],
                    "down_bytes": link.sent["down"],
                    "backlog_bytes": link.queued_bytes,
                    "max_backlog_bytes": link.max_backlog_bytes,
                },
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RELAY_STATS_INTERVAL_S)


def relay_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="testbed _relay")
    p.add_argument("--listen", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--rate-bps", type=float, required=True)
    p.add_argument("--depth-bytes", type=int, required=True)
    p.add_argument("--burst-bytes", type=int, required=True)
    p.add_argument("--ready-file", type=Path, required=True)
    p.add_argument("--stats-file", type=Path, required=True)
    a = p.parse_args(argv)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        link = FifoLink(a.rate_bps, a.depth_bytes, a.burst_bytes)
        await relay_serve(a.listen, a.target, link, a.ready_file, a.stats_file, stop)

    # Plain asyncio, not uvloop: its loop.time() has millisecond resolution, and a 64 KiB chunk at 40 MB/s
    # takes 1.6 ms on the link.
    asyncio.run(main())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["_weed"]:
        return weed_agent_main(args[1:])
    if args[:1] == ["_relay"]:
        return relay_main(args[1:])
    print("usage: python -m loadtests.contention.testbed {_weed|_relay} ... (started by the benchmark)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
