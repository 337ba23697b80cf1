"""Configuration: sources and precedence, and every mistake reported at once with its place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from s3lanes.config import SECTION_CLASSES, SETTINGS, Listen, load_config, parse_listen
from s3lanes.core.scheduler import SchedulerConfig
from s3lanes.errors import ConfigError
from s3lanes.runtime.wiring import scheduler_config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s3lanes.toml"
    p.write_text(text)
    return p


def test_defaults_need_no_file_and_mean_embedded_backend():
    cfg = load_config(env={})
    assert cfg.backend.embedded
    assert cfg.server.listen == Listen("127.0.0.1", 9000)
    assert cfg.credentials == ()


def test_file_env_and_flags_apply_in_that_order(tmp_path: Path):
    path = write(
        tmp_path,
        """
[server]
listen = "0.0.0.0:9100"
log_level = "DEBUG"
[backend]
endpoint = "http://store:8333"
addressing = "virtual"
[[credentials]]
access_key = "AK"
secret_key = "SK"
""",
    )
    cfg = load_config(
        path,
        env={"S3LANES_SERVER_LISTEN": "127.0.0.1:9200", "S3LANES_BACKEND_POOL_SIZE": "7"},
        overrides={"server": {"listen": "127.0.0.1:9300"}},
    )
    assert cfg.server.listen == Listen("127.0.0.1", 9300)
    assert cfg.server.log_level == "DEBUG"
    assert cfg.backend.endpoint == "http://store:8333"
    assert cfg.backend.addressing == "virtual"
    assert cfg.backend.pool_size == 7
    assert [c.access_key for c in cfg.credentials] == ["AK"]
    assert cfg.credentials[0].backend_secret_key == "SK"


def test_credentials_from_environment_with_backend_identity():
    cfg = load_config(
        env={
            "S3LANES_BACKEND_ENDPOINT": "https://s3.internal",
            "S3LANES_CREDENTIALS": "A:S,B:T:BB:BT",
        }
    )
    a, b = cfg.credentials
    assert (a.access_key, a.backend_access_key, a.backend_secret_key) == ("A", "A", "S")
    assert (b.access_key, b.secret_key, b.backend_access_key, b.backend_secret_key) == ("B", "T", "BB", "BT")


def test_every_problem_is_reported_at_once(tmp_path: Path):
    path = write(
        tmp_path,
        """
[server]
listen = "nonsense"
log_level = "LOUD"
unknown_thing = 1
[backend]
endpoint = "ftp://x"
pool_size = "many"
addressing = "sideways"
[bogus]
""",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    text = str(info.value)
    for needle in (
        "listen",
        "LOUD",
        "unknown_thing",
        "ftp://x",
        "pool_size",
        "sideways",
        "[bogus]",
        "credential",
    ):
        assert needle in text, needle
    assert len(info.value.problems) >= 8


def test_https_listener_needs_cert_and_key():
    with pytest.raises(ConfigError, match="tls_cert"):
        load_config(env={"S3LANES_SERVER_HTTPS_LISTEN": "127.0.0.1:9443"})


def test_admin_listener_is_parsed_and_must_not_share_an_s3_port():
    cfg = load_config(env={"S3LANES_SERVER_ADMIN_LISTEN": "127.0.0.1:9001"})
    assert str(cfg.server.admin_listen) == "127.0.0.1:9001"
    assert load_config(env={}).server.admin_listen is None
    with pytest.raises(ConfigError, match=r"admin_listen.*another port than listen"):
        load_config(env={"S3LANES_SERVER_ADMIN_LISTEN": "0.0.0.0:9000"})


def test_duplicate_access_keys_are_refused():
    with pytest.raises(ConfigError, match="twice"):
        load_config(env={"S3LANES_BACKEND_ENDPOINT": "http://s:1", "S3LANES_CREDENTIALS": "A:S,A:T"})


def test_secrets_do_not_appear_in_repr():
    cfg = load_config(env={"S3LANES_BACKEND_ENDPOINT": "http://s:1", "S3LANES_CREDENTIALS": "AK:topsecret"})
    assert "topsecret" not in repr(cfg)


def test_bad_toml_is_reported_with_the_file_name(tmp_path: Path):
    path = write(tmp_path, "[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:80", Listen("127.0.0.1", 80)),
        (":9000", Listen("127.0.0.1", 9000)),
        ("[::1]:5", Listen("::1", 5)),
    ],
)
def test_parse_listen(text: str, expected: Listen):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9000", "host:port", "h:70000", "[::1]"])
def test_parse_listen_rejects(text: str):
    with pytest.raises(ValueError):
        parse_listen(text)


def test_operations_settings_are_validated_and_the_admin_token_stays_secret():
    cfg = load_config(
        env={
            "S3LANES_SERVER_ADMIN_TOKEN": "a-long-enough-admin-token",
            "S3LANES_SERVER_LOG_FORMAT": "json",
            "S3LANES_SERVER_DRAIN_ON_SHUTDOWN_S": "5",
        }
    )
    assert cfg.server.admin_token == "a-long-enough-admin-token"
    assert (cfg.server.log_format, cfg.server.drain_on_shutdown_s) == ("json", 5.0)
    assert "a-long-enough-admin-token" not in repr(cfg)
    with pytest.raises(ConfigError) as info:
        load_config(env={"S3LANES_SERVER_ADMIN_TOKEN": "short", "S3LANES_SERVER_LOG_FORMAT": "xml"})
    text = str(info.value)
    assert "admin_token" in text and "log_format" in text
    assert "short" not in text.replace("[server].admin_token", "")


def test_progress_interval_and_the_spool_deadline_are_read_and_checked(tmp_path: Path):
    cfg = load_config(env={})
    assert cfg.scheduler.progress_interval_s == 2.0
    assert cfg.spool.max_age_s is None  # unset: the observed checkpoint interval is the deadline
    assert cfg.spool.overdue_after_s == 3600.0
    path = write(tmp_path, "[scheduler]\nprogress_interval_s = 5\n[spool]\nmax_age_s = 64\n")
    cfg = load_config(path, env={})
    assert cfg.scheduler.progress_interval_s == 5.0
    assert cfg.spool.max_age_s == 64.0
    assert cfg.spool.overdue_after_s == 64.0
    path = write(tmp_path, "[scheduler]\nprogress_interval_s = -1\n[spool]\nmax_age_s = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "progress_interval_s" in str(info.value)
    assert "max_age_s" in str(info.value)


def test_every_scheduler_setting_reaches_the_scheduler_and_their_defaults_agree(tmp_path: Path):
    text = """[scheduler]
write_cap_mode = "work_conserving"
latency_target_ms = 20
request_cost_bytes = "32KiB"
burst_bytes = "8MiB"
window_ms = 200
inflight_bytes_max = "64MiB"
inflight_requests_max = 48
progress_interval_s = 3
cap_headroom = 0.05
"""
    built = scheduler_config(load_config(write(tmp_path, text), env={}), 40e6)
    assert (built.write_cap_mode, built.latency_target_s, built.window_s) == ("work_conserving", 0.02, 0.2)
    assert (built.request_cost_bytes, built.burst_bytes) == (32 * 1024, 8 * 1024 * 1024)
    assert (built.inflight_bytes_max, built.inflight_requests_max) == (64 * 1024 * 1024, 48)
    assert (built.progress_interval_s, built.cap_headroom, built.capacity_bps) == (3.0, 0.05, 40e6)
    assert (
        scheduler_config(
            load_config(write(tmp_path, "[scheduler]\nprogress_interval_s = 0\n"), env={}), None
        ).progress_interval_s
        is None
    )  # 0: off
    # Unconfigured, the gateway runs the scheduler's own defaults.
    defaults = scheduler_config(load_config(env={}), 40e6)
    plain = SchedulerConfig(lanes=defaults.lanes, capacity_bps=40e6)
    assert defaults == plain


def test_cap_headroom_is_read_checked_and_reaches_the_scheduler(tmp_path: Path):
    cfg = load_config(env={})
    assert cfg.scheduler.cap_headroom == 0.1
    assert scheduler_config(cfg, 40e6).cap_headroom == 0.1
    cfg = load_config(write(tmp_path, "[scheduler]\ncap_headroom = 0\n"), env={})
    assert scheduler_config(cfg, 40e6).cap_headroom == 0.0
    for bad in ("1", "-0.05", "1.5"):
        with pytest.raises(ConfigError, match=r"\[scheduler\]\.cap_headroom"):
            load_config(write(tmp_path, f"[scheduler]\ncap_headroom = {bad}\n"), env={})


def test_backend_credential_source_is_read_per_backend_and_checked(tmp_path: Path):
    path = write(
        tmp_path,
        """
[backend]
endpoint = "http://store:8333"
credential_source = "aws"
aws_profile = "training"
[backends.archive]
endpoint = "http://archive:9000"
credential_source = "aws"
[[credentials]]
access_key = "AK"
secret_key = "SK"
""",
    )
    cfg = load_config(path, env={})
    assert (cfg.backend.credential_source, cfg.backend.aws_profile) == ("aws", "training")
    assert cfg.backends["archive"].credential_source == "aws"
    assert load_config(
        env={"S3LANES_BACKEND_CREDENTIAL_SOURCE": "aws", **_EXTERNAL}
    ).backend.credential_source == ("aws")
    with pytest.raises(ConfigError) as caught:
        load_config(env={"S3LANES_BACKEND_CREDENTIAL_SOURCE": "aws"})  # the embedded store
    assert "[backend].credential_source: 'aws' needs an external endpoint" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(
            env={"S3LANES_BACKEND_CREDENTIAL_SOURCE": "iam", "S3LANES_BACKEND_AWS_PROFILE": "x", **_EXTERNAL}
        )
    text = str(caught.value)
    assert "expected 'clients' or 'aws', got 'iam'" in text
    assert "[backend].aws_profile: is read only with credential_source = 'aws'" in text


_EXTERNAL = {"S3LANES_BACKEND_ENDPOINT": "http://store:8333", "S3LANES_CREDENTIALS": "AK:SK"}


def test_a_credentials_file_adds_client_keys_and_its_mistakes_are_config_errors(tmp_path: Path):
    keys = tmp_path / "keys"
    keys.write_text("# rotated by the platform\nAK1:SK1\n\nAK2:SK2:BAK:BSK, AK3:SK3\n")
    cfg = load_config(env={"S3LANES_SERVER_CREDENTIALS_FILE": str(keys), "S3LANES_CREDENTIALS": "AK0:SK0"})
    assert [c.access_key for c in cfg.credentials] == ["AK0", "AK1", "AK2", "AK3"]
    assert cfg.credentials[2].backend_access_key == "BAK"
    assert cfg.file_access_keys == {"AK1", "AK2", "AK3"}
    for content, message in (
        ("AK1\n", "item 0: expected access_key:secret_key"),
        ("# nothing\n", "holds no key pair"),
        ("AK0:other\n", "access key 'AK0' appears twice"),
    ):
        keys.write_text(content)
        with pytest.raises(ConfigError) as caught:
            load_config(env={"S3LANES_SERVER_CREDENTIALS_FILE": str(keys), "S3LANES_CREDENTIALS": "AK0:SK0"})
        assert message in str(caught.value)
    for path, message in ((tmp_path, "is a directory, not a file"), (tmp_path / "nope", "no such file")):
        with pytest.raises(ConfigError) as caught:
            load_config(env={"S3LANES_SERVER_CREDENTIALS_FILE": str(path)})
        assert f"[server].credentials_file: {message}" in str(caught.value).replace(f"{path} ", "")


def test_the_spools_default_content_type_is_sniff_or_a_media_type(tmp_path: Path):
    assert load_config(env={}).spool.default_content_type == "sniff"
    path = write(tmp_path, '[spool]\ndefault_content_type = "binary/octet-stream"\n')
    assert load_config(path, env={}).spool.default_content_type == "binary/octet-stream"
    path = write(tmp_path, '[spool]\ndefault_content_type = "octet"\n')
    with pytest.raises(ConfigError, match="default_content_type"):
        load_config(path, env={})


def test_workers_default_to_one_and_share_the_spool() -> None:
    assert load_config(env={}).server.workers == 1
    cfg = load_config(env={"S3LANES_SERVER_WORKERS": "4", "S3LANES_SPOOL_ENABLED": "false"})
    assert cfg.server.workers == 4
    cfg = load_config(env={"S3LANES_SERVER_WORKERS": "2"})  # the spool is on by default: worker 0 owns it
    assert cfg.server.workers == 2 and cfg.spool.enabled
    with pytest.raises(ConfigError) as info:
        load_config(env={"S3LANES_SERVER_WORKERS": "0", "S3LANES_SPOOL_ENABLED": "false"})
    assert "[server].workers: must be within [1, 1024], got 0" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(
            env={
                "S3LANES_SERVER_WORKERS": "2",
                "S3LANES_SPOOL_ENABLED": "false",
                "S3LANES_SERVER_ADMIN_LISTEN": "127.0.0.1:9001",
            }
        )
    assert "[server].workers" in str(info.value) and "admin_listen" in str(info.value)


def test_the_declaration_sets_every_field_of_each_section_once() -> None:
    for section, cls in SECTION_CLASSES.items():
        declared = [s.field_name for s in SETTINGS if s.section == section]
        assert sorted(declared) == sorted(f.name for f in dataclasses.fields(cls)), section
    assert {s.section for s in SETTINGS} == set(SECTION_CLASSES)
    assert len({s.env_name for s in SETTINGS}) == len(SETTINGS)


def test_only_fields_that_can_be_none_are_declared_nullable() -> None:
    for s in SETTINGS:
        if s.nullable:
            (f,) = [f for f in dataclasses.fields(SECTION_CLASSES[s.section]) if f.name == s.field_name]
            assert "None" in str(f.type), s


def test_an_empty_value_resets_a_nullable_setting_and_leaves_another_at_its_default() -> None:
    cfg = load_config(
        env={
            "S3LANES_SERVER_LISTEN": "",
            "S3LANES_SERVER_HTTPS_LISTEN": "127.0.0.1:9443",
            "S3LANES_SCHEDULER_INFLIGHT_BYTES_MAX": "",
            "S3LANES_SERVER_ZERO_COPY_MIN_BYTES": "",
            "S3LANES_SERVER_STATE_DIR": "",
        },
        overrides={"server": {"tls_cert": __file__, "tls_key": __file__}},
    )
    assert cfg.server.listen is None  # nullable: "" turns the HTTP listener off
    assert cfg.scheduler.inflight_bytes_max is None
    assert cfg.server.zero_copy_min_bytes == 8 * 1024 * 1024  # not nullable: "" keeps the default
    assert cfg.server.state_dir == Path(".s3lanes")


def test_renamed_settings_are_scaled_into_their_fields() -> None:
    cfg = load_config(
        env={
            "S3LANES_SCHEDULER_WINDOW_MS": "250",
            "S3LANES_SCHEDULER_LATENCY_TARGET_MS": "8",
            "S3LANES_SPOOL_CAPACITY": "2KiB",
            "S3LANES_BACKEND_BANDWIDTH": "1MB/s",
            "S3LANES_BACKEND_LANE_SOURCE_ADDRESS": "checkpoint=10.0.0.5",
        }
    )
    assert cfg.scheduler.window_s == pytest.approx(0.25)
    assert cfg.scheduler.latency_target_s == pytest.approx(0.008)
    assert cfg.spool.capacity_bytes == 2048 and isinstance(cfg.spool.capacity_bytes, int)
    assert cfg.backend.bandwidth_bps == 1e6
    assert cfg.backend.lane_source_addresses == {"checkpoint": "10.0.0.5"}


def test_raw_reads_is_on_by_default_and_a_backend_setting(tmp_path: Path):
    assert load_config(env={}).backend.raw_reads is True
    path = write(tmp_path, "[backend]\nraw_reads = false\n")
    assert load_config(path, env={}).backend.raw_reads is False
    assert load_config(env={"S3LANES_BACKEND_RAW_READS": "false"}).backend.raw_reads is False
