"""SigV4 for the gateway's own endpoints (the flush API), with botocore's signer: service ``s3``, the client's
region and credentials, an empty body whose SHA-256 is sent in ``x-amz-content-sha256``."""

from __future__ import annotations

from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from s3lanes_client.durability import EMPTY_SHA256


def signed_headers(method: str, url: str, frozen_credentials: Any, region: str) -> dict[str, str]:
    """The headers (``Authorization``, ``X-Amz-Date``, ...) that make ``method url`` a signed request."""
    if frozen_credentials is None:
        raise RuntimeError("no AWS credentials found to sign the request with")
    request = AWSRequest(method=method, url=url, data=b"", headers={"x-amz-content-sha256": EMPTY_SHA256})
    SigV4Auth(frozen_credentials, "s3", region).add_auth(request)
    return {str(k): str(v) for k, v in request.headers.items()}
