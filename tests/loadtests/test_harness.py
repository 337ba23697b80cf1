"""The load-test harness's own pieces: the configs it writes load as the gateway reads them, and a failed
start says why."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtests.harness.cli import from_namespace, parse_sized
from loadtests.harness.errors import BenchError
from loadtests.harness.gateway import (
    GATEWAY_SOURCE,
    SpoolGatewaySpec,
    gateway_package,
    is_gateway_tree,
    server_toml,
    spawn,
    spool_gateway_toml,
    start_gateway,
    stop_gateway,
    stop_process,
    tail,
    tree_source,
    wait_ready,
)
from loadtests.harness.machine import machine_facts
from loadtests.harness.stats import Round, merge_intervals, timed_json
from loadtests.harness.store import ACCESS_KEY, SECRET_KEY
from s3lanes import __version__
from s3lanes.config import load_config


def test_the_spooling_gateway_config_loads_as_the_gateway_reads_it(tmp_path: Path) -> None:
    spec = SpoolGatewaySpec("http://127.0.0.1:8333", tmp_path / "spool", 50e6, spool_extra="max_age_s = 60\n")
    text = spool_gateway_toml(tmp_path, spec)
    (tmp_path / "s3lanes.toml").write_text(text)
    cfg = load_config(tmp_path / "s3lanes.toml", env={})
    assert cfg.server.state_dir == tmp_path / "state"
    assert cfg.spool.enabled and cfg.spool.dir == tmp_path / "spool"
    assert cfg.spool.max_age_s == 60
    assert [(c.access_key, c.secret_key) for c in cfg.credentials] == [(ACCESS_KEY, SECRET_KEY)]


def test_the_machine_facts_name_the_gateway_source_directory_the_benchmarks_run() -> None:
    assert machine_facts()["s3lanes"].startswith(f"{__version__} from {GATEWAY_SOURCE} (")


def test_the_server_section_names_its_settings(tmp_path: Path) -> None:
    text = server_toml(tmp_path, log_level="INFO", shutdown_grace_s=10, listen="127.0.0.1:9999")
    text += '\n[backend]\nendpoint = "http://127.0.0.1:8333"\n'
    text += '\n[[credentials]]\naccess_key = "AK"\nsecret_key = "SK"\n'
    (tmp_path / "s3lanes.toml").write_text(text)
    cfg = load_config(tmp_path / "s3lanes.toml", env={})
    assert (cfg.server.log_level, cfg.server.shutdown_grace_s) == ("INFO", 10)
    assert cfg.server.drain_on_shutdown_s == 0


def test_a_process_that_exits_before_it_is_ready_raises_the_callers_error_with_the_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "child.log"
    argv = [sys.executable, "-c", "import sys; print('no such setting: frobnicate'); sys.exit(3)"]
    popen = spawn(argv, log, cwd=tmp_path)
    try:
        with pytest.raises(BenchError, match=r"(?s)the child did not start:.*no such setting: frobnicate"):
            wait_ready(popen, tmp_path / "ready.json", log, 30.0, "the child")
    finally:
        assert stop_process(popen, 10.0) == 3
    assert tail(tmp_path / "missing.log") == "(no log)"


def test_a_ready_file_is_returned_as_its_document(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    # Written whole and renamed into place, as the gateway writes its ready file.
    code = (
        f"import json, os, time; open({str(ready)!r} + '.tmp', 'w').write(json.dumps({{'pid': 7}})); "
        f"os.replace({str(ready)!r} + '.tmp', {str(ready)!r}); time.sleep(60)"
    )
    popen = spawn([sys.executable, "-c", code], tmp_path / "child.log", cwd=tmp_path)
    try:
        assert wait_ready(popen, ready, tmp_path / "child.log", 30.0, "the child") == {"pid": 7}
    finally:
        assert stop_process(popen, 10.0) == -15


def test_intervals_merge_where_they_overlap_or_touch_and_come_out_sorted() -> None:
    got = merge_intervals([(5.0, 6.0), (1.0, 3.0), (2.0, 4.0), (4.0, 4.5), (7.0, 8.0), (7.5, 7.6)])
    assert got == [(1.0, 4.5), (5.0, 6.0), (7.0, 8.0)]
    assert merge_intervals([]) == []


def _sized_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--large-mib", default=(256, 32), help="object size")
    p.add_argument("--streams", default=8, help="streams")
    p.add_argument("--label", default="raw")
    return p


def test_a_quick_run_takes_the_quick_defaults_and_an_option_given_wins_either_way() -> None:
    full = {"quick": False, "large_mib": 256, "streams": 8, "label": "raw"}
    assert vars(parse_sized(_sized_parser(), [])) == full
    assert vars(parse_sized(_sized_parser(), ["--quick"])) == full | {"quick": True, "large_mib": 32}
    assert vars(parse_sized(_sized_parser(), ["--quick", "--large-mib", "7"]))["large_mib"] == 7
    assert vars(parse_sized(_sized_parser(), ["--large-mib", "7", "--streams", "3"]))["streams"] == 3


def test_sizes_counts_and_rounds_must_be_positive_and_their_help_names_both_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_sized(_sized_parser(), ["--streams", "0"])
    assert "argument --streams: must be positive, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_sized(_sized_parser(), ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "object size (default 256; quick 32)" in text
    assert "streams (default 8)" in text


def test_options_come_from_the_parsed_namespace_unless_given() -> None:
    @dataclass(frozen=True)
    class Opts:
        rounds: int
        label: str
        quick: bool = False

    a = argparse.Namespace(rounds=3, label="raw", other=1)
    assert from_namespace(Opts, a) == Opts(rounds=3, label="raw")
    assert from_namespace(Opts, a, label="x", quick=True) == Opts(rounds=3, label="x", quick=True)


# A stand-in gateway: writes its ready file naming the package it was run as and its directory, then waits.
FAKE_MAIN = """import json, os, sys, time
ready = sys.argv[sys.argv.index("--ready-file") + 1]
doc = {"pid": os.getpid(), "endpoints": ["http://127.0.0.1:1"]}
doc.update(package=__spec__.parent, cwd=os.getcwd())
open(ready + ".tmp", "w").write(json.dumps(doc))
os.replace(ready + ".tmp", ready)
time.sleep(60)
"""


def _fake_tree(root: Path, package_dir: Path) -> Path:
    package_dir.mkdir(parents=True)
    (package_dir / "__init__.py").write_text("")
    (package_dir / "__main__.py").write_text(FAKE_MAIN)
    return root


@pytest.mark.parametrize(
    ("layout", "package", "source"),
    [("gateway/s3lanes", "s3lanes", "gateway"), ("gateway", "gateway", ".")],
    ids=["current layout", "layout before the package rename"],
)
def test_a_compared_tree_runs_its_own_gateway_package_from_its_source_folder(
    tmp_path: Path, layout: str, package: str, source: str
) -> None:
    tree = _fake_tree(tmp_path / "tree", tmp_path / "tree" / layout)
    assert is_gateway_tree(tree)
    assert tree_source(tree) == tree / source
    assert gateway_package(tree_source(tree)) == package
    proc = start_gateway(tmp_path / "run", "", source=tree_source(tree), timeout_s=30.0)
    try:
        assert proc.ready["package"] == package
        assert Path(proc.ready["cwd"]).resolve() == (tree / source).resolve()
    finally:
        stop_gateway(proc, 10.0)


def test_this_checkout_and_a_folder_without_a_gateway(tmp_path: Path) -> None:
    assert gateway_package(GATEWAY_SOURCE) == "s3lanes"
    assert is_gateway_tree(GATEWAY_SOURCE.parent)
    assert not is_gateway_tree(tmp_path)


def test_every_timed_round_reports_its_figures_under_the_same_keys_in_the_same_order() -> None:
    r = Round("large", "gateway", 2, 50_000_000, 0.5, {"gateway": 0.25, "other": 0.1}, [1.0, 3.0], requests=4)
    out = r.as_json()
    assert list(out)[:9] == [
        "phase",
        "side",
        "round",
        "bytes",
        "seconds",
        "MBps",
        "cpu_s",
        "other_cores",
        "requests",
    ]
    assert (out["side"], out["round"], out["MBps"], out["other_cores"]) == ("gateway", 2, 100.0, 0.2)
    assert out["p50_ms"] == 2.0 and out["max_ms"] == 3.0
    spool = timed_json("drain", ("variant", "spool"), 0, 10, 0.0, {})
    assert spool["variant"] == "spool" and spool["seconds"] == 0.0
    assert spool["MBps"] != spool["MBps"] and spool["other_cores"] != spool["other_cores"]  # NaN: no time
