"""The [cluster] section: defaults (alone), TOML and environment, validation, and no password in reprs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from s3lanes.config import load_config
from s3lanes.errors import ConfigError


def test_without_redis_url_the_gateway_runs_alone_with_sane_defaults() -> None:
    cl = load_config(env={}).cluster
    assert not cl.enabled and cl.redis_url is None
    assert cl.name == "default" and cl.node_id == socket.gethostname()
    assert (cl.interval_s, cl.ttl_intervals, cl.ttl_s) == (0.5, 3, 1.5)
    assert cl.lanes == ("checkpoint",)


def test_cluster_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "s3lanes.toml"
    path.write_text(
        '[cluster]\nredis_url = "redis://10.0.0.5:6379/2"\nname = "train-a"\nnode_id = "gpu-7"\n'
        'interval_s = 1.0\nttl_intervals = 4\nlanes = ["checkpoint", "restore"]\n'
    )
    cl = load_config(path, env={"S3LANES_CLUSTER_NODE_ID": "gpu-8"}).cluster
    assert cl.enabled and cl.redis_url == "redis://10.0.0.5:6379/2"
    assert (cl.name, cl.node_id, cl.ttl_s, cl.lanes) == ("train-a", "gpu-8", 4.0, ("checkpoint", "restore"))
    # An empty environment value switches cluster mode off.
    assert not load_config(path, env={"S3LANES_CLUSTER_REDIS_URL": ""}).cluster.enabled


def test_cluster_mistakes_are_all_reported_with_their_place() -> None:
    env = {
        "S3LANES_CLUSTER_REDIS_URL": "http://:secret@redis:6379",
        "S3LANES_CLUSTER_NAME": "a b",
        "S3LANES_CLUSTER_NODE_ID": "gpu 1",
        "S3LANES_CLUSTER_INTERVAL_S": "0.01",
        "S3LANES_CLUSTER_TTL_INTERVALS": "1",
        "S3LANES_CLUSTER_LANES": "dataset,nope,nope",
    }
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    text = str(info.value)
    for where in ("redis_url", "name", "node_id", "interval_s", "ttl_intervals", "redis_timeout_s"):
        assert f"[cluster].{where}" in text, where
    assert "read-protected" in text and "unknown lane 'nope'" in text and "named twice" in text
    assert "secret" not in text


def test_the_redis_password_never_shows_in_a_repr() -> None:
    cl = load_config(env={"S3LANES_CLUSTER_REDIS_URL": "redis://user:s3cret@redis:6379/0"}).cluster
    assert "s3cret" not in repr(cl) and "user:***@redis" in repr(cl)
