"""Run a headless Locust load test and keep everything it produced in one results directory.

::

    python -m loadtests.run_locust --host http://127.0.0.1:9000 --bucket train --prep -t 10m \\
        --label gateway -- --readers 16 --ckpt-writers 4 --ckpt-size 2GiB --ckpt-period-s 60

Steps: (1) with ``--prep``, ``python -m loadtests.dataprep`` makes sure the dataset exists (same bucket,
prefix, object count and size as the readers use); (2) ``python -m locust -f <shape's locustfile>
--headless --csv <dir>/locust --html <dir>/report.html ...`` runs, with ``--workers N`` as a master and N
local worker processes (Locust's ``--processes``); (3) the directory gets ``command.txt`` (the exact
commands) and ``locust.log``. Locust's CSVs are ``locust_stats.csv``, ``locust_stats_history.csv``,
``locust_failures.csv``, ``locust_exceptions.csv``; the phase statistics ``locust_phases.csv`` and
``locust_bursts.csv`` (docs/loadtests.md). Arguments after ``--`` go to Locust unchanged.

Credentials come from the environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), as for Locust.
The exit code is Locust's (1 if any request failed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from loadtests.dataprep import DEFAULT_OBJECT_SIZE, DEFAULT_OBJECTS, DEFAULT_PREFIX

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCUSTFILES = {
    "training": HERE / "locustfile_training.py",
    "step": HERE / "locustfile_step.py",
    "none": HERE / "locustfile.py",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.run_locust",
        description="Headless Locust run against an S3 endpoint, results in one directory.",
        epilog="Arguments after -- are passed to Locust (e.g. -- --readers 16 --ckpt-period-s 30).",
    )
    p.add_argument("--host", required=True, help="S3 endpoint: the gateway, or the store for a direct run")
    p.add_argument("--shape", choices=sorted(LOCUSTFILES), default="training")
    p.add_argument("--results", type=Path, default=Path("results/locust"), help="parent directory")
    p.add_argument("--label", default="run", help="name of this run's directory (plus a timestamp)")
    p.add_argument("-t", "--run-time", default="5m", help="Locust --run-time")
    p.add_argument("-u", "--users", type=int, default=None, help="--shape none: total users")
    p.add_argument("-r", "--spawn-rate", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=0, help="local worker processes (0: one process)")
    p.add_argument("--bucket", default=os.environ.get("LOCUST_S3_BUCKET", "locust"))
    p.add_argument("--dataset-prefix", default=DEFAULT_PREFIX)
    p.add_argument("--dataset-objects", type=int, default=DEFAULT_OBJECTS)
    p.add_argument("--dataset-object-size", default=DEFAULT_OBJECT_SIZE)
    p.add_argument("--prep", action="store_true", help="run loadtests.dataprep first")
    return p


def commands(args: argparse.Namespace, out_dir: Path, extra: Sequence[str]) -> list[list[str]]:
    """The commands a run executes, in order (pure, so that the help and the tests can show them)."""
    cmds: list[list[str]] = []
    dataset = [
        "--dataset-prefix",
        args.dataset_prefix,
        "--dataset-objects",
        str(args.dataset_objects),
        "--dataset-object-size",
        args.dataset_object_size,
    ]
    if args.prep:
        cmds.append(
            [
                sys.executable,
                "-m",
                "loadtests.dataprep",
                "--host",
                args.host,
                "--bucket",
                args.bucket,
                "--prefix",
                args.dataset_prefix,
                "--objects",
                str(args.dataset_objects),
                "--size",
                args.dataset_object_size,
            ]
        )
    locust = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILES[args.shape]),
        "--headless",
        "--host",
        args.host,
        "--run-time",
        args.run_time,
        "--spawn-rate",
        str(args.spawn_rate),
        "--csv",
        str(out_dir / "locust"),
        "--html",
        str(out_dir / "report.html"),
        "--s3-bucket",
        args.bucket,
        *dataset,
    ]
    if args.users is not None:
        locust += ["--users", str(args.users)]
    if args.workers > 0:
        locust += ["--processes", str(args.workers)]
    cmds.append([*locust, *extra])
    return cmds


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.results / f"{args.label}-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=False)
    cmds = commands(args, out_dir, extra)
    (out_dir / "command.txt").write_text("".join(shlex.join(c) + "\n" for c in cmds))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    code = 0
    with open(out_dir / "locust.log", "wb") as log_fh:
        for cmd in cmds:
            print(f"$ {shlex.join(cmd)}", file=sys.stderr)
            log_fh.write(f"$ {shlex.join(cmd)}\n".encode())
            log_fh.flush()
            with subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ) as proc:
                assert proc.stdout is not None
                for line in proc.stdout:  # tee: the console and the log
                    sys.stderr.buffer.write(line)
                    log_fh.write(line)
                code = proc.wait()
            if code != 0 and cmd is not cmds[-1]:
                print(f"{cmd[2]} failed with exit code {code}", file=sys.stderr)
                return code
    print(f"results: {out_dir}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
