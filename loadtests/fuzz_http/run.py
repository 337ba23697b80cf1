"""The run: start the stack, run the cases, restart a crashed gateway, the end checks (:func:`fuzz`)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.fuzz_http.case import Case
from loadtests.fuzz_http.endchecks import (
    EndReport,
    check_backend,
    cleanup_bucket,
    flush,
    scan_log,
    spool_status,
)
from loadtests.fuzz_http.findings import Figures
from loadtests.fuzz_http.kinds import pick_kind
from loadtests.fuzz_http.options import (
    _WEED_SOCKET_RE,
    ACCESS_KEY,
    GATEWAY_SOURCE,
    MAX_RESTARTS,
    BackendSpec,
    FuzzError,
    Options,
)
from loadtests.fuzz_http.runstate import Run
from loadtests.fuzz_http.stack import (
    Stack,
    s3_client,
    snapshot,
    spool_layout_violations,
    start_gateway,
    stop_gateway,
)
from loadtests.harness.store import seaweed
from s3lanes.seaweed.process import SeaweedProcess

# --------------------------------------------------------------------------------------------------------
# The run


@dataclass(slots=True)
class Result:
    opts: Options
    figures: Figures
    report: EndReport
    run: Run
    seconds: float
    started_utc: str

    @property
    def ok(self) -> bool:
        return not self.figures.failed()

    def as_json(self) -> dict[str, Any]:
        f = self.figures
        findings = sorted(self.run.findings.values(), key=lambda x: (-_severity(x.category), -x.count))
        return {
            "command": self.opts.command,
            "started_utc": self.started_utc,
            "commit": git_commit(),
            "gateway_source": str(self.opts.gateway_source),
            "seconds": round(self.seconds, 1),
            "seed": self.opts.seed,
            "python": sys.version.split()[0],
            "figures": dataclasses.asdict(f),
            "must_be_zero": {name: getattr(f, name) for name in f.MUST_BE_ZERO},
            "failed": f.failed(),
            "cases_per_kind": dict(sorted(self.run.kinds.items())),
            "answers_per_kind": {k: dict(sorted(v.items())) for k, v in sorted(self.run.answers.items())},
            "end": dataclasses.asdict(self.report),
            "findings": [dataclasses.asdict(x) for x in findings],
        }


_SEVERITY = {
    "500 answer": 9,
    "read back mismatch": 9,
    "desynced": 9,
    "wrong answers": 8,
    "harness error": 8,
    "timeout": 7,
    "no answer": 6,
    "error without S3 XML": 5,
    "503 answer": 5,
    "unexpected answer": 3,
    "HTTP parser answer": 1,
}


def _severity(category: str) -> int:
    return _SEVERITY.get(category, 4)


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=GATEWAY_SOURCE, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD") or "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


async def run_cases(
    run: Run, stack: Stack, indices: Sequence[int], concurrency: int, say: Callable[[str], None]
) -> None:
    """Run the cases, ``concurrency`` at a time. A dead gateway is a crash: recorded (with the cases that
    were in flight, the suspects), then restarted on the same state directory so the run goes on (its
    recovery replays the journal; the backend check at the end covers what the crash may have lost)."""
    queue = list(reversed(indices))
    started = time.monotonic()
    last_report = started
    restart_lock = asyncio.Lock()
    gateway_up = asyncio.Event()  # cleared while a dead gateway is being restarted: no new case starts then
    gateway_up.set()

    async def after_death(index: int, kind: str) -> None:
        async with restart_lock:
            if stack.alive():
                return  # another worker restarted it already
            gateway_up.clear()
            try:
                await restart(index, kind)
            finally:
                gateway_up.set()

    async def restart(index: int, kind: str) -> None:
        stop_gateway(stack)
        tail = stack.log_path.read_text(errors="replace").splitlines()[-6:]
        in_flight = sorted(run.in_flight | {index})
        run.crashes.append(
            {
                "detected_after_case": index,
                "kind": kind,
                "in_flight": in_flight,
                "exit_code": stack.exit_code,
                "log_tail": tail,
            }
        )
        run.figures.crashes += 1
        run.generation += 1  # from now on, cases still in flight count as interrupted
        say(f"the gateway died (exit code {stack.exit_code}) with cases {in_flight} in flight")
        if len(run.crashes) > MAX_RESTARTS:
            run.stopped = f"more than {MAX_RESTARTS} crashes"
            return
        try:
            await asyncio.to_thread(start_gateway, stack)
        except FuzzError as exc:
            run.stopped = f"the gateway did not restart: {exc}"
            return
        run.port = stack.port
        run.host_header = f"{run.host}:{run.port}"

    async def worker() -> None:
        nonlocal last_report
        while queue and not run.stopped:
            await gateway_up.wait()
            if not queue or run.stopped:
                break
            index = queue.pop()
            kind, fn = pick_kind(run.opts.seed, index, run.opts.kinds)
            case = Case(run, index)
            case.kind = kind
            run.kinds[kind] += 1
            generation = run.generation
            run.in_flight.add(index)
            try:
                await fn(case)
            except Exception as exc:
                if isinstance(exc, OSError) and stack.alive():
                    await asyncio.sleep(1.0)  # a dying gateway closes its listener before it exits
                if generation != run.generation or not stack.alive():
                    run.figures.cases_interrupted += 1  # by a crash: not the harness's fault
                    run.ledger.open_uploads.update(case.uploads)  # it may not have ended them
                else:  # a bug of this harness: counted, never hidden
                    run.harness_error(case, exc)
                    if run.opts.verbose:
                        import traceback

                        traceback.print_exc()
            finally:
                await case.close()
                if case.saw_no_answer and stack.alive():
                    await asyncio.sleep(1.0)  # a connection cut by a dying gateway: let it finish dying
                run.in_flight.discard(index)
                if generation != run.generation or not stack.alive():
                    run.ledger.open_uploads.update(case.uploads)  # a crash may have kept it from ending them
                    run.ledger.crash_cut_prefixes.add(case.prefix)  # or from learning an upload's id
            run.figures.cases_run += 1
            if not stack.alive():
                await after_death(index, kind)
            now = time.monotonic()
            if now - last_report > 15:
                last_report = now
                f = run.figures
                say(
                    f"  {f.cases_run}/{len(indices)} cases, {f.requests} requests, {now - started:.0f} s; "
                    f"crashes {f.crashes}, 500s {f.answers_500}, "
                    f"read-back mismatches {f.read_back_mismatch}, "
                    f"harness errors {f.harness_errors}"
                )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def fuzz(opts: Options, *, work_dir: Path | None = None, say: Callable[[str], None] = print) -> Result:
    """The whole run. Starts (and always stops) the gateway, and SeaweedFS unless ``opts.backend`` is one."""
    began = time.monotonic()
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    marker = "fzq" + hashlib.sha256(f"fuzz-http-{opts.seed}".encode()).hexdigest()[:8]
    own_tmp = work_dir is None
    root = Path(tempfile.mkdtemp(prefix="s3lanes-fuzz-", dir=opts.tmp_dir)) if work_dir is None else work_dir
    root.mkdir(parents=True, exist_ok=True)
    bucket = f"fuzz-{marker}"
    weed: SeaweedProcess | None = None
    backend = opts.backend
    stack: Stack | None = None
    try:
        if backend is None:
            secret = secrets.token_urlsafe(30)
            weed = seaweed(root / "seaweedfs", "fuzz", ACCESS_KEY, secret, (bucket,))
            say("starting SeaweedFS ...")
            weed.start()
            backend = BackendSpec(weed.endpoint_url, ACCESS_KEY, secret)
        else:
            s3 = s3_client(backend)
            try:
                s3.create_bucket(Bucket=bucket)
            finally:
                s3.close()
        stack = Stack(
            root=root,
            backend=backend,
            weed=weed,
            state_dir=root / "state",
            spool_dir=root / "state" / "spool",
            run_dir=root / "harness",
            gateway_cwd=root / "gateway-cwd",
            gateway_tmp=root / "gateway-tmp",
            gateway_source=opts.gateway_source,
        )
        for d in (stack.run_dir, stack.gateway_cwd, stack.gateway_tmp):
            d.mkdir(parents=True, exist_ok=True)
        before = snapshot(stack, marker)
        start_gateway(stack)
        say(
            f"gateway pid {stack.proc.pid if stack.proc else '?'} on {stack.host}:{stack.port}, "
            f"spool {stack.spool_dir}"
        )
        run = Run(opts, stack.host, stack.port, bucket, marker, backend.secret_key)
        run.gateway_alive = stack.alive
        indices = list(opts.only_cases) if opts.only_cases else list(range(opts.cases))
        say(f"running {len(indices)} cases (seed {opts.seed}, concurrency {opts.concurrency}) ...")
        asyncio.run(run_cases(run, stack, indices, opts.concurrency, say))
        report = EndReport()
        if stack.alive():
            say("flushing the spool ...")
            report.flush = asyncio.run(flush(run))
            if not report.flush.get("durable"):
                report.spool_status = asyncio.run(spool_status(run))
            check_backend(run, backend, report)
        stop_gateway(stack)
        report.gateway_exit_code = stack.exit_code
        if stack.exit_code not in (0, None):
            run.figures.crashes += 1
            run.crashes.append(
                {"detected_after_case": None, "kind": "shutdown", "exit_code": stack.exit_code}
            )
        after = snapshot(stack, marker)
        report.new_files = sorted(
            (after.run_tree - before.run_tree)
            | (after.marked - before.marked)
            | set(spool_layout_violations(stack))
        )
        report.unattributed_new_entries = sorted(
            n
            for n in (after.tmp_top - before.tmp_top) | (after.cwd_top - before.cwd_top)
            if not _WEED_SOCKET_RE.match(n)
        )
        report.tracebacks = [tb for log in stack.logs for tb in scan_log(log)]
        if opts.out is not None and not opts.only_cases:
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            for i, log in enumerate(stack.logs, start=1):
                copy = opts.out.with_name(f"{opts.out.stem}.gateway-{i}.log")
                copy.write_bytes(log.read_bytes())
                report.gateway_logs.append(str(copy))
        report.crashes = run.crashes
        report.stopped_early = run.stopped
        f = run.figures
        f.files_outside_spool = len(report.new_files)
        f.partial_objects = len(report.partial)
        f.backend_mangled_keys += len(report.mangled)
        f.missing_objects = len(report.missing)
        f.open_uploads_unexpected = len(report.open_uploads)
        f.tracebacks = len(report.tracebacks)
        f.tracebacks_from_parser = sum(1 for t in report.tracebacks if t["origin"] != "gateway")
        if opts.backend is not None:
            report.cleanup_error = cleanup_bucket(backend, bucket)
        return Result(opts, f, report, run, time.monotonic() - began, started_utc)
    finally:
        if stack is not None:
            stop_gateway(stack)
        if weed is not None:
            weed.stop()
        if own_tmp and not opts.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        elif own_tmp:
            say(f"kept {root}")
