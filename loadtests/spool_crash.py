"""The spool crash test, for longer runs: SIGKILL the gateway under a checkpoint workload, again and again,
then check that the backend holds exactly what the acknowledged operations say.

    python -m loadtests.spool_crash --iterations 200 [--ops N] [--seed S] [--keep]

It starts its own SeaweedFS (in a temporary directory, removed at the end unless ``--keep``) and runs the
workload and model of :mod:`loadtests.crashmodel` (the suite's ``tests/e2e/test_spool_crash.py`` runs the
same code with 30 kills). ``--iterations`` is the number of SIGKILLs; the workload keeps going until both
that many kills and ``--ops`` operations are done. It prints a summary (operations acknowledged, kills,
recovery statistics read from the gateway logs, the verdict) and exits 1 on any mismatch, 2 if it could not
run at all.

``--stall`` kills the gateway only while the store is frozen (SIGSTOP on SeaweedFS for ``--stall-min-s`` to
``--stall-max-s``), resuming it before or after the restart: a drain request of an older state left in the
store's socket is applied after the newer state the restarted gateway sent, and the spool's fencing must
put the newest state back before flush answers durable (see :mod:`loadtests.crashmodel`). After every such
kill the workload pauses, the bucket is flushed and the store, read directly, must hold an acceptable state
of every key and no drain upload (a state put back late would otherwise be hidden by later writes).

``--gateway-source DIR`` runs ``python -m s3lanes`` from another checkout (e.g. one with a fix applied)
while the driver itself stays this one.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import boto3
import botocore.handlers
from botocore.config import Config as BotoConfig

import s3lanes
from loadtests.crashmodel import REGION, CrashConfig, run_crash
from loadtests.harness.cli import from_namespace
from s3lanes.seaweed.options import SeaweedIdentity, SeaweedOptions
from s3lanes.seaweed.process import SeaweedProcess

BUCKET = "crash"
ACCESS_KEY = "CRASHTESTACCESSKEY01"
GATEWAY_SOURCE = Path(s3lanes.__file__).resolve().parent.parent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.spool_crash", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--iterations", type=int, default=200, help="SIGKILLs of the gateway (default 200)")
    p.add_argument("--ops", type=int, default=200, help="at least this many operations (default 200)")
    p.add_argument("--seed", type=int, default=None, help="workload and kill schedule seed (default: random)")
    p.add_argument("--workers", type=int, default=3, help="client threads, each on its own keys (default 3)")
    p.add_argument("--keys-per-worker", type=int, default=7, help="keys of each worker (default 7)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop the kill phase after this long (default: 5 s per iteration + 2 min)",
    )
    p.add_argument("--stall", action="store_true", help="kill only while the store is frozen (SIGSTOP)")
    p.add_argument("--stall-min-s", type=float, default=2.0, help="shortest stall (default 2)")
    p.add_argument("--stall-max-s", type=float, default=6.0, help="longest stall (default 6)")
    p.add_argument(
        "--fence-s", type=float, default=5.0, help="the gateway's [spool] fence_s (default 5; 0: no wait)"
    )
    p.add_argument(
        "--gateway-workers",
        type=int,
        default=1,
        help="the gateway's [server] workers (default 1); a kill takes the supervisor and all workers",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, spool, SeaweedFS)")
    p.add_argument(
        "--gateway-source",
        type=Path,
        default=GATEWAY_SOURCE,
        help="directory to run `python -m s3lanes` from (default: this checkout)",
    )
    args = p.parse_args(argv)
    if args.iterations < 0 or args.ops < 0 or args.workers < 1 or args.keys_per_worker < 2:
        p.error("need --iterations >= 0, --ops >= 0, --workers >= 1, --keys-per-worker >= 2")
    return args


def _stall(weed: SeaweedProcess, frozen: bool) -> None:
    """SIGSTOP (or SIGCONT) the SeaweedFS of this run, by its pid."""
    if weed.pid is not None and weed.returncode is None:
        os.kill(weed.pid, signal.SIGSTOP if frozen else signal.SIGCONT)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    per_kill_s = 5.0 + (args.stall_max_s if args.stall else 0.0)
    max_s = args.max_minutes * 60 if args.max_minutes is not None else per_kill_s * args.iterations + 120
    # The options of the same names, and these:
    given = {"kills": args.iterations, "seed": seed, "max_kill_phase_s": max_s, "check_each_kill": args.stall}
    cfg = from_namespace(CrashConfig, args, **given)
    work = Path(tempfile.mkdtemp(prefix="s3lanes-spool-crash-"))
    stalls = f", store stalled {cfg.stall_min_s:g}-{cfg.stall_max_s:g} s at every kill" if cfg.stall else ""
    print(f"spool crash run: {cfg.kills} kills{stalls}, >= {cfg.ops} operations, seed {seed}")
    print(f"work dir {work}")
    print(f"gateway source: {args.gateway_source}")
    ident = SeaweedIdentity("crash", ACCESS_KEY, secrets.token_urlsafe(30))
    weed = SeaweedProcess(
        SeaweedOptions(state_dir=work / "seaweedfs", identities=(ident,), buckets=(BUCKET,))
    )
    started = time.monotonic()
    ok = False
    try:
        try:
            weed.start()
        except Exception as exc:
            print(f"could not start SeaweedFS: {exc}", file=sys.stderr)
            return 2
        backend = boto3.client(
            "s3",
            endpoint_url=weed.endpoint_url,
            aws_access_key_id=ident.access_key,
            aws_secret_access_key=ident.secret_key,
            config=BotoConfig(
                region_name=REGION,
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"max_attempts": 3, "mode": "standard"},
            ),
        )
        # SeaweedFS answers an empty PUT with Expect: 100-continue without the interim 100 (tests/conftest).
        backend.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
        try:
            report = run_crash(
                cfg,
                work_dir=work,
                backend_endpoint=weed.endpoint_url,
                access_key=ident.access_key,
                secret_key=ident.secret_key,
                bucket=BUCKET,
                backend=backend,
                gateway_cwd=args.gateway_source,
                say=lambda text: print(text, flush=True),
                stall_store=functools.partial(_stall, weed),
            )
        finally:
            backend.close()
        print()
        print(report.summary())
        wall_s = time.monotonic() - started
        print(f"seed {seed}; wall time {wall_s:.0f} s; gateway logs in {work / 'gateway'}")
        ok = report.ok
        return 0 if ok else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        with contextlib.suppress(OSError):
            _stall(weed, False)
        weed.stop()
        if args.keep or not ok:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
