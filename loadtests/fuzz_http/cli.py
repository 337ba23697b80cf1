"""The command line (``python -m loadtests.fuzz_http --help``); :func:`main` runs and reports."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from loadtests.fuzz_http.kinds import KINDS
from loadtests.fuzz_http.options import (
    FULL_CASES,
    GATEWAY_SOURCE,
    QUICK_CASES,
    BackendSpec,
    FuzzError,
    Options,
)
from loadtests.fuzz_http.report import summary
from loadtests.fuzz_http.run import fuzz
from loadtests.harness.cli import bench_parser


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = bench_parser(
        "fuzz_http",
        "s3lanes under hostile HTTP input: malformed requests against a real gateway with the "
        "write spool on, mixed with valid signed ones; checks crashes, 500s, files outside the spool, "
        "partial objects on the backend and lost writes.",
        f"the CI subset: {QUICK_CASES} cases",
    )
    p.add_argument("--cases", type=int, help=f"cases to run ({FULL_CASES}; --quick {QUICK_CASES})")
    p.add_argument("--seed", type=int, help="random seed (default: a fresh one, printed)")
    p.add_argument("--out", type=Path, help="JSON results (default results/fuzz-http-<timestamp>.json)")
    p.add_argument("--no-out", action="store_true", help="write no JSON")
    p.add_argument("--concurrency", type=int, default=4, help="cases in flight at once (4)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, spool)")
    p.add_argument("--backend-endpoint", help="use this running S3 store instead of starting SeaweedFS")
    p.add_argument("--backend-access-key", help="its access key (with --backend-endpoint)")
    p.add_argument(
        "--backend-secret-key",
        default=os.environ.get("FUZZ_HTTP_BACKEND_SECRET_KEY"),
        help="its secret key (with --backend-endpoint; default: $FUZZ_HTTP_BACKEND_SECRET_KEY)",
    )
    p.add_argument(
        "--only-case",
        action="append",
        type=int,
        default=[],
        help="run only this case index (repeatable; with the run's --seed this replays it) and print "
        "every exchange",
    )
    p.add_argument("--verbose", action="store_true", help="print every exchange")
    p.add_argument("--kinds", help="only these case kinds, comma-separated (see KINDS; default: all)")
    p.add_argument(
        "--gateway-source",
        type=Path,
        default=GATEWAY_SOURCE,
        help="run the gateway from this source tree (e.g. a `git archive` of one commit, so that edits to "
        "the working tree during the run cannot reach the gateway's restarts); default: this checkout",
    )
    a = p.parse_args(argv)
    cases = a.cases if a.cases is not None else (QUICK_CASES if a.quick else FULL_CASES)
    if cases <= 0 or a.concurrency <= 0:
        p.error("--cases and --concurrency must be positive")
    backend = None
    if a.backend_endpoint:
        if not a.backend_access_key or not a.backend_secret_key:
            p.error("--backend-endpoint needs --backend-access-key and --backend-secret-key")
        backend = BackendSpec(a.backend_endpoint, a.backend_access_key, a.backend_secret_key)
    seed = a.seed if a.seed is not None else secrets.randbelow(2**31)
    out = None
    if not a.no_out:
        out = a.out or Path("results") / f"fuzz-http-{time.strftime('%Y%m%d-%H%M%S')}.json"
    words = ["python -m loadtests.fuzz_http", *(["--quick"] if a.quick else [])]
    words += ["--cases", str(cases), "--seed", str(seed), "--concurrency", str(a.concurrency)]
    if a.kinds:
        unknown = {k.strip() for k in a.kinds.split(",") if k.strip()} - {name for name, _, _ in KINDS}
        if unknown:
            p.error(f"unknown case kinds: {sorted(unknown)}")
        words += ["--kinds", a.kinds]
    if a.gateway_source != GATEWAY_SOURCE:
        words += ["--gateway-source", str(a.gateway_source)]
    return Options(
        cases=cases,
        seed=seed,
        quick=a.quick,
        out=out,
        concurrency=a.concurrency,
        tmp_dir=a.tmp_dir,
        keep=a.keep,
        backend=backend,
        only_cases=tuple(a.only_case),
        verbose=a.verbose or bool(a.only_case),
        command=" ".join(words),
        gateway_source=a.gateway_source.resolve(),
        kinds=tuple(k.strip() for k in (a.kinds or "").split(",") if k.strip()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        result = fuzz(opts)
    except FuzzError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(result))
    if opts.out is not None and not opts.only_cases:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(result.as_json(), indent=1, ensure_ascii=False, default=str) + "\n")
        print(f"wrote {opts.out}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
