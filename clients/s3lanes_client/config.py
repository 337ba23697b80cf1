"""Client settings: one frozen, picklable value shared by the sync and async clients, the datasets and the
checkpoint helpers (datasets carry a ``ClientConfig`` into DataLoader workers, never a live client)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from s3lanes_client.hints import check_lane
from s3lanes_client.retry import RetryPolicy

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Where and how to reach s3lanes (or any S3 endpoint).

    Credentials left as None come from botocore's usual chain (environment, shared files, instance role).
    ``lane`` is the hint sent with every request that names none itself (None: no hint, the gateway
    classifies). Not a secret store: the keys given here travel with a pickled dataset to its workers.
    """

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    lane: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_pool_connections: int = 32
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    addressing_style: Literal["path", "virtual", "auto"] = "path"
    # TLS verification: True, False, or the path of a CA bundle.
    verify: bool | str = True
    # botocore sends "Expect: 100-continue" on uploads so a gateway can refuse a bad signature before the
    # body. Some stores (SeaweedFS) mishandle it on empty bodies; switch it off for those.
    expect_100_continue: bool = True

    def __post_init__(self) -> None:
        check_lane(self.lane)
        if self.max_pool_connections < 1:
            raise ValueError("max_pool_connections must be at least 1")
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")

    def with_lane(self, lane: str | None) -> ClientConfig:
        return replace(self, lane=lane)

    def replace(self, **changes: Any) -> ClientConfig:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ClientConfig:
        """Settings from the environment: ``S3LANES_ENDPOINT_URL`` (else ``AWS_ENDPOINT_URL_S3``, else
        ``AWS_ENDPOINT_URL``), ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``S3LANES_LANE``. Credentials are left
        to botocore's chain. Keyword arguments win over the environment."""
        e = os.environ if env is None else env
        kwargs: dict[str, Any] = {}
        endpoint = e.get("S3LANES_ENDPOINT_URL") or e.get("AWS_ENDPOINT_URL_S3") or e.get("AWS_ENDPOINT_URL")
        if endpoint:
            kwargs["endpoint_url"] = endpoint
        region = e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        if e.get("S3LANES_LANE"):
            kwargs["lane"] = e["S3LANES_LANE"]
        kwargs.update(overrides)
        return cls(**kwargs)

    def botocore_config(self) -> Any:
        """The botocore ``Config``: SigV4, one attempt (our loop retries, botocore's must not stack on it)."""
        from botocore.config import Config

        return Config(
            region_name=self.region,
            signature_version="s3v4",
            s3={"addressing_style": self.addressing_style},
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=self.max_pool_connections,
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            tcp_keepalive=True,
        )

    def session_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``boto3.Session`` / ``aioboto3.Session``."""
        kwargs: dict[str, Any] = {"region_name": self.region}
        if self.access_key is not None:
            kwargs.update(
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                aws_session_token=self.session_token,
            )
        return kwargs


def config_for(config: ClientConfig | None, region: str | None, endpoint: str | None) -> ClientConfig:
    """``region``/``endpoint`` as s3torchconnector takes them, over ``config`` (else the environment)."""
    base = config if config is not None else ClientConfig.from_env()
    changes: dict[str, Any] = {}
    if region is not None:
        changes["region"] = region
    if endpoint is not None:
        changes["endpoint_url"] = endpoint
    return base.replace(**changes) if changes else base
